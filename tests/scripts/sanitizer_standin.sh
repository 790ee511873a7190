#!/usr/bin/env bash
# sanitizer_standin.sh — what scripts/gpu-check.sh calls in place of compute-sanitizer when its stage
# runs on the CPU executor (ZINF_GPU_CHECK_EXECUTOR=1): it takes compute-sanitizer's arguments as the
# check passes them (--tool memcheck|racecheck [--kernel-name|--kernel-regex kns=S|kne=S]
# --error-exitcode N BINARY ARGS...; --help lists them), refuses any other form, and runs the binary
# under the executor's lifo thread order (the order that exposes a missing barrier). It proves the
# check's plumbing — the binaries, filters and options it passes, its counting — not what the real
# sanitizer finds: out-of-bounds device accesses and races between blocks are the GPU's. A kernel
# filter is checked for its form and echoed, not applied: the executor runs every kernel alike.
set -uo pipefail
usage="usage: sanitizer_standin.sh --tool memcheck|racecheck [--kernel-name kns=S|kne=S] --error-exitcode N BINARY [ARGS...]
  --kernel-name, --kernel-regex   which kernels the tool checks (a name substring, kns=, or a whole name, kne=)"
tool="" code="" kernels=""
while [ $# -gt 0 ]; do
  case "$1" in
    --help) echo "$usage"; exit 0 ;;
    --tool) tool="$2"; shift 2 ;;
    --error-exitcode) code="$2"; shift 2 ;;
    --kernel-name | --kernel-regex)
      [[ "${2:-}" =~ ^(kns|kne|kernel_substring|kernel_name)=[^,]+$ ]] ||
        { echo "sanitizer stand-in: $1 takes kns=SUBSTRING or kne=NAME, not '${2:-}'" >&2; exit 2; }
      kernels="$kernels${kernels:+ }$2"
      shift 2 ;;
    --*) echo "sanitizer stand-in: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
case "$tool" in memcheck | racecheck) ;; *) echo "sanitizer stand-in: --tool memcheck|racecheck, not '$tool'" >&2; exit 2 ;; esac
[[ "$code" =~ ^[0-9]+$ ]] || { echo "sanitizer stand-in: --error-exitcode N is required" >&2; exit 2; }
[ $# -gt 0 ] && [ -x "$1" ] || { echo "sanitizer stand-in: no binary to run" >&2; exit 2; }
echo "========= sanitizer stand-in ($tool, CPU executor, lifo${kernels:+; kernels $kernels}): $*"
ZINF_CUDAX_ORDER=lifo "$@"
rc=$?
[ "$rc" = 0 ] && { echo "========= ERROR SUMMARY: 0 errors"; exit 0; }
echo "========= the binary exited $rc"
exit "$code"
