#!/usr/bin/env bash
# ptxas-report.sh — registers, spills and shared memory of every CUDA kernel, for sm_80 and sm_90.
#
# Compiles the device code of every .cu under src/backends/cuda (no host code, no link) with the
# flags of the CMake build (its compile_commands.json; a CUDA build dir is configured when there is
# none) and `-Xptxas -v`, and prints one table: kernel, arch, registers, spill stores and loads
# (bytes), static shared memory (bytes). Exits 1 when any kernel or device function spills (a hot
# kernel that spills goes through local memory), 2 on a usage error or a failed compile.
#
# Usage: scripts/ptxas-report.sh [BUILD_DIR]   (default $ZINF_CUDA_BUILD, else ./build-cuda)
#   ZINF_PTXAS_ARCHS="80 90"   the architectures (default both)
#   ZINF_PTXAS_FILES="..."     only these .cu files (paths under the repository)
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bld="${1:-${ZINF_CUDA_BUILD:-$root/build-cuda}}"
archs="${ZINF_PTXAS_ARCHS:-80 90}"
db="$bld/compile_commands.json"
if [ ! -f "$db" ]; then
  echo "ptxas-report: configuring a CUDA build in $bld for its compile commands" >&2
  cmake -S "$root" -B "$bld" -DZINF_CUDA=ON -DZINF_BUILD_BENCH=OFF -DZINF_CUDA_ARCHS=90 \
    -DCMAKE_EXPORT_COMPILE_COMMANDS=ON > /dev/null || { echo "ptxas-report: cmake failed" >&2; exit 2; }
fi
[ -f "$db" ] || { echo "ptxas-report: $db: no compile_commands.json (CMAKE_EXPORT_COMPILE_COMMANDS=ON)" >&2; exit 2; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

python3 - "$root" "$db" "$work" "$archs" "${ZINF_PTXAS_FILES:-}" <<'PY'
import json, os, re, shlex, subprocess, sys

root, db, work, archs, only = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split(), sys.argv[5].split()
entries = {}
for e in json.load(open(db)):
    f = os.path.realpath(os.path.join(e.get("directory", "."), e["file"]))
    entries[f] = (e.get("arguments") or shlex.split(e["command"]), e.get("directory", "."))
cuda_dir = os.path.join(root, "src", "backends", "cuda")
files = sorted(os.path.join(d, n) for d, _, ns in os.walk(cuda_dir) for n in ns if n.endswith(".cu"))
if only:
    files = [f for f in files if os.path.relpath(f, root) in only]
if not files:
    sys.exit("ptxas-report: no .cu files to compile")


def device_only(args, src, arch, out):
    """The build's nvcc command for `src`, compiling only its device code for sm_`arch`."""
    cmd, skip = [], 0
    for i, a in enumerate(args):
        if skip:
            skip -= 1
            continue
        if i == 0 and os.path.basename(a) in ("ccache", "sccache"):
            continue
        if a in ("-o", "-MF", "-MT", "-MQ", "-x") or a in ("-gencode", "--generate-code", "-arch"):
            skip = 1
            continue
        if a in ("-c", "-MD", "-MMD") or a.startswith(("--generate-code=", "-gencode=", "-arch=", "--gpu-architecture")):
            continue
        if os.path.realpath(os.path.join(directory, a)) == src:
            continue
        cmd.append(a)
    return cmd + ["-cubin", f"-gencode=arch=compute_{arch},code=sm_{arch}", "-Xptxas", "-v", "-x", "cu", src, "-o", out]


rows, failed = [], []
for src in files:
    rel = os.path.relpath(src, root)
    if src not in entries:
        failed.append(f"{rel}: not in {db} (not built by this configuration?)")
        continue
    args, directory = entries[src]
    for arch in archs:
        out = os.path.join(work, os.path.basename(src) + f".sm_{arch}.cubin")
        p = subprocess.run(device_only(args, src, arch, out), cwd=directory, capture_output=True, text=True)
        if p.returncode != 0:
            failed.append(f"{rel} sm_{arch}: nvcc failed\n{p.stderr[-2000:]}")
            continue
        cur = None  # the function whose properties the next lines describe
        by_name = {}
        for line in p.stderr.splitlines():
            m = re.search(r"Function properties for (\S+)", line)
            if m:
                cur = by_name.setdefault(m.group(1), {"file": rel, "arch": arch, "name": m.group(1), "regs": "-",
                                                      "stores": 0, "loads": 0, "smem": 0, "entry": False})
                continue
            m = re.search(r"Compiling entry function '(\S+)'", line)
            if m:
                cur = by_name.setdefault(m.group(1), {"file": rel, "arch": arch, "name": m.group(1), "regs": "-",
                                                      "stores": 0, "loads": 0, "smem": 0, "entry": False})
                cur["entry"] = True
                continue
            if cur is None:
                continue
            m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
            if m:
                cur["stores"], cur["loads"] = int(m.group(1)), int(m.group(2))
            m = re.search(r"Used (\d+) registers", line)
            if m:
                cur["regs"] = int(m.group(1))
                s = re.search(r"(\d+) bytes smem", line)
                cur["smem"] = int(s.group(1)) if s else 0
        rows.extend(by_name.values())

names = [r["name"] for r in rows]
demangled = names
if names:
    try:
        demangled = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True,
                                   check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        pass
def without_parameters(d):
    """The kernel's name and template arguments: its trailing parameter list dropped."""
    if not d.endswith(")"):
        return d
    depth = 0
    for i in range(len(d) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(d[i], 0)
        if depth == 0:
            return d[:i]
    return d


for r, d in zip(rows, demangled):
    d = without_parameters(d).replace("(anonymous namespace)::", "").removeprefix("void ")
    r["kernel"] = (d if len(d) <= 110 else d[:107] + "...") + ("" if r["entry"] else " [device fn]")
rows.sort(key=lambda r: (r["file"], r["kernel"], r["arch"]))
w = max([len("kernel")] + [len(r["kernel"]) for r in rows])
print(f"{'kernel':<{w}}  {'arch':<5} {'regs':>4} {'spill st':>8} {'spill ld':>8} {'smem':>7}  file")
spills = 0
for r in rows:
    flag = ""
    if r["stores"] or r["loads"]:
        spills += 1
        flag = "  SPILLS"
    print(f"{r['kernel']:<{w}}  sm_{r['arch']:<2} {r['regs']:>4} {r['stores']:>8} {r['loads']:>8} {r['smem']:>7}  "
          f"{r['file']}{flag}")
print(f"\n{len(rows)} kernels/functions x arch from {len(files)} files; {spills} spill")
for f in failed:
    print("ptxas-report: " + f, file=sys.stderr)
sys.exit(2 if failed else 1 if spills else 0)
PY
