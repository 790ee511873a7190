#!/usr/bin/env bash
# The GPU checks, as one script for a machine with an NVIDIA GPU (finishes in a few minutes on one
# H200; installs the Debian dependencies first on a bare machine). Everything goes to one results
# file (default gpu-check-results.txt, or $1; under $OUT when that is set).
#
# It builds for sm_90/sm_80, runs the `gpu` ctest label (the CUDA device, every GPT op of the CUDA
# backend against the CPU reference, the whole model against the CPU device) and the GPU training
# test (every placement bit-identical on the GPU, close to the CPU), `zinf info`, `zinf bench pcie`,
# and trains configs/gpu-check.json — GPT-2 medium's shape at vocab 256, ~302M parameters, whose
# training state (~4.8 GB) is over 3× its 1.5 GiB GPU budget — with the optimizer states on cpu and
# then on nvme, reporting TFLOPS, the GPU busy fraction and the overlap ratio (`zinf bench step`).
set -uo pipefail
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
run deps "$root/scripts/install-deps.sh"
run build "$root/scripts/build.sh" "$root/build-gpu" -DZINF_CUDA=ON -DZINF_BUILD_BENCH=OFF
run nvidia-smi nvidia-smi
run info "$root/build-gpu/src/zinf" info
run gpu-tests ctest --test-dir "$root/build-gpu" -L gpu --output-on-failure
run gpu-train-tests "$root/build-gpu/tests/train_test" --gtest_filter='TrainGpu.*'
run bench-pcie "$root/build-gpu/src/zinf" bench pcie --size 1G --reps 5 --json
swap="${TMPDIR:-/tmp}/zinf-gpu-check"
mkdir -p "$swap"
run train-optimizer-cpu "$root/build-gpu/src/zinf" bench step --json --steps 6 --config "$root/configs/gpu-check.json"
run train-optimizer-nvme "$root/build-gpu/src/zinf" bench step --json --steps 6 --config "$root/configs/gpu-check.json" \
  --set zero_optimization.offload_optimizer.device=nvme --set "zero_optimization.offload_optimizer.nvme_path=\"$swap\""
rm -rf "$swap"
log "== done; results in $results"
