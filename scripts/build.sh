#!/usr/bin/env bash
# Configures and builds zinf into a build directory (default: build/, Release).
# Usage: scripts/build.sh [BUILD_DIR] [extra cmake args...]
# ZINF_BUILD_TARGETS="a b" builds only those targets (default: everything).
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
