#!/usr/bin/env bash
# The test command (README, .ci/run): install dependencies, build, run the whole suite; then build
# the unit tests with AddressSanitizer + UBSan and run them again. Set ZINF_SKIP_SANITIZE=1 to skip
# the second pass.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh" "$root/build"
ctest --test-dir "$root/build" --output-on-failure -j "$(nproc)"
if [ "${ZINF_SKIP_SANITIZE:-0}" != "1" ]; then
  echo "== sanitizer pass (address,undefined): unit and nvme tests"
  "$root/scripts/build.sh" "$root/build-asan" -DZINF_SANITIZE=address,undefined -DZINF_BUILD_BENCH=OFF
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir "$root/build-asan" --output-on-failure -j "$(nproc)" -L 'unit|nvme'
fi
