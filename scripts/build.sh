#!/usr/bin/env bash
# Configures and builds zinf into a build directory (default: build/, Release).
# Usage: scripts/build.sh [BUILD_DIR] [extra cmake args...]
# ZINF_BUILD_TARGETS="a b" builds only those targets (default: everything).
# When the configure took a CUDA library from outside the loader's own folders (a Python wheel's
# cuDNN, say), it says so at the end: `. BUILD_DIR/cuda-libs.env` sets LD_LIBRARY_PATH for running.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="${1:-$root/build}"
shift || true
gen=()
command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
[ -f "$dir/CMakeCache.txt" ] && gen=()
cmake -S "$root" -B "$dir" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release "$@"
targets=()
for t in ${ZINF_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$dir" -j "$(nproc)" "${targets[@]}"
if grep -q '^export LD_LIBRARY_PATH' "$dir/cuda-libs.env" 2> /dev/null; then
  echo "build.sh: this build's CUDA libraries are not all in the loader's folders; before running it: . $dir/cuda-libs.env"
fi
