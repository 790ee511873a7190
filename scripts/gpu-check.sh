#!/usr/bin/env bash
# The GPU checks, as one script for a machine with an NVIDIA GPU (finishes in a few minutes on one
# H200; installs the Debian dependencies first on a bare machine). Everything goes to one results
# file (default gpu-check-results.txt, or $1; under $OUT when that is set).
#
# Covered today (issue 8, in progress): the build for sm_90/sm_80, the `gpu` ctest label — the CUDA
# device (budgeted caching allocator, role streams, events, copies), every GPT op of the CUDA
# backend against the CPU reference, the whole model's loss and gradients against the CPU device,
# `zinf bench pcie` — plus `zinf info`. Not yet: training through the offload engine on the CUDA
# device (the engine still touches device memory from the host; see the README's status).
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
run bench-pcie "$root/build-gpu/src/zinf" bench pcie --size 1G --reps 5
run bench-pcie-json "$root/build-gpu/src/zinf" bench pcie --size 1G --reps 5 --json
log "== done; results in $results"
