#!/usr/bin/env bash
# sanitizer_standin.sh — what scripts/gpu-check.sh calls in place of compute-sanitizer when its stage
# runs on the CPU executor (ZINF_GPU_CHECK_EXECUTOR=1): it takes compute-sanitizer's arguments as the
# check passes them (--tool memcheck|racecheck --error-exitcode N BINARY ARGS...), refuses any other
# form, and runs the binary under the executor's lifo thread order (the order that exposes a missing
# barrier). It proves the check's plumbing — the binaries and filters it names, its counting — not
# what the real sanitizer finds: out-of-bounds device accesses and races between blocks are the GPU's.
set -uo pipefail
tool="" code=""
while [ $# -gt 0 ]; do
  case "$1" in
    --tool) tool="$2"; shift 2 ;;
    --error-exitcode) code="$2"; shift 2 ;;
    --*) echo "sanitizer stand-in: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
case "$tool" in memcheck | racecheck) ;; *) echo "sanitizer stand-in: --tool memcheck|racecheck, not '$tool'" >&2; exit 2 ;; esac
[[ "$code" =~ ^[0-9]+$ ]] || { echo "sanitizer stand-in: --error-exitcode N is required" >&2; exit 2; }
[ $# -gt 0 ] && [ -x "$1" ] || { echo "sanitizer stand-in: no binary to run" >&2; exit 2; }
echo "========= sanitizer stand-in ($tool, CPU executor, lifo): $*"
ZINF_CUDAX_ORDER=lifo "$@"
rc=$?
[ "$rc" = 0 ] && { echo "========= ERROR SUMMARY: 0 errors"; exit 0; }
echo "========= the binary exited $rc"
exit "$code"
