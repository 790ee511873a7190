#!/usr/bin/env bash
# The GPU check, in three stages, each ONE command on the lent GPU machine (one H100 or H200, 16
# cores), each fitting one window of that machine (15 minutes, its 1-3 minute start included; the
# machine comes up bare, so every stage builds what it runs):
#
#   scripts/gpu-check.sh first-contact   the most answers in one window: the GPU tests, cuDNN's
#                                        attention, placements' digests, one side by side
#   scripts/gpu-check.sh correctness     does the CUDA path compute what the CPU computes?
#   scripts/gpu-check.sh speed           how fast is it, beside PyTorch, and where does the step go?
#
# Each stage has a budget (ZINF_GPU_CHECK_SECONDS; 540 s by default, the build on 16 cores included)
# and always ends inside it: its sections run one after another, each under its own cap (below; the
# cap is cut to what is left of the budget), stopped with SIGTERM at the cap less a 5 s grace and
# with SIGKILL at the cap, its whole process group with it. A section that no longer fits is "not
# run". After every section the stage rewrites its four output files, so a run cut short still says
# what finished. The verdict is on the code, not on the script: the stage stops at once, with one
# line, when `zinf info` lists no GPU; a skipped GPU test is a failure; a section that ran out of
# time is TIMEOUT, not FAILED.
#
# first-contact (540 s)                                                                    cap s
#   build      sm_90, every target the stages run (--targets)                                180
#   gpu        `zinf info --json` lists a GPU, or the stage stops here                         10
#   tests      ctest -L gpu and the GPU cases of other binaries (--cases), fast-vs-twin op     80
#              test included; a skip fails (the tests about a machine without a GPU are not
#              run: they cannot apply on one)
#   attention  cuDNN's attention against the wmma kernel and the CPU twin at the two check      40
#              shapes, forward and backward, two runs bitwise equal; cuDNN must take both
#              directions at both shapes (a "cuDNN refused" line or a wmma fallback fails)
#   digests-exact  the 6 placements of `digests` with overlap exact only: one params_digest    30
#   fast       device.kernels fast against reference on the GPU (per-step losses within 2e-2)  20
#              and against the CPU twin (within 5e-3)
#   pcie       zinf bench pcie (256 MiB, 3 repetitions)                                        10
#   compare-a  zinf beside PyTorch: 303M, 24 x 1024, micro batch 8, seq 512, resident          40
# correctness (540 s)
#   build      as above                                                                       180
#   gpu        as above                                                                        10
#   tests      as above                                                                        80
#   repeat     TrainGpu.* (every placement bit-identical on the GPU, close to the CPU) 10      40
#              times, or as often as the cap allows (then "incomplete")
#   digests    a 4-layer model, 3 steps, every placement (optimizer none/cpu/nvme x params     45
#              none/cpu x overlap exact/none): one params_digest (scripts/digest-check.sh)
#   states     2 layers, 2 steps, overlap exact: fp32 states with their variants (activation   45
#              checkpoints in host memory, the speculative Update, pageable staging, gradients
#              summed on the device, parameters on NVMe, the layer-major order and gradient
#              streaming with the optimizer on NVMe), bf16 and 8-bit states: one digest each
#   fast       as above                                                                        20
#   attention  as above                                                                        40
#   memcheck   compute-sanitizer memcheck on the GPU test binaries at small shapes (cuDNN's    30
#              attention at one small shape)
#   racecheck  compute-sanitizer racecheck on the same, zinf's own kernels only               30
# speed (540 s)
#   build      sm_90, zinf alone (the speed sections run nothing else)                        150
#   gpu        as above                                                                        10
#   pcie       as above                                                                        10
#   compare-a  as above                                                                        40
#   compare-b  GPT-2 XL's shape (48 x 1600, 25 heads), vocab 50304, seq 1024, micro batch 4    50
#   compare-ga4  b at GA 4 resident, and with the optimizer states on the CPU                  50
#   compare-off  b at GA 4, optimizer and parameters on the CPU, beside PyTorch FSDP offload   60
#   trace      zinf bench step --trace on b at GA 4 with the optimizer on the CPU: the         30
#              timeline (trace.json) and its picture (trace.svg)
#   offload    the speculative Update and the activation checkpoints in host memory, each      20
#              against the run without (zinf bench step): overlap ratios, one digest
#   attention-speed  attention forward+backward: cuDNN, wmma, PyTorch's SDPA at the check shapes   30
# The caps of the first GPU run are generous estimates; docs/gpu.md says where each comes from and
# is where measured times replace them.
#
# Output under $OUT (the device tool's folder; default gpu-check-out/STAGE), four files and nothing
# else, since a run brings back only a few: results.json (the stage, commit, GPU, every section's
# status, seconds, cap and verdict line, the figures, what the archive had to leave out),
# results.md (one table), gpu-check-tail.log (the last ZINF_GPU_CHECK_TAIL_KIB KiB, default 256, of
# the full log) and raw.tar.gz (gpu-check.log, every section printed, and raw/, each section's log
# and files; at most ZINF_GPU_CHECK_ARCHIVE_MAX bytes, default 16 MiB: past that the biggest files
# are cut to their ends or left out, and results.json's "archive" names them). The working files
# live in a scratch folder (ZINF_GPU_CHECK_WORK, default under $TMPDIR), removed at the end; each
# output file is replaced whole (written aside, then renamed). Exits 0 only when every section is ok.
#
# ZINF_GPU_CHECK_PARTS picks sections (default: all of the stage; setup always runs).
# ZINF_GPU_CHECK_EXECUTOR=1 runs the stage on the project's CPU executor of the CUDA sources instead
# of a GPU (as CI does): the build is the executor build, shapes are small, compute-sanitizer is
# replaced by a stand-in that runs the binary under the executor's lifo order, PyTorch is optional
# and no figure is judged against a target. It proves the script — its parsing, counting, caps and
# results files — not the GPU.
# ZINF_GPU_BUILD: the build folder (default build-gpu/, build-executor/ with the executor).
# ZINF_GPU_CMAKE_EXTRA: more arguments for the build's configure (words), e.g. -DZINF_CUDA_LIBS_FROM=wheel.
# On a machine that reaches no package registry, carry the .debs/ folder scripts/fetch-debs.sh
# fills (or ZINF_DEBS); without it and without the packages, the stage tries scripts/install-deps.sh
# for at most 2 minutes.
#
#   scripts/gpu-check.sh --targets     the build targets the stages run (scripts/test.sh uses them)
#   scripts/gpu-check.sh --stages      the stages, in the order of the windows they are for
#   scripts/gpu-check.sh --sections STAGE   the sections of a stage, in order
#   scripts/gpu-check.sh --cases       the ctest regex of the GPU cases in binaries not labelled gpu
#   scripts/gpu-check.sh --executor-cases   the regex of the GPU cases only the executor runs (its fakes' hooks)
# shellcheck disable=SC2317  # the part_* functions are called by name
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
self="$root/scripts/gpu-check.sh"
executor="${ZINF_GPU_CHECK_EXECUTOR:-0}"
if [ "$executor" = 1 ]; then bld="${ZINF_GPU_BUILD:-$root/build-executor}"; else bld="${ZINF_GPU_BUILD:-$root/build-gpu}"; fi
zinf="$bld/src/zinf"
config="$root/configs/gpu-check.json"
# One scratch folder for the NVMe placements of a stage (its parts are processes of their own).
swap="${ZINF_GPU_CHECK_SWAP:-${TMPDIR:-/tmp}/zinf-gpu-check-swap.$$}"
export ZINF_GPU_CHECK_SWAP="$swap"

# ---- what the stages build and run ---------------------------------------------------------------
gpu_test_targets() { sed -n 's/^ *zinf_test(\([A-Za-z0-9_]*\) LABEL gpu .*/\1/p' "$root/tests/CMakeLists.txt"; }
# Binaries not labelled gpu that hold GPU cases, and those cases.
gpu_case_targets="train_test fast_ops_twin_test ops_table_test generate_test"
gpu_cases='^(TrainGpu\.|FastOpsTwin\.EveryOpOnTheGpu|FastOpsTwin\.AttentionChoices|OpsTable\.Cuda|Generate\.Cuda)'
# GPU cases that need the executor's library fakes (their test hooks): run on the executor only.
executor_cases='^FastOpsTwin\.CudnnRefused(Shape|Backward)'
# Tests about a machine without a GPU: they skip where one is visible, so the GPU stages leave them out.
no_gpu_tests='WithoutAGpu'
# Each stage's sections and their caps in seconds, in order (the header says what each runs). A stage
# fits one window of the GPU machine: the caps, the build's included, sum to at most its budget.
stage_plan() {
  case "$1" in
    first-contact) echo "build:180 gpu:10 tests:80 attention:40 digests-exact:30 fast:20 pcie:10 compare-a:40" ;;
    correctness) echo "build:180 gpu:10 tests:80 repeat:40 digests:45 states:45 fast:20 attention:40 memcheck:30 racecheck:30" ;;
    speed) echo "build:150 gpu:10 pcie:10 compare-a:40 compare-b:50 compare-ga4:50 compare-off:60 trace:30 offload:20 attention-speed:30" ;;
    *) return 1 ;;
  esac
}
stages="first-contact correctness speed"
# What a stage builds: speed runs zinf alone; the others run the test binaries too.
stage_targets() {
  # shellcheck disable=SC2046,SC2086  # the lists, as words
  if [ "$1" = speed ]; then echo zinf; else echo zinf $gpu_case_targets $(gpu_test_targets); fi
}
case "${1:-}" in
  --targets) stage_targets all; exit 0 ;;
  --stages) echo "$stages"; exit 0 ;;
  --sections)
    stage_plan "${2:-}" > /dev/null || { echo "gpu-check: --sections $stages, not '${2:-}'" >&2; exit 2; }
    stage_plan "$2" | sed 's/:[0-9]*//g'; exit 0 ;;
  --cases) echo "$gpu_cases"; exit 0 ;;
  --executor-cases) echo "$executor_cases"; exit 0 ;;
esac

# Shapes: the GPU's, or small ones on the executor (the same sections, minutes instead of hours).
if [ "$executor" = 1 ]; then
  small=(--set model.n_layer=2 --set model.n_head=2 --set model.d_model=64 --set model.seq_len=32
         --set train_micro_batch_size_per_gpu=2)
  digest_model=("${small[@]}")
  states_model=("${small[@]}")
  repeat_target=2
  sanitizer="$root/tests/scripts/sanitizer_standin.sh"
  attention_shapes="2,40,5,5,64;1,48,4,2,128"
  attention_bench_shapes="1,32,2,2,64 1,32,4,2,128"
else
  small=()
  digest_model=(--set model.n_layer=4)
  states_model=(--set model.n_layer=2)
  repeat_target="${ZINF_GPU_REPEATS:-10}"
  sanitizer="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
  # GPT-2 small's heads at 1024 tokens (an odd head count), Llama 3 8B's at 4096 (GQA 32/8, D 128),
  # and a Mistral-like sliding window of 256 at 1024 tokens (GQA 8/2, D 128).
  attention_shapes="4,1024,25,25,64;1,4096,32,8,128;1,1024,8,2,128,256"
  attention_bench_shapes="4,1024,25,25,64 1,4096,32,8,128"
fi

# Fails (1) when a gtest or ctest log ($1) reports a skipped test, naming them.
no_skips() {
  local skipped
  skipped="$(grep -E '\*\*\*Skipped|^\[  SKIPPED \] [A-Za-z]' "$1" | grep -vE "$no_gpu_tests" | sort -u)"
  [ -z "$skipped" ] && return 0
  echo "$(wc -l <<< "$skipped") skipped, which a GPU stage counts as failed:"
  echo "$skipped"
  return 1
}

# ---- the sections (each run as `gpu-check.sh --part NAME [ARG]`, in its own process group) ---------
part_build() {
  local gen=() extra=() targets=()
  command -v ninja > /dev/null 2>&1 && [ ! -f "$bld/CMakeCache.txt" ] && gen=(-G Ninja)
  # shellcheck disable=SC2206  # more configure arguments from the caller (ZINF_GPU_CMAKE_EXTRA), as words
  extra=(${ZINF_GPU_CMAKE_EXTRA:-})
  if [ "$executor" = 1 ]; then
    extra+=(-DZINF_CUDA_EXECUTOR=ON)
  else
    # Warnings stay warnings: the lent machine's compiler may not be Debian 12's GCC.
    # cuDNN, NCCL and NVRTC are found beside the toolkit, in the system or in the Python wheels of
    # python3 (cmake/CudaLibraries.cmake). Without cuDNN the build goes on: only the attention
    # sections fail, saying so.
    extra+=(-DZINF_CUDA=ON -DZINF_CUDA_ARCHS=90 -DZINF_WERROR=OFF)
  fi
  mkdir -p "$bld"
  cmake -S "$root" -B "$bld" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DZINF_BUILD_BENCH=OFF "${extra[@]}" > "$bld/configure.log" 2>&1 ||
    { tail -20 "$bld/configure.log"; return 1; }
  for t in $(stage_targets "${ZINF_GPU_CHECK_STAGE:-all}"); do targets+=(--target "$t"); done
  cmake --build "$bld" -j "$(nproc)" "${targets[@]}" || return 1
  echo "build: ok, ${#targets[@]} targets in $bld; $(grep -h '^-- zinf: ' "$bld/configure.log" | tr '\n' ' ')"
}

part_gpu() {  # one line: the GPUs `zinf info` lists, or why there is none (then the stage stops)
  "$zinf" info --json > "$raw/info.json" || { echo "gpu: FAILED, zinf info exited non-zero"; return 1; }
  python3 - "$raw/info.json" << 'PY'
import json, sys
j = json.load(open(sys.argv[1]))
gpus, status = j.get("gpus", []), j.get("cuda", {}).get("status", "")
if not gpus:
    print("gpu: FAILED, %s" % (status or "no GPU listed")); sys.exit(1)
print("gpu: ok, %s" % ", ".join("%s (cc %s)" % (g["name"], g["compute_capability"]) for g in gpus))
PY
}

# Empty when this zinf runs cuDNN; otherwise why not, as `zinf info` says (the gpu section's
# info.json, or a fresh query).
no_cudnn() {
  [ -s "$raw/info.json" ] || "$zinf" info --json > "$raw/info.json" 2> /dev/null
  python3 -c 'import json, sys
try:
    c = json.load(open(sys.argv[1])).get("cuda", {})
except (OSError, ValueError):
    c = {}
if not c.get("cudnn"):
    print("this zinf was built without cuDNN (the configure looked beside the toolkit, in the system and in "
          "python3'"'"'s NVIDIA wheels: raw/build.log)")' "$raw/info.json"
}
# The tests that need cuDNN: a build without it leaves them out of the tests and sanitizer sections
# (they would skip), and the attention sections fail instead, with one line.
cudnn_tests='[.](Cudnn|CheckShapesFailWhenCudnn)'

part_tests() {  # every gpu test and the GPU cases of the other binaries; a skip fails
  local log="$raw/tests-ctest.log" rc=0 exclude="$no_gpu_tests" without note=""
  without="$(no_cudnn)"
  if [ -n "$without" ]; then exclude="$exclude|$cudnn_tests" note="; cuDNN's tests left out: $without"; fi
  ctest --test-dir "$bld" -L gpu -E "$exclude" --no-tests=error --output-on-failure 2>&1 | tee "$log" || rc=1
  ctest --test-dir "$bld" -R "$gpu_cases" -E "$exclude" --no-tests=error --output-on-failure 2>&1 | tee -a "$log" || rc=1
  no_skips "$log" || return 1
  [ "$rc" = 0 ] || { echo "tests: FAILED ($(grep -cE '\*\*\*Failed|\*\*\*Exception|\*\*\*Timeout' "$log") failed)$note"; return 1; }
  echo "tests: ok, $(grep -cE 'Test +#[0-9]+: .* Passed' "$log") passed, none skipped$note"
}

part_repeat() {  # TrainGpu.* up to the target count while the cap allows
  local cap="$1" t0=$SECONDS n=0 last=0 s log="$raw/repeat-run.log"
  while [ "$n" -lt "$repeat_target" ]; do
    s=$SECONDS
    "$bld/tests/train_test" --gtest_filter='TrainGpu.*' > "$log" 2>&1 || {
      tail -20 "$log"
      echo "repeat: FAILED on run $((n + 1))"
      return 1
    }
    no_skips "$log" || return 1
    n=$((n + 1)) last=$((SECONDS - s))
    [ $((SECONDS - t0 + last + 2)) -gt "$cap" ] && break
  done
  if [ "$n" -lt "$repeat_target" ]; then
    echo "repeat: incomplete, TrainGpu.* passed $n of $repeat_target times ($last s each) before the cap"
    return 3
  fi
  echo "repeat: ok, TrainGpu.* passed $n of $repeat_target times ($last s each)"
}

part_digests() {
  ZINF_DIGEST_ROUNDS=1 ZINF_DIGEST_STEPS=3 "$root/scripts/digest-check.sh" "$zinf" "$config" "$swap" "${digest_model[@]}"
}

part_digests_exact() {  # the first window's share of `digests`: every placement, overlap exact only
  ZINF_DIGEST_OVERLAPS=exact part_digests
}

# Variants of the placements that must not change the digest: activation checkpoints in host memory,
# the speculative Update (the config clips at 1.0, so its steps roll back and redo), pageable staging,
# the micro batches' gradients summed on the device (the config's GA is 2), pageable staging with
# the parameters on NVMe (their reads land in pageable memory, then go up), and with the optimizer on
# NVMe the layer-major order (the tied head's gradient buffer per micro batch on the GPU, every micro
# batch's checkpoints) without and with gradient streaming (the ring's pinned slots written to NVMe
# and read back for a clipped step's redone Update).
state_variants="--set activation_checkpointing.cpu_checkpointing=true;--set zero_optimization.offload_optimizer.speculative=true;--set zero_optimization.offload_optimizer.pin_memory=false;--set zero_optimization.offload_optimizer.device_grad_accumulation=true;--set zero_optimization.offload_optimizer.pin_memory=false --set zero_optimization.offload_param.device=nvme --set zero_optimization.offload_param.nvme_path=\"$swap\";--set zero_optimization.offload_optimizer.device=nvme --set zero_optimization.offload_optimizer.nvme_path=\"$swap\" --set zero_optimization.offload_optimizer.layer_major=true;--set zero_optimization.offload_optimizer.device=nvme --set zero_optimization.offload_optimizer.nvme_path=\"$swap\" --set zero_optimization.offload_optimizer.layer_major=true --set zero_optimization.offload_optimizer.gradient_streaming=true"

part_states() {  # one digest per optimizer-state format over its placements and variants
  local rc=0 mode variants
  for mode in fp32 bf16 8bit; do
    echo "states: $mode"
    variants="--set zero_optimization.offload_optimizer.speculative=true"
    [ "$mode" = fp32 ] && variants="$state_variants"
    ZINF_DIGEST_ROUNDS=1 ZINF_DIGEST_STEPS=2 ZINF_DIGEST_OVERLAPS=exact ZINF_DIGEST_VARIANTS="$variants" \
      "$root/scripts/digest-check.sh" "$zinf" "$config" "$swap" "${states_model[@]}" \
      --set "zero_optimization.optimizer_states=\"$mode\"" || rc=1
  done
  [ "$rc" = 0 ] && echo "states: ok, one digest per state format (fp32, bf16, 8bit) over its placements and variants"
  return "$rc"
}

part_fast() {  # the config's bf16 model under device.kernels reference and fast on the GPU, and the twin
  local rc=0 name dev kernels model=(--set model.n_layer=4)
  [ "$executor" = 1 ] && model=("${small[@]}")
  for run in "cuda reference" "cuda fast" "cpu fast"; do
    read -r dev kernels <<< "$run"
    name="$dev-$kernels"
    "$zinf" train --config "$config" "${model[@]}" --set train.steps=3 --set device.type="$dev" \
      --set device.kernels="\"$kernels\"" --set bf16.enabled=true --set device.memory_budget=16GiB \
      --set "train.metrics_file=\"$raw/losses-$name.jsonl\"" || { echo "fast: $name FAILED"; rc=1; }
  done
  [ "$rc" = 0 ] || return 1
  python3 - "$raw" << 'PY'
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

part_attention() {  # cuDNN against the wmma kernel and the CPU twin at the check's shapes, bf16, fwd+bwd
  local log="$raw/attention-test.log" checks shapes fallback without
  without="$(no_cudnn)"
  [ -z "$without" ] || { echo "attention: FAILED, $without"; return 1; }
  ZINF_ATTENTION_CHECK_SHAPES="$attention_shapes" "$bld/tests/flash_attention_test" \
    --gtest_filter='FlashAttention.CudnnAgainstWmmaAndTwinAtCheckShapes' > "$log" 2>&1 ||
    { tail -20 "$log"; echo "attention: FAILED"; return 1; }
  no_skips "$log" || return 1
  # One line per check shape, naming what ran each direction (fwd=cudnn|wmma bwd=cudnn|wmma).
  checks="$(grep '^attention-check:' "$log")"
  [ -n "$checks" ] || { echo "attention: FAILED, the test printed no attention-check line (raw/attention-test.log)"; return 1; }
  echo "$checks"
  # Each shape as "B4 T1024 H25 KV25 D64: fwd=cudnn bwd=cudnn", for the verdict line.
  shapes="$(awk '{
      sh = ""; f = "fwd=?"; b = "bwd=?"; delete seen
      for (i = 2; i <= NF; i++) {
        if ($i ~ /^(B|T|H|KV|D|W)$/ && $(i + 1) ~ /^[0-9]+$/ && !seen[$i]++) sh = sh (sh == "" ? "" : " ") $i $(i + 1)
        if ($i ~ /^fwd=/) { f = $i; sub(/[^a-z=]+$/, "", f) }
        if ($i ~ /^bwd=/) { b = $i; sub(/[^a-z=]+$/, "", b) }
      }
      printf "%s%s: %s %s", (NR > 1 ? "; " : ""), sh, f, b
    }' <<< "$checks")"
  # cuDNN must take both directions at every check shape: a fallback to the wmma kernel there is
  # what the GPU check exists to catch, not a pass with another kernel.
  fallback="$(grep -E '(^|[^a-z])(fwd|bwd)=wmma' <<< "$checks"; grep 'cuDNN refused' "$log")"
  if [ -n "$fallback" ]; then
    echo "$fallback" | sed 's/^/attention: fallback: /'
    echo "attention: FAILED, cuDNN did not take every check shape in both directions: $shapes"
    return 1
  fi
  echo "attention: ok, cuDNN within its bound of the wmma kernel and the CPU twin, forward and backward, two" \
    "runs bitwise equal, bf16: $shapes"
}

part_attention_speed() {  # forward+backward time and TFLOPS: cuDNN, the wmma kernel, PyTorch's SDPA
  local shape kind rc=0 out="$raw/attention.jsonl" one="$raw/attention-one.json" without
  without="$(no_cudnn)"
  [ -z "$without" ] || { echo "attention-speed: FAILED, $without"; return 1; }
  : > "$out"
  # Each run's JSON object, as one line of attention.jsonl.
  add_line() { python3 -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1]))))' "$one" >> "$out"; }
  for shape in $attention_bench_shapes; do
    for kind in cudnn wmma; do
      if "$zinf" bench attention --shape "$shape" --attention "$kind" --iters 5 --json > "$one" 2>> "$raw/attention-bench.log"; then
        add_line || rc=1
      else
        echo "attention: zinf bench attention --shape $shape --attention $kind FAILED"
        rc=1
      fi
    done
    if [ "$executor" != 1 ]; then
      if python3 "$root/bench/torch_sdpa.py" --shape "$shape" --iters 5 > "$one" 2>> "$raw/attention-bench.log"; then
        add_line || rc=1
      else
        echo "attention: PyTorch's SDPA at $shape FAILED (raw/attention-bench.log)"
        rc=1
      fi
    fi
  done
  grep -h 'cuDNN refused' "$raw/attention-bench.log" 2> /dev/null | sort -u | sed 's/^/attention: (cudnn rows are the wmma kernel where) /'
  python3 - "$out" << 'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for r in rows:
    s = r["shape"]
    print("attention %-10s B %d T %d H %d KV %d D %d: %8.3f ms  %6.1f TFLOPS"
          % (r["attention"], s["B"], s["T"], s["H"], s["KV"], s["D"], 1e3 * r["fwd_bwd_s"], r["tflops"]))
PY
  [ "$rc" = 0 ] && echo "attention: ok, $(wc -l < "$out") runs (raw/attention.jsonl)"
  return "$rc"
}

# The GPU test binaries (every `LABEL gpu` test but the PCIe benchmark) and the tests of each that run
# at small shapes, as binary:filter pairs. cuDNN's attention runs at one small shape only
# (sanitize_attention_shape, through the check-shapes test): each shape costs cuDNN a cold plan per
# direction, and under the sanitizer a plan's build is most of the time.
sanitize_tests_default="cuda_ops_test:CudaOps.EveryOpMatchesTheCpuReference cuda_rows_test:*
  flash_attention_test:FlashAttention.MatchesCpuTwin:FlashAttention.CudnnAgainstWmmaAndTwinAtCheckShapes:FlashAttention.Refuses*
  cuda_gemm_test:* cuda_scratch_test:* device_cuda_test:CudaDevice.*:CudaEngineKernels.*"
# One small shape, with a sliding window (the test adds a windowed shape to a list without one), at
# a length every cuDNN the frontend accepts runs the backward at.
sanitize_attention_shape="1,128,2,2,64,48"
# racecheck instruments only zinf's own kernels (every one is in namespace zinf::cuda, so "zinf" is
# in its name, mangled or not); cuBLASLt's and cuDNN's kernels run unchecked. racecheck reports
# shared-memory hazards between the threads of one kernel; it says nothing about races between
# streams (the executor's jittered streams and the CPU device's digests check those).
racecheck_kernels="kns=zinf"

part_sanitize() {  # memcheck | racecheck on the GPU tests' small shapes
  local tool="$1" rc=0 ran=0 bin filter log only=()
  [ -x "$sanitizer" ] || { echo "$tool: FAILED, compute-sanitizer not found"; return 1; }
  if [ "$tool" = racecheck ]; then
    # --kernel-name in current releases; older ones spell it --kernel-regex (same keys).
    if "$sanitizer" --help 2>&1 | grep -qE -- '--kernel-name([^-]|$)'; then
      only=(--kernel-name "$racecheck_kernels")
    elif "$sanitizer" --help 2>&1 | grep -q -- '--kernel-regex'; then
      only=(--kernel-regex "$racecheck_kernels")
    else
      echo "$tool: FAILED, $sanitizer takes neither --kernel-name nor --kernel-regex"
      return 1
    fi
  fi
  local negative="*$no_gpu_tests*" without note=""
  without="$(no_cudnn)"
  if [ -n "$without" ]; then negative="$negative:*Cudnn*" note=" (cuDNN's cases left out: $without)"; fi
  set -f  # the filters' `*` are gtest's, not the shell's
  # A binary named here that the build did not make fails the check: a renamed test must not drop
  # out of the sanitizer runs unnoticed.
  for pair in ${ZINF_SANITIZE_TESTS:-$sanitize_tests_default}; do
    bin="$bld/tests/${pair%%:*}" filter="${pair#*:}" log="$raw/$tool-${pair%%:*}.log"
    [ -x "$bin" ] || { echo "$tool: ${pair%%:*} FAILED, not built (no such gpu test?)"; rc=1; continue; }
    ran=$((ran + 1))
    ZINF_ATTENTION_CHECK_SHAPES="$sanitize_attention_shape" ZINF_ATTENTION_SANITIZE_SHAPES=1 \
      "$sanitizer" --tool "$tool" "${only[@]}" --error-exitcode 1 "$bin" --gtest_filter="$filter-$negative" > "$log" 2>&1 ||
      { tail -20 "$log"; echo "$tool: ${pair%%:*} FAILED"; rc=1; continue; }
    no_skips "$log" || rc=1
  done
  [ "$ran" -gt 0 ] || { echo "$tool: FAILED, no gpu test binary built"; return 1; }
  [ "$rc" = 0 ] && echo "$tool: ok, clean on $ran gpu test binaries${only:+ (${only[*]})}$note"
  return "$rc"
}

part_pcie() {
  local size=256M
  [ "$executor" = 1 ] && size=4M
  "$zinf" bench pcie --size "$size" --reps 3 --json > "$raw/pcie.json" || return 1
  python3 -c 'import json, sys; r = json.load(open(sys.argv[1]))
print("pcie: ok, h2d %.1f, d2h %.1f, both %.1f GB/s; nominal %.1f per direction (gen%d x%d)" % (r["h2d_gb_per_s"],
      r["d2h_gb_per_s"], r["both_gb_per_s"], r["nominal_gb_per_s"], r["pcie_gen"], r["pcie_width"]))' "$raw/pcie.json"
}

# The small shapes of the side-by-side on the executor (compare-torch.sh's ZINF_COMPARE_SET).
compare_small="--set model.n_layer=2 --set model.n_head=2 --set model.d_model=64 --set model.vocab_size=256
  --set model.seq_len=32 --set train_micro_batch_size_per_gpu=2 --set device.memory_budget=2GiB"

part_compare() {  # CASES: one call of compare-torch.sh, adding to raw/compare.jsonl; fails on a failed run
  local before
  if [ "$executor" != 1 ] && ! python3 -c 'import torch' 2> /dev/null; then
    echo "compare: FAILED, PyTorch is not importable by $(command -v python3): the side by side needs it"
    return 1
  fi
  before="$(wc -l < "$raw/compare.jsonl")"
  local set_args=""
  [ "$executor" = 1 ] && set_args="$compare_small"
  local peer=""
  [ "$executor" = 1 ] && peer=none  # the peer's shapes are the GPU's, not the executor's small ones
  OUT="$raw" ZINF_BIN="$zinf" ZINF_COMPARE_APPEND=1 ZINF_COMPARE_STEPS=3 ZINF_COMPARE_PEER_STEPS=2 ZINF_COMPARE_PEER=$peer \
    ZINF_COMPARE_SET="$set_args ${ZINF_COMPARE_SET:-}" ZINF_COMPARE_CASES="$1" "$root/scripts/compare-torch.sh" || return 1
  if tail -n +"$((before + 1))" "$raw/compare.jsonl" | grep -q '"failed": true'; then
    echo "compare $1: FAILED, a run failed (raw/compare-*.log)"
    return 1
  fi
  echo "compare $1: ok, $(($(wc -l < "$raw/compare.jsonl") - before)) runs"
}

part_trace() {  # the offloaded case's timeline, as a file Perfetto opens and as a picture
  local args=(--config "$root/configs/compare-b.json" --set gradient_accumulation_steps=4
              --set zero_optimization.stage=2 --set zero_optimization.offload_optimizer.device=cpu
              --set zero_optimization.offload_optimizer.device_grad_accumulation=true)
  # shellcheck disable=SC2206  # the small shapes, as words
  [ "$executor" = 1 ] && args+=($compare_small)
  "$zinf" bench step "${args[@]}" --steps 3 --no-baseline --json --trace "$raw/trace.json" > "$raw/trace-step.json" ||
    return 1
  python3 "$root/scripts/trace-svg.py" "$raw/trace.json" -o "$raw/trace.svg" || return 1
  python3 - "$raw/trace.json" << 'PY'
import json, sys
t = json.load(open(sys.argv[1]))
ev = [e for e in t["traceEvents"] if e.get("ph") == "X"]
tracks = {(e["pid"], e["tid"]) for e in ev}
print("trace: ok, %d spans on %d tracks (raw/trace.json, raw/trace.svg)" % (len(ev), len(tracks)))
PY
}

part_offload() {  # the speculative Update and host activation checkpoints, each against the run without
  local model=(--set model.n_layer=12)
  [ "$executor" = 1 ] && model=("${small[@]}")
  "$zinf" bench step --config "$config" "${model[@]}" --set gradient_clipping=1000 --steps 4 --json \
    --set device.memory_budget=16GiB \
    --set zero_optimization.offload_optimizer.device=cpu --set zero_optimization.offload_param.device=none \
    --set zero_optimization.offload_optimizer.speculative=true --set activation_checkpointing.cpu_checkpointing=true \
    > "$raw/offload.json" || return 1
  python3 - "$raw/offload.json" << 'PY'
import json, sys
r = json.load(open(sys.argv[1]))
c = r["cpu_checkpointing"]
digests = {r["params_digest"], r["unspeculated_params_digest"], c["on_device_params_digest"], r["no_offload_params_digest"]}
ok = len(digests) == 1
print("offload: %s, speculative overlap %.3f (without %.3f, %d rollbacks), busiest %s; checkpoints in host memory: "
      "%.0f%% of the copies hidden, %+.1f ms a step, %.1f MiB of device memory saved; %s"
      % ("ok" if ok else "FAILED", r["overlap_ratio"], r["unspeculated_overlap_ratio"], r["rollbacks"], r["busiest"],
         100 * c["hidden_fraction"], 1e3 * c["step_s_added"], c["device_bytes_saved"] / 2**20,
         "one digest" if ok else "digests differ: %s" % sorted(digests)))
sys.exit(0 if ok else 1)
PY
}

if [ "${1:-}" = --part ]; then
  p="$2"
  raw="$3"
  shift 3
  case "$p" in
    build | gpu | tests | digests | states | fast | pcie | trace | offload | attention) "part_$p" ;;
    attention-speed) part_attention_speed ;;
    digests-exact) part_digests_exact ;;
    repeat) part_repeat "$1" ;;
    memcheck | racecheck) part_sanitize "$p" ;;
    compare-a) part_compare "a" ;;
    compare-b) part_compare "b" ;;
    compare-ga4) part_compare "b-ga4 b-ga4-opt" ;;
    compare-off) part_compare "b-ga4-all" ;;
    *) echo "gpu-check: no part $p" >&2; exit 2 ;;
  esac
  exit $?
fi

# ---- the stage -------------------------------------------------------------------------------------
stage="${1:-}"
plan="$(stage_plan "$stage")" ||
  { echo "usage: scripts/gpu-check.sh first-contact|correctness|speed   (or --targets, --sections STAGE, --cases; see the header)" >&2; exit 2; }
export ZINF_GPU_CHECK_STAGE="$stage"
# 540 s: a window of 15 minutes less the machine's start (up to 3) leaves a command of about 10
# minutes; 60 s of it stay for the transfers and a late start.
budget="${ZINF_GPU_CHECK_SECONDS:-540}"
# On the CPU executor every section runs at small shapes but far slower than on a GPU: its caps are
# the GPU's times ZINF_GPU_CHECK_CAP_SCALE (default 2 there, 1 on a GPU; the budget is the caller's).
cap_scale="${ZINF_GPU_CHECK_CAP_SCALE:-$([ "$executor" = 1 ] && echo 2 || echo 1)}"
case "$cap_scale" in [1-9]|[1-9][0-9]) ;; *) echo "gpu-check: ZINF_GPU_CHECK_CAP_SCALE must be an integer 1..99, got '$cap_scale'" >&2; exit 2 ;; esac
grace=5    # SIGTERM this long before a section's cap, SIGKILL at the cap
reserve=5  # kept for the last results files
out_dir="${OUT:-$root/gpu-check-out/$stage}"
# The working files: a scratch folder outside $OUT (what comes back from $OUT is only its four files).
work="${ZINF_GPU_CHECK_WORK:-${TMPDIR:-/tmp}/zinf-gpu-check-$stage.$$}"
raw="$work/raw"
archive_max="${ZINF_GPU_CHECK_ARCHIVE_MAX:-16777216}"
tail_kib="${ZINF_GPU_CHECK_TAIL_KIB:-256}"
case "$archive_max$tail_kib" in *[!0-9]*) echo "gpu-check: ZINF_GPU_CHECK_ARCHIVE_MAX and ZINF_GPU_CHECK_TAIL_KIB are numbers" >&2; exit 2 ;; esac
parts=" ${ZINF_GPU_CHECK_PARTS:-$(sed 's/:[0-9]*//g' <<< "$plan")} "
start=$SECONDS
mkdir -p "$out_dir"
rm -rf "$raw"
mkdir -p "$raw" || exit 2
# Only this stage's own outputs are replaced; the folder's other files are not this script's.
rm -f "$out_dir/results.json" "$out_dir/results.md" "$out_dir/gpu-check-tail.log" "$out_dir/raw.tar.gz"
log_file="$work/gpu-check.log"
sections="$raw/sections.tsv"
: > "$log_file"
: > "$sections"
: > "$raw/compare.jsonl"
stopped=""
# The commit the results speak for (the GPU machine's copy of the tree has no .git: pass it in).
commit="${ZINF_GPU_CHECK_COMMIT:-$(git -C "$root" rev-parse --short=12 HEAD 2> /dev/null || echo unknown)}"
log() { echo "$*" | tee -a "$log_file"; }

# results.json and results.md from what has run so far; "complete" only at the end.
write_results() {
  python3 - "$raw" "$out_dir" "$stage" "$budget" "$((SECONDS - start))" "$1" "$executor" "$stopped" \
    "$commit" << 'PY' 2>> "$log_file"
import json, os, shutil, sys, time
raw, out, stage, budget, wall, complete, executor, stopped, commit = sys.argv[1:10]
work = os.path.dirname(raw)
def load(name):
    try:
        return json.load(open(os.path.join(raw, name)))
    except (OSError, ValueError):
        return None
sections = []
for line in open(os.path.join(raw, "sections.tsv")):
    name, status, secs, cap, detail = (line.rstrip("\n").split("\t") + [""] * 5)[:5]
    sections.append({"name": name, "status": status, "seconds": int(secs), "cap_s": int(cap), "detail": detail})
compare = [json.loads(l) for l in open(os.path.join(raw, "compare.jsonl")) if l.strip()]
info = load("info.json") or {}
gpus = [g.get("name", "") for g in info.get("gpus", [])]
complete = complete == "final"
ok = complete and not stopped and bool(sections) and all(s["status"] == "ok" for s in sections)
# The speed targets, from the side-by-side rows (judged on a GPU only: the executor's times mean nothing).
def step(case, side):
    r = next((c.get("result") for c in compare if c["case"] == case and c["side"] == side and not c.get("failed")), None)
    return r["step_s"] if r else None
targets = []
for name, num, den, limit in [("a: zinf / PyTorch", ("a", "zinf"), ("a", "torch"), 1.0),
                              ("b: zinf / PyTorch", ("b", "zinf"), ("b", "torch"), 1.0),
                              ("b at GA 4, optimizer offloaded / resident", ("b-ga4-opt", "zinf"), ("b-ga4", "zinf"), 1.10),
                              ("b at GA 4, all offloaded / PyTorch FSDP CPU offload", ("b-ga4-all", "zinf"),
                               ("b-ga4-all", "torch"), 0.5)]:
    n, d = step(*num), step(*den)
    if n is None or d is None:
        continue
    t = {"name": name, "ratio": n / d, "at_most": limit}
    if executor != "1":
        t["met"] = n / d <= limit
    targets.append(t)
results = {"stage": stage, "ok": ok, "complete": complete, "stopped": stopped or None,
           "mode": "executor" if executor == "1" else "gpu", "commit": commit,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "gpus": gpus,
           "command": "scripts/gpu-check.sh " + stage, "wall_s": int(wall), "budget_s": int(budget),
           "sections": sections, "fast": load("fast.json"), "pcie": load("pcie.json"), "offload": load("offload.json"),
           "attention": [json.loads(l) for l in open(os.path.join(raw, "attention.jsonl")) if l.strip()]
                        if os.path.exists(os.path.join(raw, "attention.jsonl")) else [],
           "compare": compare, "targets": targets,
           "archive": json.load(open(os.path.join(work, "archive.json")))
                      if os.path.exists(os.path.join(work, "archive.json")) else None}
def publish(name):  # the scratch folder's NAME.tmp replaces $OUT/NAME whole
    tmp = os.path.join(work, name + ".tmp")
    if os.stat(work).st_dev != os.stat(out).st_dev:  # a rename across file systems is a copy: make it here
        shutil.copyfile(tmp, os.path.join(out, "." + name + ".tmp"))
        os.remove(tmp)
        tmp = os.path.join(out, "." + name + ".tmp")
    os.replace(tmp, os.path.join(out, name))
json.dump(results, open(os.path.join(work, "results.json.tmp"), "w"), indent=1)
publish("results.json")
verdict = "ok" if ok else ("running" if not complete else "FAILED")
with open(os.path.join(work, "results.md.tmp"), "w") as md:
    md.write(f"GPU check, {stage} stage ({results['mode']}): {verdict}, {wall} s of {budget} s; commit {commit}, "
             f"{', '.join(gpus) or 'no GPU'}, {results['date']}\n\n")
    if stopped:
        md.write(f"Stopped: {stopped}\n\n")
    md.write("| section | status | s | cap s | result |\n|---|---|---|---|---|\n")
    for s in sections:
        md.write(f"| {s['name']} | {s['status']} | {s['seconds']} | {s['cap_s']} | {s['detail'].replace('|', '/')} |\n")
    if targets:
        md.write("\n| target | ratio | at most | met |\n|---|---|---|---|\n")
        for t in targets:
            met = "not judged (executor)" if "met" not in t else ("yes" if t["met"] else "NO")
            md.write(f"| {t['name']} | {t['ratio']:.3f} | {t['at_most']} | {met} |\n")
    if results["attention"]:
        md.write("\n| attention | B | T | H | KV | D | fwd+bwd ms | TFLOPS |\n|---|---|---|---|---|---|---|---|\n")
        for r in results["attention"]:
            sh = r["shape"]
            md.write(f"| {r['attention']} | {sh['B']} | {sh['T']} | {sh['H']} | {sh['KV']} | {sh['D']} | "
                     f"{1e3 * r['fwd_bwd_s']:.3f} | {r['tflops']:.1f} |\n")
    table = os.path.join(raw, "compare.md")
    if compare and os.path.exists(table):
        md.write("\n" + open(table).read())
publish("results.md")
PY
}

# raw.tar.gz (gpu-check.log and raw/) and gpu-check-tail.log in $OUT, each replaced whole. The
# archive stays within archive_max bytes: while it is over, its biggest file is cut to its last
# quarter (a log) or left out (anything else); archive.json says which, for results.json.
write_archive() {
  python3 - "$work" "$out_dir" "$archive_max" "$((tail_kib * 1024))" << 'PY' 2>> "$log_file"
import io, json, os, shutil, sys, tarfile
work, out, limit, tail_bytes = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
def publish(name):  # the scratch folder's NAME.tmp replaces $OUT/NAME whole
    tmp = os.path.join(work, name + ".tmp")
    if os.stat(work).st_dev != os.stat(out).st_dev:
        shutil.copyfile(tmp, os.path.join(out, "." + name + ".tmp"))
        os.remove(tmp)
        tmp = os.path.join(out, "." + name + ".tmp")
    os.replace(tmp, os.path.join(out, name))
log = os.path.join(work, "gpu-check.log")
with open(log, "rb") as f:
    f.seek(max(0, os.path.getsize(log) - tail_bytes))
    open(os.path.join(work, "gpu-check-tail.log.tmp"), "wb").write(f.read())
publish("gpu-check-tail.log")
files = {"gpu-check.log": log}
for d, _, names in os.walk(os.path.join(work, "raw")):
    for n in sorted(names):
        path = os.path.join(d, n)
        if os.path.isfile(path) and not os.path.islink(path):
            files[os.path.relpath(path, work)] = path
size = {name: os.path.getsize(path) for name, path in files.items()}
keep = dict(size)  # the bytes of each file that go in, from its end
tmp = os.path.join(work, "raw.tar.gz.tmp")
while True:
    with tarfile.open(tmp, "w:gz", compresslevel=6) as tar:
        for name in sorted(keep):
            with open(files[name], "rb") as f:
                f.seek(max(0, size[name] - keep[name]))
                data = f.read(keep[name])
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), int(os.path.getmtime(files[name])), 0o644
            tar.addfile(info, io.BytesIO(data))
    if os.path.getsize(tmp) <= limit or not keep:
        break
    biggest = max(keep, key=lambda n: keep[n])
    if biggest.endswith(".log") and keep[biggest] > 4096:
        keep[biggest] //= 4
    else:
        del keep[biggest]
json.dump({"bytes": os.path.getsize(tmp), "limit": limit, "left_out": sorted(n for n in size if n not in keep),
           "cut": {n: "its last %d of %d bytes" % (keep[n], size[n]) for n in sorted(keep) if keep[n] < size[n]}},
          open(os.path.join(work, "archive.json"), "w"))
publish("raw.tar.gz")
PY
}

record() {  # name status seconds cap detail
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" >> "$sections"
  write_archive
  write_results running
}

reap() {  # kills every process whose environment carries section token $1; says how many
  local p n=0
  for p in /proc/[0-9]*; do
    if grep -qsxz "ZINF_GPU_CHECK_TOKEN=$1" "$p/environ" && kill -KILL "${p#/proc/}" 2> /dev/null; then n=$((n + 1)); fi
  done
  [ "$n" = 0 ] || echo "(killed $n processes the section left behind)"
}

# section NAME CAP: runs `gpu-check.sh --part NAME` inside the cap (or what is left of the budget).
section() {
  local name="$1" cap="$2" left status rc t0 detail arg="" token left_behind
  [[ "$parts" == *" $name "* ]] || return 0
  left=$((budget - reserve - (SECONDS - start)))
  if [ "$left" -lt $((grace + 5)) ]; then
    log "== $name: not run, the stage's $budget s are used up"
    record "$name" "not run" 0 "$cap" "no time left of the stage's $budget s"
    return 0
  fi
  [ "$cap" -gt "$left" ] && cap=$left
  [ "$name" = repeat ] && arg=$((cap - grace))
  log "== $name (cap $cap s)"
  t0=$SECONDS
  # timeout signals the part's process group; ctest starts each test in a group of its own, so what
  # is left of the section afterwards is found by a token in its environment and killed too.
  token="$$-$name-$RANDOM"
  # OUT is the scratch folder's raw/ for the part: whatever a tool writes under $OUT lands in the archive.
  OUT="$raw" ZINF_GPU_CHECK_TOKEN="$token" timeout --signal=TERM --kill-after="$grace" "$((cap - grace))" \
    "$self" --part "$name" "$raw" $arg > "$raw/$name.log" 2>&1
  rc=$?
  left_behind="$(reap "$token")"
  cat "$raw/$name.log" >> "$log_file"
  case "$rc" in
    0) status=ok ;;
    3) status=incomplete ;;
    124 | 137) status=TIMEOUT ;;
    *) status=FAILED ;;
  esac
  detail="$(grep -v '^[[:space:]]*$' "$raw/$name.log" | tail -1 | tr '\t' ' ' | cut -c1-400)"
  [ "$status" = TIMEOUT ] && detail="stopped at its cap of $cap s; last line: $detail"
  [ -n "$left_behind" ] && detail="$detail $left_behind"
  log "== $name: $status ($((SECONDS - t0)) s) $detail"
  record "$name" "$status" "$((SECONDS - t0))" "$cap" "$detail"
  [ "$status" = ok ] || return 1
}

log "== gpu-check $stage: budget $budget s, $([ "$executor" = 1 ] && echo "on the CPU executor ($bld)" || echo "$bld"); working files in $work"
write_archive
write_results running

# setup: the Debian packages the build needs (not those only the tests and fuzzers need), NCCL
# (optional: without it the CUDA device builds and runs one rank).
if [[ "$parts" == *" build "* ]]; then
  debs="${ZINF_DEBS:-$root/.debs}"
  if "$root/scripts/install-deps.sh" --check build >> "$log_file" 2>&1; then
    log "== deps: the packages the build needs are installed"
  elif ls "$debs"/*.deb > /dev/null 2>&1; then
    if env_lines="$("$root/scripts/use-debs.sh" "$debs" "$root/.deps-root" 2>> "$log_file")"; then
      eval "$env_lines"
      log "== deps: unpacked the packages of $debs into $root/.deps-root"
    else
      log "== deps: FAILED to unpack $debs"
    fi
  else
    log "== deps: installing the build's packages (scripts/install-deps.sh build, at most 120 s)"
    timeout -k 5 120 "$root/scripts/install-deps.sh" build >> "$log_file" 2>&1 || log "== deps: FAILED (see gpu-check.log)"
  fi
fi
if [ "$executor" != 1 ]; then
  nvidia-smi >> "$log_file" 2>&1 || log "== nvidia-smi: not found or failed"
fi
log "== setup: $((SECONDS - start)) s"

for item in $plan; do
  name="${item%%:*}"
  section "$name" "$((${item##*:} * cap_scale))"
  rc=$?
  # The folders of the CUDA libraries the build found outside the loader's own (a wheel's cuDNN,
  # NCCL, NVRTC), for every section after the build.
  if [ "$name" = build ] && [ -f "$bld/cuda-libs.env" ]; then
    # shellcheck disable=SC1091  # written by the configure
    . "$bld/cuda-libs.env"
    log "== libraries: LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
  fi
  if [ "$name" = build ] && [ "$rc" != 0 ] && [[ "$parts" == *" build "* ]]; then
    stopped="the build failed: nothing to run (raw/build.log)"
  elif [ "$name" = gpu ] && [ "$rc" != 0 ]; then
    stopped="$(tail -1 "$raw/gpu.log" | sed 's/^gpu: FAILED, //'): no GPU, no verdict on the CUDA path"
  fi
  if [ -n "$stopped" ]; then
    echo "gpu-check: $stage stopped: $stopped" | tee -a "$log_file" >&2
    break
  fi
done
if [ -s "$raw/compare.jsonl" ] && [ -z "$stopped" ]; then  # the side-by-side table over every case that ran
  OUT="$raw" ZINF_BIN="$zinf" ZINF_COMPARE_APPEND=1 ZINF_COMPARE_CASES=none "$root/scripts/compare-torch.sh" \
    > /dev/null 2>> "$log_file"
fi
rm -rf "$swap"
log "== done in $((SECONDS - start)) s; results in $out_dir: results.json, results.md, gpu-check-tail.log, raw.tar.gz"
write_archive
write_results final
cat "$out_dir/results.md"
# The archive holds the working files now: remove what this stage made in the scratch folder.
rm -rf "$raw"
rm -f "$log_file" "$work/archive.json" "$work"/*.tmp
rmdir "$work" 2> /dev/null
python3 -c 'import json, sys; sys.exit(0 if json.load(open(sys.argv[1]))["ok"] else 1)' "$out_dir/results.json"
