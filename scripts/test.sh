#!/usr/bin/env bash
# The test command (README, docs/testing.md). Usage: scripts/test.sh [--full]
#
# scripts/test.sh: install dependencies (and, from PyPI, the independent checkers some tests compare
# against: scripts/install-checkers.sh; all but what the configure looks for arrive while the build
# runs), build build-test/ — a test build: the CUDA sources for one architecture (sm_90) and no
# micro benches — and run the whole suite there; then build the CUDA
# device on the CPU executor (build-executor/, tests/cuda_executor; with ccache, which install-deps.sh
# installs, every object the two trees share is compiled once), run every GPU test there under two
# thread orders, none skipped, train end to end on it (scripts/executor-e2e.sh) and run the three
# stages of the GPU check on it (scripts/gpu-check.sh, small shapes, each section once). It ends with
# the time it took.
#
# scripts/test.sh --full (what CI runs, .ci/run): all of that first, timed as above; then build-test/
# is reconfigured to the shipped configuration (sm_90 and sm_80, the micro benches) and built, which
# compiles only the CUDA sources again and the benches, so CI compiles every architecture it ships;
# then the unit and nvme tests are built with AddressSanitizer + UBSan and run again, in an executor
# build that also runs every GPU test and GPU case there, once (the executor poisons what lies past
# each device buffer and a freed cached block, so a kernel or copy out of bounds is reported, as
# compute-sanitizer's memcheck would on a GPU); the `async` tests (the ordering contract on the asynchronous, jittered CPU device) are built
# with ThreadSanitizer and run, with the CUDA kernels' tests on the CPU executor; last, the parsers'
# libFuzzer targets are built with clang and each run briefly (scripts/fuzz.sh). Each step prints the
# time since the start.
#
# ZINF_SKIP_EXECUTOR=1 skips the executor pass; with --full, ZINF_SKIP_SANITIZE=1 skips both
# sanitizer passes, ZINF_SKIP_TSAN=1 the thread one, ZINF_SKIP_FUZZ=1 the fuzzing.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
full=0
for a in "$@"; do
  case "$a" in
    --full) full=1 ;;
    *) echo "test.sh: unknown argument '$a' (usage: scripts/test.sh [--full])" >&2; exit 2 ;;
  esac
done
stamp() { printf '%dm%02ds' $((SECONDS / 60)) $((SECONDS % 60)); }
# Every GPU test of an executor build (the gpu and executor labels, then the GPU cases of other
# binaries) under one thread order; none may skip but the tests about a machine without a GPU.
# Usage: executor_gpu_tests BUILD_DIR ORDER; a failed test ends the script (pipefail).
executor_gpu_tests() {
  local build="$1" order="$2" log="$1/ctest-$2.log" skipped
  local cases
  cases="$("$root/scripts/gpu-check.sh" --cases)|$("$root/scripts/gpu-check.sh" --executor-cases)"
  ZINF_CUDAX_ORDER=$order ctest --test-dir "$build" --output-on-failure -j "$(nproc)" -L 'gpu|executor' 2>&1 | tee "$log"
  ZINF_CUDAX_ORDER=$order ctest --test-dir "$build" --output-on-failure -j "$(nproc)" -R "$cases" 2>&1 | tee -a "$log"
  skipped=$(grep -E '\*\*\*Skipped' "$log" | grep -vE 'WithoutAGpu' || true)
  if [ -n "$skipped" ]; then echo "test.sh: GPU tests skipped on the executor ($build, $order):" >&2; echo "$skipped" >&2; exit 1; fi
}
rel="$root/build-test"
# What the test build's configure looks for first; the rest of the packages and the independent
# checkers (a few GB from PyPI on a fresh machine: torch) arrive while it compiles, and the suite
# waits for them. Their output follows the build's.
"$root/scripts/install-deps.sh" test-build
mkdir -p "$rel"
( "$root/scripts/install-deps.sh" all && "$root/scripts/install-checkers.sh" ) > "$rel/install.log" 2>&1 &
installing=$!
# A test build: one CUDA architecture (each one more compiles every .cu file again) and no micro
# benches (run by hand, never by a test), in its own folder so build/ keeps the shipped configuration.
echo "== [$(stamp)] the test build (build-test/: sm_90, no micro benches) and the whole suite"
if ! "$root/scripts/build.sh" "$rel" -DZINF_CUDA_ARCHS=90 -DZINF_BUILD_BENCH=OFF; then
  wait "$installing" || true
  exit 1
fi
if ! wait "$installing"; then
  cat "$rel/install.log"
  echo "test.sh: installing the test packages or the checkers failed (above)" >&2
  exit 1
fi
cat "$rel/install.log"
echo "== [$(stamp)] packages and checkers in place; the suite"
ctest --test-dir "$rel" --output-on-failure -j "$(nproc)"
if [ "${ZINF_SKIP_EXECUTOR:-0}" != "1" ]; then
  echo "== [$(stamp)] the CUDA path on the CPU executor: every GPU test under the fifo and lifo thread orders"
  # The CUDA device's own sources built as C++ on the executor (tests/cuda_executor), with the tests
  # that hold GPU cases; none of them may skip, except the ones about a machine without a GPU.
  # The GPU check's own lists: the targets its stages build, the GPU cases in binaries not labelled gpu.
  exe_targets="executor_test cublas_fake_test nccl_fake_test cudnn_fake_test $("$root/scripts/gpu-check.sh" --targets)"
  # cuDNN found as the GPU machine's image has it, in a Python wheel: the executor's CUDA headers are
  # the toolkit's without cuDNN's, cuDNN's come from a tree laid out like nvidia-cudnn-cu13 (the
  # toolkit's files linked in), and the configure looks in wheels only. The ASan pass's executor
  # build below takes cuDNN from beside the toolkit, so both ways are built.
  wheels="$root/build-executor/fake-wheels"
  "$root/tests/scripts/fake_cuda_wheels.sh" "$wheels"
  PYTHONPATH="$wheels/site${PYTHONPATH:+:$PYTHONPATH}" ZINF_BUILD_TARGETS="$exe_targets" "$root/scripts/build.sh" \
    "$root/build-executor" -DZINF_CUDA_EXECUTOR=ON -DZINF_BUILD_BENCH=OFF -DZINF_CUDA_INCLUDE="$wheels/cuda-include" \
    -DZINF_CUDA_LIBS_FROM=wheel -DZINF_CUDNN=ON -UZINF_CUDNN_INCLUDE
  if ! grep -qx 'ZINF_CUDNN_FROM:INTERNAL=wheel' "$root/build-executor/CMakeCache.txt"; then
    echo "test.sh: the executor build did not take cuDNN from the wheel-shaped tree ($wheels)" >&2
    exit 1
  fi
  for order in fifo lifo; do executor_gpu_tests "$root/build-executor" "$order"; done
  "$root/scripts/executor-e2e.sh" "$root/build-executor/src/zinf"
  echo "== [$(stamp)] the GPU check's three stages on the executor (small shapes, no timing verdicts): its sections, caps and output files"
  # first-contact runs whole; the later stages leave out the sections an earlier one ran (the same
  # code at the same small shapes), but each builds and queries the GPU, so every section runs once.
  ran=""
  for stage in $("$root/scripts/gpu-check.sh" --stages); do
    parts=""
    for part in $("$root/scripts/gpu-check.sh" --sections "$stage"); do
      case " $ran " in *" $part "*) [ "$part" = build ] || [ "$part" = gpu ] || continue ;; esac
      parts="$parts $part"
    done
    ran="$ran $parts"
    ZINF_GPU_CHECK_EXECUTOR=1 ZINF_GPU_BUILD="$root/build-executor" ZINF_GPU_CHECK_SECONDS=900 ZINF_GPU_CHECK_PARTS="$parts" \
      OUT="$root/build-executor/gpu-check/$stage" "$root/scripts/gpu-check.sh" "$stage"
  done
fi
echo "== [$(stamp)] scripts/test.sh: passed"
if [ "$full" = 1 ]; then
  echo "== [$(stamp)] the shipped configuration (sm_90 and sm_80, the micro benches): build-test/ reconfigured and built"
  # CMakeLists.txt's defaults; only the CUDA objects and the benches are compiled again. The suite
  # above ran on the same C++ objects; the sm_80 code is compiled here, not run (no GPU in CI).
  "$root/scripts/build.sh" "$rel" -UZINF_CUDA_ARCHS -UZINF_BUILD_BENCH
fi
if [ "$full" = 1 ] && [ "${ZINF_SKIP_SANITIZE:-0}" != "1" ]; then
  echo "== [$(stamp)] sanitizer pass (address,undefined): unit and nvme tests, and the GPU tests on the executor"
  # Build only what this pass runs: the test binaries labelled unit or nvme (read from their
  # registrations, so a new test is picked up), without benches, and the executor pass's targets:
  # the CUDA device on the CPU executor, whose device memory is host memory ASan watches.
  asan_targets=$(awk 'match($0, /zinf_test\(([A-Za-z0-9_]+) +LABEL +(unit|nvme)[ )]/) {
                        split(substr($0, RSTART + 10), a, " "); print a[1] }' "$root/tests/CMakeLists.txt")
  [ -n "$asan_targets" ] || { echo "test.sh: no unit or nvme test found in tests/CMakeLists.txt" >&2; exit 1; }
  asan_targets="$asan_targets executor_test cublas_fake_test nccl_fake_test cudnn_fake_test $("$root/scripts/gpu-check.sh" --targets)"
  ZINF_BUILD_TARGETS="$asan_targets" "$root/scripts/build.sh" "$root/build-asan" \
    -DZINF_SANITIZE=address,undefined -DZINF_BUILD_BENCH=OFF -DZINF_CUDA_EXECUTOR=ON
  export ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1
  ctest --test-dir "$root/build-asan" --output-on-failure -j "$(nproc)" -L 'unit|nvme'
  executor_gpu_tests "$root/build-asan" random
  unset ASAN_OPTIONS UBSAN_OPTIONS
fi
if [ "$full" = 1 ] && [ "${ZINF_SKIP_SANITIZE:-0}" != "1" ] && [ "${ZINF_SKIP_TSAN:-0}" != "1" ]; then
  echo "== [$(stamp)] sanitizer pass (thread): the async label, one jitter seed per configuration; the CUDA kernels' tests on the executor"
  tsan_targets=$(awk 'match($0, /zinf_test\(([A-Za-z0-9_]+) +LABEL +async[ )]/) {
                        split(substr($0, RSTART + 10), a, " "); print a[1] }' "$root/tests/CMakeLists.txt")
  [ -n "$tsan_targets" ] || { echo "test.sh: no async test found in tests/CMakeLists.txt" >&2; exit 1; }
  # The CUDA device on the CPU executor (its kernels' shared-memory races are reported by line); the
  # async tests run on the CPU device as before.
  ZINF_BUILD_TARGETS="$tsan_targets executor_test cuda_rows_test flash_attention_test" "$root/scripts/build.sh" \
    "$root/build-tsan" -DZINF_SANITIZE=thread -DZINF_BUILD_BENCH=OFF -DZINF_CUDA_EXECUTOR=ON
  TSAN_OPTIONS="suppressions=$root/scripts/tsan.supp halt_on_error=1" ZINF_ASYNC_SEEDS=1 \
    ctest --test-dir "$root/build-tsan" --output-on-failure -j "$(nproc)" -L async
  TSAN_OPTIONS="suppressions=$root/scripts/tsan.supp halt_on_error=1" ZINF_CUDAX_ORDER=random \
    ctest --test-dir "$root/build-tsan" --output-on-failure -j "$(nproc)" \
      -R '^(Executor|ExecutorTsan|DeviceGuard|Runtime)\.|^CudaRows\.(Elementwise|Convert|Rope|Embeddings|CrossEntropy|EmptyShapes)|^FlashAttention\.Refuses'
fi
if [ "$full" = 1 ] && [ "${ZINF_SKIP_FUZZ:-0}" != "1" ]; then
  echo "== [$(stamp)] fuzzing (libFuzzer, address,undefined): each parser from its seed corpus for ${ZINF_FUZZ_SECONDS:-15}s"
  "$root/scripts/fuzz.sh" "$root/build-fuzz"
fi
[ "$full" = 1 ] && echo "== [$(stamp)] scripts/test.sh --full: passed"
exit 0
