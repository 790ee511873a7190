#!/usr/bin/env bash
# The GPU checks, as one script for a machine with an NVIDIA GPU (finishes in a few minutes on one
# H200; on a bare machine it installs the Debian dependencies first, or — where no package registry
# is reachable, as on the lent GPU machine — unpacks the .debs/ folder that scripts/fetch-debs.sh
# filled on a machine with apt and the caller carried along). Everything goes to one results file
# (default gpu-check-results.txt, or $1; under $OUT when that is set).
#
# It builds for sm_90/sm_80, runs the `gpu` ctest label (the CUDA device, every GPT op of the CUDA
# backend against the CPU reference, the whole model against the CPU device) and the GPU training
# test (every placement bit-identical on the GPU, close to the CPU), `zinf info`, `zinf bench pcie`,
# and trains configs/gpu-check.json — GPT-2 medium's shape at vocab 256, ~302M parameters, whose
# training state (~4.8 GB) is over 3× its 1.5 GiB GPU budget — with the optimizer states on cpu and
# then on nvme, reporting TFLOPS, the GPU busy fraction and the overlap ratio (`zinf bench step`).
#
# Ordering (results must not change run to run): TrainGpu.* repeated $ZINF_GPU_REPEAT times (default
# 20); configs/gpu-check.json trained for 3 steps $ZINF_GPU_RUNS times (default 3) under every
# placement (optimizer none/cpu/nvme × params none/cpu) and both overlap modes — one params_digest
# for all of them is the pass condition ("digests: one digest" in the results); and the same model's
# per-step losses on the CPU device against the GPU's, within a relative 2e-2 (bf16 on both; the
# devices round differently, so close, not bitwise).
#
# ZINF_GPU_CHECK_PARTS picks parts (default all but compare): build tests bench digests losses
# compare — e.g. one call with "build tests bench" and a second with "digests losses" (the build is
# reused), so that each fits a 10-minute call on a lent machine. `compare` runs
# scripts/compare-torch.sh (zinf beside the PyTorch peer, bench/torch_gpt2.py; it needs torch importable).
set -uo pipefail
parts=" ${ZINF_GPU_CHECK_PARTS:-build tests bench digests losses} "
want() { [[ "$parts" == *" $1 "* ]]; }
root="$(cd "$(dirname "$0")/.." && pwd)"
out_dir="${OUT:-$root}"
results="${1:-$out_dir/gpu-check-results.txt}"
: > "$results"
log() { echo "$*" | tee -a "$results"; }
run() {  # a named step: its output goes to the results file; failures are recorded, not fatal
  local name="$1"; shift
  log "== $name: $*"
  local t0=$SECONDS
  if "$@" >> "$results" 2>&1; then log "== $name: ok ($((SECONDS - t0)) s)"; else log "== $name: FAILED ($((SECONDS - t0)) s)"; fi
}
# Dependencies: the Debian packages if installed; else, on a machine that reaches no package registry
# (the lent GPU machine), the .deb files scripts/fetch-debs.sh downloaded elsewhere and the caller
# carried in as .debs/ (or $ZINF_DEBS), unpacked into a private prefix; else apt (install-deps.sh).
debs="${ZINF_DEBS:-$root/.debs}"
if "$root/scripts/install-deps.sh" --check >> "$results" 2>&1; then
  log "== deps: Debian packages installed"
elif ls "$debs"/*.deb >/dev/null 2>&1; then
  if env_lines="$("$root/scripts/use-debs.sh" "$debs" "$root/.deps-root" 2>>"$results")"; then
    eval "$env_lines"
    log "== deps: unpacked $(ls "$debs"/*.deb | wc -l) packages from $debs into $root/.deps-root"
  else
    log "== deps: FAILED to unpack $debs"
  fi
else
  run deps "$root/scripts/install-deps.sh"
fi
# NCCL: in the CUDA toolkit here; on an image whose NCCL came with a Python wheel, point CMake at it.
cmake_extra=()
nvcc_bin="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
cuda_root="$(dirname "$(dirname "$nvcc_bin")")"
have_nccl=""
for pat in "$cuda_root/lib64/libnccl.so*" "$cuda_root/lib/libnccl.so*" "/usr/lib/x86_64-linux-gnu/libnccl.so*"; do
  compgen -G "$pat" >/dev/null && have_nccl=1
done
if [ -z "$have_nccl" ]; then
  nccl_dir="$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null || true)"
  nccl_lib="$(ls "$nccl_dir"/lib/libnccl.so* 2>/dev/null | head -1)"
  if [ -n "$nccl_lib" ] && [ -f "$nccl_dir/include/nccl.h" ]; then
    cmake_extra+=(-DZINF_NCCL_LIBRARY="$nccl_lib" -DZINF_NCCL_INCLUDE="$nccl_dir/include")
    export LD_LIBRARY_PATH="$nccl_dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    log "== nccl: $nccl_lib (Python wheel)"
  else
    log "== nccl: not found beside nvcc ($cuda_root) nor as a Python wheel; the build will say so"
  fi
fi
# Warnings stay warnings here: the lent machine's compiler may not be Debian 12's GCC.
want build && run build "$root/scripts/build.sh" "$root/build-gpu" -DZINF_CUDA=ON -DZINF_BUILD_BENCH=OFF -DZINF_WERROR=OFF "${cmake_extra[@]}"
run nvidia-smi nvidia-smi
if want tests; then
run info "$root/build-gpu/src/zinf" info
run gpu-tests ctest --test-dir "$root/build-gpu" -L gpu --output-on-failure
run gpu-train-tests "$root/build-gpu/tests/train_test" --gtest_filter='TrainGpu.*'
run gpu-train-tests-repeat "$root/build-gpu/tests/train_test" --gtest_filter='TrainGpu.*' --gtest_repeat="${ZINF_GPU_REPEAT:-20}"
fi
swap="${TMPDIR:-/tmp}/zinf-gpu-check"
mkdir -p "$swap"
if want bench; then
run bench-pcie "$root/build-gpu/src/zinf" bench pcie --size 1G --reps 5 --json
run train-optimizer-cpu "$root/build-gpu/src/zinf" bench step --json --steps 6 --config "$root/configs/gpu-check.json"
run train-optimizer-nvme "$root/build-gpu/src/zinf" bench step --json --steps 6 --config "$root/configs/gpu-check.json" \
  --set zero_optimization.offload_optimizer.device=nvme --set "zero_optimization.offload_optimizer.nvme_path=\"$swap\""
fi
# One digest across placements, overlap modes and repeated runs. Nothing offloaded needs a larger budget.
if want digests; then
digests="$out_dir/gpu-digests.txt"
: > "$digests"
for opt in none cpu nvme; do
  for param in none cpu; do
    budget=1536MiB
    [ "$opt" = none ] && budget=16GiB
    for ov in exact none; do
      for k in $(seq 1 "${ZINF_GPU_RUNS:-3}"); do
        line="$("$root/build-gpu/src/zinf" train --config "$root/configs/gpu-check.json" --set train.steps=3 \
          --set zero_optimization.offload_optimizer.device=$opt --set zero_optimization.offload_param.device=$param \
          --set train.overlap=$ov --set device.memory_budget=$budget \
          --set "zero_optimization.offload_optimizer.nvme_path=\"$swap\"" 2>>"$results" | grep '^final ')"
        log "digest opt=$opt param=$param overlap=$ov run=$k: $line"
        echo "${line##*params_digest=}" >> "$digests"
      done
    done
  done
done
n="$(sort -u "$digests" | grep -c .)"
if [ "$n" = 1 ]; then log "== digests: one digest over $(wc -l < "$digests") runs: $(head -1 "$digests")"
else log "== digests: FAILED, $n different digests over $(wc -l < "$digests") runs"; fi
fi
rm -rf "$swap"
# The GPU against the CPU device at this scale: per-step losses from the metrics files.
if want losses; then
for dev in cuda cpu; do
  run "losses-$dev" "$root/build-gpu/src/zinf" train --config "$root/configs/gpu-check.json" --set train.steps=3 \
    --set device.type=$dev --set device.memory_budget=16GiB --set "train.metrics_file=\"$out_dir/gpu-check-losses-$dev.jsonl\""
done
run losses-compare python3 - "$out_dir/gpu-check-losses-cuda.jsonl" "$out_dir/gpu-check-losses-cpu.jsonl" <<'PY'
import json, sys
def losses(p):
    return [r["loss"] for r in map(json.loads, open(p)) if "loss" in r]
g, c = losses(sys.argv[1]), losses(sys.argv[2])
assert len(g) == len(c) > 0, (g, c)
worst = max(abs(a - b) / abs(b) for a, b in zip(g, c))
print("per-step loss gpu", g, "cpu", c, "max rel diff %.3g (tolerance 2e-2)" % worst)
sys.exit(0 if worst <= 2e-2 else 1)
PY
fi
if want compare; then
  ZINF_BIN="$root/build-gpu/src/zinf" run compare "$root/scripts/compare-torch.sh"
fi
log "== done; results in $results"
