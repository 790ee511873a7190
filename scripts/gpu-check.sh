#!/usr/bin/env bash
# The GPU checks, as ONE run of at most 9 minutes on a machine with one H200 and 16 cores (the lent
# GPU machine). On a bare machine it uses the Debian packages if installed, else the .debs/ folder
# that scripts/fetch-debs.sh filled on a machine with apt (carry it along), else apt.
#
# Sections, each under its own time cap (`timeout`) so that a slow one cannot eat the others' time;
# the caps sum to the whole check's 595 s (ZINF_GPU_CHECK_SECONDS), and a section that would start
# past that is skipped and reported:
#   setup        10 s  dependencies, NCCL, nvidia-smi (not capped: a few seconds)
#   build       130 s  sm_90 only; only the targets run below: zinf, train_test, the `gpu` label's tests
#   tests        40 s  `zinf info`; ctest -L gpu (the CUDA device, every op against the CPU reference,
#                      the whole model against the CPU device)
#   repeat       20 s  TrainGpu.* (every placement bit-identical on the GPU, close to the CPU), repeated
#                      while the cap allows (at least once)
#   digests      70 s  configs/gpu-check.json at 12 layers, 3 steps, under every placement (optimizer
#                      none/cpu/nvme × params none/cpu × overlap exact/none): one params_digest, no
#                      failed run (scripts/digest-check.sh); more rounds while the cap allows
#   states       55 s  the same at 2 layers, 2 steps, overlap exact: fp32 states with the activation
#                      checkpoints in host memory, the speculative Update, pin_memory false (also
#                      with the parameters on NVMe) and the gradients summed on the device beside the
#                      placements; optimizer_states bf16 and 8bit (the CUDA Update with none, the
#                      host's with cpu/nvme) with the speculative Update — one digest per state format
#   fast         40 s  the same model (4 layers, 3 steps, bf16) with device.kernels fast on the GPU,
#                      against the reference kernels on the GPU (per-step losses within a relative
#                      2e-2: the fast path stores activations in bf16) and against the CPU twin
#                      (device.type cpu, kernels fast: the same storage and rounding points, other
#                      summation orders; within 5e-3)
#   memcheck     25 s  compute-sanitizer --tool memcheck on the GPU test binaries at small shapes
#                      (cuda_ops, cuda_rows, flash_attention, cuda_gemm, cuda_scratch, device_cuda;
#                      ZINF_SANITIZE_TESTS="binary:filter ..." overrides)
#   racecheck    25 s  compute-sanitizer --tool racecheck on the same
#   pcie          5 s  zinf bench pcie (256 MiB, 3 repetitions)
#   compare-a    30 s  zinf beside PyTorch (bench/torch_gpt2.py, scripts/compare-torch.sh): 303M,
#                      24 layers x 1024, micro batch 8, seq 512, resident
#   compare-b    40 s  GPT-2 XL's shape (48 x 1600, 25 heads), vocab 50304, seq 1024, micro batch 4,
#                      resident
#   compare-ga4  40 s  b at GA 4 resident (zinf), and with the optimizer states on the CPU
#   compare-off  45 s  b at GA 4, optimizer and parameters on the CPU, beside PyTorch FSDP CPU offload
#   offload      15 s  zinf bench step on the digest model (12 layers, optimizer in host memory, clipping
#                      that never applies) with the speculative Update and the activation checkpoints in
#                      host memory: overlap ratio with and without speculation, the checkpoint copies'
#                      hidden fraction and the device bytes they save, one digest for all four runs
#   summary       5 s  results.json and results.md
#                                                                                   total 595 s
# Results under $OUT (or ./gpu-check-out): results.json (every section: status, seconds, cap, its
# verdict line; the digests, losses, PCIe and comparison figures), results.md (one table), and
# gpu-check.log (everything the sections printed). Exits 1 when any section failed, timed out or was
# skipped. ZINF_GPU_CHECK_PARTS picks sections (default all; setup and summary always run).
# shellcheck disable=SC2317  # the part_* functions are called by name ("part_$p")
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
self="$root/scripts/gpu-check.sh"
out_dir="${OUT:-$root/gpu-check-out}"
raw="$out_dir/raw"
bld="${ZINF_GPU_BUILD:-$root/build-gpu}"
zinf="$bld/src/zinf"
config="$root/configs/gpu-check.json"

# ---- the sections that are more than one command (run as `gpu-check.sh --part NAME CAP`) ---------
gpu_test_targets() { sed -n 's/^ *zinf_test(\([A-Za-z0-9_]*\) LABEL gpu .*/\1/p' "$root/tests/CMakeLists.txt"; }

part_build() {
  local gen=() extra=()
  command -v ninja >/dev/null 2>&1 && [ ! -f "$bld/CMakeCache.txt" ] && gen=(-G Ninja)
  # shellcheck disable=SC2206  # the NCCL paths found by setup, as words
  extra=(${ZINF_GPU_CMAKE_EXTRA:-})
  # Warnings stay warnings here: the lent machine's compiler may not be Debian 12's GCC.
  cmake -S "$root" -B "$bld" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DZINF_CUDA=ON -DZINF_CUDA_ARCHS=90 \
    -DZINF_BUILD_BENCH=OFF -DZINF_WERROR=OFF "${extra[@]}" || return 1
  local targets=(--target zinf --target train_test)
  for t in $(gpu_test_targets); do targets+=(--target "$t"); done
  cmake --build "$bld" -j "$(nproc)" "${targets[@]}" || return 1
  echo "build: zinf, train_test and $(gpu_test_targets | wc -l) gpu test binaries for sm_90"
}

part_tests() {
  "$zinf" info || return 1
  ctest --test-dir "$bld" -L gpu --output-on-failure || return 1
  echo "tests: ctest -L gpu passed"
}

part_repeat() {  # TrainGpu.* as often as the cap allows, at least once
  local cap="$1" t0=$SECONDS n=0 last=0 s
  while :; do
    s=$SECONDS
    "$bld/tests/train_test" --gtest_filter='TrainGpu.*' || { echo "repeat: FAILED on run $((n + 1))"; return 1; }
    n=$((n + 1)) last=$((SECONDS - s))
    [ $((SECONDS - t0 + last + 2)) -gt "$cap" ] && break
  done
  echo "repeat: TrainGpu.* passed $n times ($last s each)"
}

# Variants of the placements that must not change the digest: activation checkpoints in host memory,
# the speculative Update (the config clips at 1.0, so its steps roll back and redo), pageable staging,
# the micro batches' gradients summed on the device (the config's GA is 2), and pageable staging with
# the parameters on NVMe (their reads land in pageable memory, then go up).
state_variants="--set activation_checkpointing.cpu_checkpointing=true;--set zero_optimization.offload_optimizer.speculative=true;--set zero_optimization.offload_optimizer.pin_memory=false;--set zero_optimization.offload_optimizer.device_grad_accumulation=true;--set zero_optimization.offload_optimizer.pin_memory=false --set zero_optimization.offload_param.device=nvme --set zero_optimization.offload_param.nvme_path=\"${TMPDIR:-/tmp}/zinf-gpu-check-swap\""

part_digests() {
  local cap="$1"
  ZINF_DIGEST_ROUNDS=1 ZINF_DIGEST_SECONDS=$((cap - 5)) ZINF_DIGEST_STEPS=3 \
    "$root/scripts/digest-check.sh" "$zinf" "$config" "${TMPDIR:-/tmp}/zinf-gpu-check-swap" --set model.n_layer=12
}

part_states() {  # one digest per optimizer-state format over its placements and variants
  local rc=0 mode variants
  for mode in fp32 bf16 8bit; do
    echo "states: $mode"
    variants="--set zero_optimization.offload_optimizer.speculative=true"
    [ "$mode" = fp32 ] && variants="$state_variants"
    ZINF_DIGEST_ROUNDS=1 ZINF_DIGEST_STEPS=2 ZINF_DIGEST_OVERLAPS=exact ZINF_DIGEST_VARIANTS="$variants" \
      "$root/scripts/digest-check.sh" "$zinf" "$config" "${TMPDIR:-/tmp}/zinf-gpu-check-swap" --set model.n_layer=2 \
      --set "zero_optimization.optimizer_states=\"$mode\"" || rc=1
  done
  [ "$rc" = 0 ] && echo "states: ok, one digest per state format (fp32, bf16, 8bit) over its placements and variants"
  return "$rc"
}

part_fast() {  # the config's bf16 model under device.kernels "reference" and "fast" on the GPU, and the twin
  local rc=0 name dev kernels
  for run in "cuda reference" "cuda fast" "cpu fast"; do
    read -r dev kernels <<< "$run"
    name="$dev-$kernels"
    "$zinf" train --config "$config" --set model.n_layer=4 --set train.steps=3 --set device.type="$dev" \
      --set device.kernels="\"$kernels\"" --set bf16.enabled=true --set device.memory_budget=16GiB \
      --set "train.metrics_file=\"$raw/losses-$name.jsonl\"" || { echo "fast: $name FAILED"; rc=1; }
  done
  [ "$rc" = 0 ] || return 1
  python3 - "$raw" <<'PY'
import json, sys
d = sys.argv[1]
def losses(name):
    return [r["loss"] for r in map(json.loads, open(f"{d}/losses-{name}.jsonl")) if "loss" in r]
fast, ref, twin = losses("cuda-fast"), losses("cuda-reference"), losses("cpu-fast")
def worst(a, b):
    assert len(a) == len(b) > 0, (a, b)
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))
w_ref, w_twin = worst(fast, ref), worst(fast, twin)
json.dump({"fast": fast, "reference": ref, "twin": twin, "vs_reference": w_ref, "vs_twin": w_twin,
           "tolerance_reference": 2e-2, "tolerance_twin": 5e-3}, open(f"{d}/fast.json", "w"))
ok = w_ref <= 2e-2 and w_twin <= 5e-3
print("fast: %s, per-step losses fast %s; max rel diff vs reference %.3g (<= 2e-2), vs CPU twin %.3g (<= 5e-3)"
      % ("ok" if ok else "FAILED", ["%.5f" % x for x in fast], w_ref, w_twin))
sys.exit(0 if ok else 1)
PY
}

# The GPU test binaries (every `LABEL gpu` test of tests/CMakeLists.txt but the PCIe benchmark) and
# the tests of each that run at small shapes, as binary:filter pairs.
sanitize_tests_default="cuda_ops_test:CudaOps.EveryOpMatchesTheCpuReference cuda_rows_test:* flash_attention_test:*
  cuda_gemm_test:* cuda_scratch_test:* device_cuda_test:CudaDevice.*:CudaEngineKernels.*"

part_sanitize() {  # memcheck | racecheck on the GPU tests' small shapes
  local tool="$1" san rc=0 ran=0 bin filter
  san="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
  [ -x "$san" ] || { echo "$tool: FAILED, compute-sanitizer not found"; return 1; }
  set -f  # the filters' `*` are gtest's, not the shell's
  # A binary named here that the build did not make fails the check: a renamed test must not drop
  # out of the sanitizer runs unnoticed.
  for pair in ${ZINF_SANITIZE_TESTS:-$sanitize_tests_default}; do
    bin="$bld/tests/${pair%%:*}" filter="${pair#*:}"
    [ -x "$bin" ] || { echo "$tool: ${pair%%:*} FAILED, not built (no such gpu test?)"; rc=1; continue; }
    ran=$((ran + 1))
    "$san" --tool "$tool" --error-exitcode 1 "$bin" --gtest_filter="$filter" || { echo "$tool: ${pair%%:*} FAILED"; rc=1; }
  done
  [ "$ran" -gt 0 ] || { echo "$tool: FAILED, no gpu test binary built"; return 1; }
  [ "$rc" = 0 ] && echo "$tool: clean on $ran gpu test binaries"
  return "$rc"
}

part_pcie() {
  "$zinf" bench pcie --size 256M --reps 3 --json > "$raw/pcie.json" || return 1
  cat "$raw/pcie.json"
  python3 -c 'import json, sys; r = json.load(open(sys.argv[1]))
print("pcie: h2d %.1f, d2h %.1f, both %.1f GB/s; nominal %.1f per direction (gen%d x%d)" % (r["h2d_gb_per_s"],
      r["d2h_gb_per_s"], r["both_gb_per_s"], r["nominal_gb_per_s"], r["pcie_gen"], r["pcie_width"]))' "$raw/pcie.json"
}

part_offload() {  # the speculative Update and host activation checkpoints, each against the run without
  "$zinf" bench step --config "$config" --set model.n_layer=12 --set gradient_clipping=1000 --steps 4 --json \
    --set device.memory_budget=16GiB \
    --set zero_optimization.offload_optimizer.device=cpu --set zero_optimization.offload_param.device=none \
    --set zero_optimization.offload_optimizer.speculative=true --set activation_checkpointing.cpu_checkpointing=true \
    > "$raw/offload.json" || return 1
  python3 - "$raw/offload.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
c = r["cpu_checkpointing"]
digests = {r["params_digest"], r["unspeculated_params_digest"], c["on_device_params_digest"], r["no_offload_params_digest"]}
ok = len(digests) == 1
print("offload: %s, speculative overlap %.3f (without %.3f, %d rollbacks), busiest %s; checkpoints in host memory: "
      "%.0f%% of the copies hidden, +%.1f ms a step, %.1f MiB of device memory saved; %s"
      % ("ok" if ok else "FAILED", r["overlap_ratio"], r["unspeculated_overlap_ratio"], r["rollbacks"], r["busiest"],
         100 * c["hidden_fraction"], 1e3 * c["step_s_added"], c["device_bytes_saved"] / 2**20,
         "one digest" if ok else "digests differ: %s" % sorted(digests)))
sys.exit(0 if ok else 1)
PY
}

part_compare() {  # CASES: one call of compare-torch.sh, adding to $raw/compare.jsonl; fails on a failed run
  local before
  before="$(wc -l < "$raw/compare.jsonl")"
  OUT="$raw" ZINF_BIN="$zinf" ZINF_COMPARE_APPEND=1 ZINF_COMPARE_STEPS=3 ZINF_COMPARE_PEER_STEPS=2 \
    ZINF_COMPARE_CASES="$1" "$root/scripts/compare-torch.sh" || return 1
  ! tail -n +"$((before + 1))" "$raw/compare.jsonl" | grep -q '"failed": true'
}

if [ "${1:-}" = --part ]; then
  p="$2"
  shift 2
  case "$p" in
    build | tests | fast | pcie | states | offload) "part_$p" ;;
    repeat | digests) "part_$p" "$1" ;;
    memcheck | racecheck) part_sanitize "$p" ;;
    compare) part_compare "$1" ;;
    *) echo "gpu-check: no part $p" >&2; exit 2 ;;
  esac
  exit $?
fi

# ---- the run ------------------------------------------------------------------------------------
total="${ZINF_GPU_CHECK_SECONDS:-595}"
parts=" ${ZINF_GPU_CHECK_PARTS:-build tests repeat digests states fast memcheck racecheck pcie compare-a compare-b compare-ga4 compare-off offload} "
start=$SECONDS
mkdir -p "$raw"
log_file="$out_dir/gpu-check.log"
sections="$raw/sections.tsv"
: > "$log_file"
: > "$sections"
: > "$raw/compare.jsonl"
log() { echo "$*" | tee -a "$log_file"; }
# section NAME CAP COMMAND...: runs it under `timeout` (the cap, or what is left of the whole check),
# its output into raw/NAME.log and the log; records status, seconds, cap and its last line.
section() {
  local name="$1" cap="$2" left status rc t0 detail
  shift 2
  [[ "$parts" == *" $name "* ]] || return 0
  left=$((total - 5 - (SECONDS - start)))  # 5 s for the summary
  if [ "$left" -lt 5 ]; then
    log "== $name: skipped, the check's $total s are used up"
    printf '%s\tskipped\t0\t%s\tno time left in the %s s of the whole check\n' "$name" "$cap" "$total" >> "$sections"
    return 0
  fi
  [ "$cap" -gt "$left" ] && cap=$left
  log "== $name (cap $cap s): $*"
  t0=$SECONDS
  timeout --kill-after=5 "$cap" "$@" > "$raw/$name.log" 2>&1
  rc=$?
  cat "$raw/$name.log" >> "$log_file"
  case "$rc" in
    0) status=ok ;;
    124 | 137) status=TIMEOUT ;;
    *) status=FAILED ;;
  esac
  detail="$(grep -v '^[[:space:]]*$' "$raw/$name.log" | tail -1 | tr '\t' ' ' | cut -c1-300)"
  log "== $name: $status ($((SECONDS - t0)) s) $detail"
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$status" "$((SECONDS - t0))" "$cap" "$detail" >> "$sections"
}

# setup: dependencies, NCCL (optional: without it the CUDA device builds and runs one rank)
debs="${ZINF_DEBS:-$root/.debs}"
if "$root/scripts/install-deps.sh" --check >> "$log_file" 2>&1; then
  log "== deps: Debian packages installed"
elif ls "$debs"/*.deb > /dev/null 2>&1; then
  if env_lines="$("$root/scripts/use-debs.sh" "$debs" "$root/.deps-root" 2>> "$log_file")"; then
    eval "$env_lines"
    log "== deps: unpacked the packages of $debs into $root/.deps-root"
  else
    log "== deps: FAILED to unpack $debs"
  fi
else
  log "== deps: installing (scripts/install-deps.sh)"
  "$root/scripts/install-deps.sh" >> "$log_file" 2>&1 || log "== deps: FAILED"
fi
nvcc_bin="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
cuda_root="$(dirname "$(dirname "$nvcc_bin")")"
export ZINF_GPU_CMAKE_EXTRA=""
if ! compgen -G "$cuda_root/lib64/libnccl.so*" > /dev/null && ! compgen -G "/usr/lib/x86_64-linux-gnu/libnccl.so*" > /dev/null; then
  nccl_dir="$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2> /dev/null || true)"
  nccl_lib="$(compgen -G "$nccl_dir/lib/libnccl.so*" | head -1)"
  if [ -n "$nccl_dir" ] && [ -n "$nccl_lib" ] && [ -f "$nccl_dir/include/nccl.h" ]; then
    ZINF_GPU_CMAKE_EXTRA="-DZINF_NCCL_LIBRARY=$nccl_lib -DZINF_NCCL_INCLUDE=$nccl_dir/include"
    export LD_LIBRARY_PATH="$nccl_dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    log "== nccl: $nccl_lib (Python wheel)"
  else
    log "== nccl: none found; the CUDA device builds without it (one rank per machine)"
  fi
fi
nvidia-smi >> "$log_file" 2>&1 || log "== nvidia-smi: FAILED"
log "== setup: $((SECONDS - start)) s"

section build 130 "$self" --part build
section tests 40 "$self" --part tests
section repeat 20 "$self" --part repeat 20
section digests 70 "$self" --part digests 70
section states 55 "$self" --part states
section fast 40 "$self" --part fast
section memcheck 25 "$self" --part memcheck
section racecheck 25 "$self" --part racecheck
section pcie 5 "$self" --part pcie
section compare-a 30 "$self" --part compare "a"
section compare-b 40 "$self" --part compare "b"
section compare-ga4 40 "$self" --part compare "b-ga4 b-ga4-opt"
section compare-off 45 "$self" --part compare "b-ga4-all"
section offload 15 "$self" --part offload
# The comparison's table over every case that ran.
OUT="$raw" ZINF_BIN="$zinf" ZINF_COMPARE_APPEND=1 ZINF_COMPARE_CASES=none "$root/scripts/compare-torch.sh" \
  > /dev/null 2>> "$log_file"

# ---- summary: results.json and results.md -------------------------------------------------------
python3 - "$raw" "$out_dir" "$total" "$((SECONDS - start))" <<'PY'
import json, os, sys
raw, out, total, wall = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
def load(name):
    p = os.path.join(raw, name)
    try:
        return json.load(open(p))
    except (OSError, ValueError):
        return None
sections = []
for line in open(os.path.join(raw, "sections.tsv")):
    name, status, secs, cap, detail = (line.rstrip("\n").split("\t") + [""] * 5)[:5]
    sections.append({"name": name, "status": status, "seconds": int(secs), "cap_s": int(cap), "detail": detail})
compare = [json.loads(l) for l in open(os.path.join(raw, "compare.jsonl")) if l.strip()]
results = {"ok": all(s["status"] == "ok" for s in sections), "wall_s": wall, "budget_s": total,
           "sections": sections, "fast": load("fast.json"), "pcie": load("pcie.json"), "offload": load("offload.json"),
           "compare": compare}
json.dump(results, open(os.path.join(out, "results.json"), "w"), indent=1)
with open(os.path.join(out, "results.md"), "w") as md:
    md.write(f"GPU check: {'ok' if results['ok'] else 'FAILED'}, {wall} s of {total} s\n\n")
    md.write("| section | status | s | cap s | result |\n|---|---|---|---|---|\n")
    for s in sections:
        md.write(f"| {s['name']} | {s['status']} | {s['seconds']} | {s['cap_s']} | {s['detail'].replace('|', '/')} |\n")
    table = os.path.join(raw, "compare.md")
    if compare and os.path.exists(table):
        md.write("\n" + open(table).read())
print(open(os.path.join(out, "results.md")).read())
PY
log "== done in $((SECONDS - start)) s; results in $out_dir/results.json and results.md"
grep -q -v -P '\tok\t' "$sections" && exit 1
exit 0
