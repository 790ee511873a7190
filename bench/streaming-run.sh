#!/usr/bin/env bash
# streaming-run.sh — one `zinf train` run with its NVMe stores in a folder of your choice, measured
# against `zinf plan`: the step times and what paced them, the NVMe bytes moved per step, the peak
# resident set beside the plan's prediction, and the disk space the run took. Prints a markdown table.
#
# Usage: bench/streaming-run.sh --nvme DIR [--config FILE] [--zinf BIN] [--out DIR]
#                               [--set key=value ...]
#        bench/streaming-run.sh --report OUT
#   --nvme DIR     the folder for the swap files (both nvme_path keys are set to it; created by
#                  zinf train when missing; the run's own swap folder inside it is removed at exit).
#                  Default: $ZINF_NVME_DIR.
#   --config FILE  default: configs/6.7b-stream-nvme.json (the 6.7b preset, everything on NVMe,
#                  8-bit states, seq 128, micro batch 1, GA 1, bf16, gradient streaming without
#                  speculation, 2 steps).
#   --zinf BIN     default: $ZINF, else build/src/zinf of this checkout.
#   --out DIR      where plan.json, train.json, train.log, metrics.jsonl, time.txt and df.txt go
#                  (default: a new folder under ${TMPDIR:-/tmp}); kept after the run.
#   --report OUT   print the tables of an earlier run again, from its output folder; runs nothing.
#   --set k=v      passed to both `zinf plan` and `zinf train`, e.g. --set train_batch_size=4 --set
#                  zero_optimization.offload_optimizer.layer_major=true (GA 4 at micro batch 1,
#                  streamed), --set model.n_layer=4, --set zero_optimization.offload_optimizer.speculative=true.
#
# Before anything runs, the free space under --nvme (df, at the folder or its nearest existing parent)
# is compared with the plan's NVMe bytes (`zinf plan --json`, totals.nvme): too little is refused with
# one line and exit code 1 (zinf train refuses it too, with the same numbers; this says so before the
# plan's and train's start-up costs). Needs python3 (JSON) and, for an external RSS measurement,
# /usr/bin/time (otherwise zinf train's own getrusage peak is reported).
#
# Columns (per step, from train.metrics_file): step time; the busiest resource and its busy time
# (the engine's busy time per resource within the step's window: compute, h2d, d2h, host, one per
# disk); step ÷ busiest (1.0: the step took exactly as long as its busiest resource was busy); the
# disks' busy time; NVMe bytes read and written in the step's window (the Update of one step runs
# into the next step's window). Once per run: the peak RSS against the plan's prediction, with and
# without the device's share (on the CPU device the device's memory is host memory: the plan's
# host_memory.device_in_host_memory), the disk space the run took against the plan's NVMe bytes —
# the largest rise of df's "used" over the lowest seen before it, and the largest size of the NVMe
# folder (du), both polled every 2 s — and the final params_digest.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
config="$root/configs/6.7b-stream-nvme.json"
zinf="${ZINF:-$root/build/src/zinf}"
nvme="${ZINF_NVME_DIR:-}"
out=""
report=""
sets=()
die() { echo "streaming-run.sh: $*" >&2; exit 2; }
# The tables of a finished run, from the files in its output folder.
print_report() {
python3 - "$1" <<'EOF'
import json, os, re, sys
out = sys.argv[1]
args = open(os.path.join(out, "run.txt")).read().split("\n")
config, nvme, wall = args[0], args[1], int(args[2])
sets = [a for a in args[3:] if a and "nvme_path" not in a and "metrics_file" not in a]
plan = json.load(open(os.path.join(out, "plan.json")))
run = json.load(open(os.path.join(out, "train.json")))
steps = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if '"step_s"' in l]
G, GiB = 1e9, 2.0**30
hm = plan["host_memory"]
predicted, device_share = hm["predicted_peak_rss"], hm["device_in_host_memory"]
rss, rss_from = run["peak_rss_bytes"], "zinf train (getrusage)"
time_txt = os.path.join(out, "time.txt")
if os.path.exists(time_txt):
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", open(time_txt).read())
    if m: rss, rss_from = int(m.group(1)) * 1024, "/usr/bin/time -v"
# The largest rise of the disk's used bytes over the lowest seen before it (other processes may free
# space meanwhile), and the largest size of the NVMe folder itself (du: the run's swap files).
used = [int(x) for x in open(os.path.join(out, "df.txt")).read().split()]
disk_taken, low = 0, None
for u in used:
    low = u if low is None else min(low, u)
    disk_taken = max(disk_taken, u - low)
du = os.path.join(out, "du.txt")
sizes = [int(x) for x in open(du).read().split()] if os.path.exists(du) else []
folder = max(sizes) if sizes else 0
need = plan["totals"]["nvme"]
m = plan["model"]
print(f"### {os.path.basename(config)}{' ' + ' '.join(sets) if sets else ''}")
print()
n = m["params"]
print(f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M", end=" ")
print(f"parameters ({m['n_layer']} layers, d_model {m['d_model']}, seq {m['seq_len']}), "
      f"device {plan['device']['type']}, offload_optimizer={plan['offload_optimizer']} "
      f"offload_param={plan['offload_param']}, NVMe folder {nvme}")
print()
print("| step | step time | busiest (busy) | step ÷ busiest | disk busy | NVMe read / written |")
print("|---|---|---|---|---|---|")
for s in steps:
    busy = s.get("busy_s", {})
    b = s.get("busiest", "")
    bt = busy.get(b, 0.0)
    disks = sum(v for k, v in busy.items() if k.startswith("disk "))
    nb = s.get("nvme_bytes", {})
    ratio = f"{s['step_s'] / bt:.2f}" if bt > 0 else "-"
    print(f"| {s['step']} | {s['step_s']:.1f} s | {b} ({bt:.1f} s) | {ratio} | {disks:.1f} s "
          f"| {nb.get('read', 0) / G:.2f} / {nb.get('written', 0) / G:.2f} GB |")
print()
print("| | measured | zinf plan | measured ÷ plan |")
print("|---|---|---|---|")
print(f"| peak RSS ({rss_from}) | {rss / GiB:.2f} GiB | {predicted / GiB:.2f} GiB | {rss / predicted:.3f} |")
if device_share:
    print(f"| peak RSS less the device's share ({device_share / GiB:.2f} GiB, the CPU device) "
          f"| {(rss - device_share) / GiB:.2f} GiB | {(predicted - device_share) / GiB:.2f} GiB "
          f"| {(rss - device_share) / (predicted - device_share):.3f} |")
print(f"| disk space taken (df, polled every 2 s; other processes' writes count too) | {disk_taken / GiB:.2f} GiB "
      f"| {need / GiB:.2f} GiB NVMe | {disk_taken / need if need else 0:.3f} |")
if sizes:
    print(f"| the NVMe folder's largest size (du, polled every 2 s) | {folder / GiB:.2f} GiB "
          f"| {need / GiB:.2f} GiB NVMe "
          f"| {folder / need if need else 0:.3f} |")
print()
print(f"params_digest {run['params_digest']}, final loss {run['loss']:.6f}, val_loss {run['val_loss']:.6f}, "
      f"{run['steps']} step(s), wall {wall // 60} min {wall % 60} s; raw files in {out}")
EOF
}
while [ $# -gt 0 ]; do
  case "$1" in
    --nvme) [ $# -ge 2 ] || die "--nvme needs a folder"; nvme="$2"; shift 2 ;;
    --config) [ $# -ge 2 ] || die "--config needs a file"; config="$2"; shift 2 ;;
    --zinf) [ $# -ge 2 ] || die "--zinf needs a binary"; zinf="$2"; shift 2 ;;
    --out) [ $# -ge 2 ] || die "--out needs a folder"; out="$2"; shift 2 ;;
    --set) [ $# -ge 2 ] || die "--set needs key=value"; sets+=(--set "$2"); shift 2 ;;
    --report) [ $# -ge 2 ] || die "--report needs a folder"; report="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
if [ -n "$report" ]; then
  [ -f "$report/run.txt" ] || die "$report: no run.txt there (not an output folder of this script)"
  print_report "$report"
  exit 0
fi
[ -n "$nvme" ] || die "name the NVMe folder with --nvme DIR (or ZINF_NVME_DIR)"
[ -x "$zinf" ] || die "$zinf: no zinf binary there (build it: ZINF_BUILD_TARGETS=zinf scripts/build.sh, or --zinf BIN)"
[ -f "$config" ] || die "$config: no such config"
command -v python3 >/dev/null || die "needs python3 to read zinf's JSON"
nvme="$(realpath -m "$nvme")"
[ -n "$out" ] || out="$(mktemp -d "${TMPDIR:-/tmp}/zinf-streaming-run-XXXXXX")"
mkdir -p "$out"
out="$(realpath "$out")"
sets+=(--set "zero_optimization.offload_optimizer.nvme_path=\"$nvme\""
       --set "zero_optimization.offload_param.nvme_path=\"$nvme\""
       --set "train.metrics_file=\"$out/metrics.jsonl\"")

# The plan first: its NVMe bytes against the free space, before anything is created.
"$zinf" plan --json --config "$config" "${sets[@]}" > "$out/plan.json"
at="$nvme"
while [ ! -e "$at" ]; do at="$(dirname "$at")"; done
free=$(df -B1 --output=avail "$at" | tail -1 | tr -d ' ')
need=$(python3 -c 'import json,sys; print(int(json.load(open(sys.argv[1]))["totals"]["nvme"]))' "$out/plan.json")
if [ "$need" -gt "$free" ]; then
  gib() { awk -v b="$1" 'BEGIN { printf "%.2f GiB", b / 1073741824 }'; }
  echo "streaming-run.sh: $nvme: the plan puts $(gib "$need") on NVMe there, $(gib "$free") is free" >&2
  exit 1
fi

# The run, with the disk's used bytes polled beside it.
df -B1 --output=used "$at" | tail -1 | tr -d ' ' > "$out/df.txt"
: > "$out/du.txt"
( while sleep 2; do
    df -B1 --output=used "$at" | tail -1 | tr -d ' ' >> "$out/df.txt"
    [ -d "$nvme" ] && du -sB1 "$nvme" 2>/dev/null | cut -f1 >> "$out/du.txt"
  done ) &
poll=$!
trap 'kill $poll 2>/dev/null || true' EXIT
timer=()
[ -x /usr/bin/time ] && timer=(/usr/bin/time -v -o "$out/time.txt")
t0=$(date +%s)
{ echo "$config"; echo "$nvme"; echo 0
  for a in "${sets[@]}"; do [ "$a" = --set ] || echo "$a"; done; } > "$out/run.txt"
rc=0
"${timer[@]}" "$zinf" train --json --config "$config" "${sets[@]}" > "$out/train.json" 2> "$out/train.log" || rc=$?
t1=$(date +%s)
sed -i "3s/.*/$((t1 - t0))/" "$out/run.txt"
kill $poll 2>/dev/null || true
wait $poll 2>/dev/null || true
df -B1 --output=used "$at" | tail -1 | tr -d ' ' >> "$out/df.txt"
if [ "$rc" -ne 0 ]; then
  echo "streaming-run.sh: zinf train exited $rc: $(grep '^zinf: ' "$out/train.log" | tail -1) (log: $out/train.log)" >&2
  exit "$rc"
fi

print_report "$out"
