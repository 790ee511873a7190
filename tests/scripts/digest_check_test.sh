#!/usr/bin/env bash
# digest_check_test.sh — scripts/digest-check.sh's verdict, with a fake zinf (no GPU, no training):
# every run with one digest passes; one failed run (non-zero exit, no `final` line) fails the check
# and is counted as a failure, not skipped; a run that prints no digest and two different digests fail;
# the overlap modes and the variants choose the runs, and a variant that changes the digest fails.
# Usage: tests/scripts/digest_check_test.sh [REPO_ROOT]   (ctest passes the source directory)
set -uo pipefail
root="${1:-$(cd "$(dirname "$0")/../.." && pwd)}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# The fake: counts its calls; call FAIL_AT exits 1 without a final line, call EMPTY_AT prints a final
# line without a digest, call OTHER_AT prints another digest.
cat > "$tmp/zinf" <<'FAKE'
#!/usr/bin/env bash
n=$(( $(cat "$COUNTER" 2>/dev/null || echo 0) + 1 ))
echo "$n" > "$COUNTER"
echo "step 1 loss 5.5"
[ -n "${FAIL_ALL:-}" ] && exit 1
[ "$n" = "${FAIL_AT:-0}" ] && { echo "error: device memory budget exceeded" >&2; exit 1; }
[ "$n" = "${EMPTY_AT:-0}" ] && { echo "final step=3 loss=5.1"; exit 0; }
[ "$n" = "${OTHER_AT:-0}" ] && { echo "final step=3 loss=5.1 params_digest=feedbeef"; exit 0; }
for a in "$@"; do [ -n "${OTHER_ARG:-}" ] && [ "$a" = "$OTHER_ARG" ] && { echo "final step=3 params_digest=feedbeef"; exit 0; }; done
echo "final step=3 loss=5.1 params_digest=0123abcd"
FAKE
chmod +x "$tmp/zinf"
bad=0
check() {  # name, expected exit, expected text, then env assignments
  local name="$1" want_rc="$2" want="$3"; shift 3
  rm -f "$tmp/counter"
  out="$(env COUNTER="$tmp/counter" "$@" "$root/scripts/digest-check.sh" "$tmp/zinf" /dev/null "$tmp/swap")"
  rc=$?
  if [ "$rc" != "$want_rc" ] || [[ "$out" != *"$want"* ]]; then
    echo "FAIL $name: exit $rc (want $want_rc), output:"; echo "$out"; bad=1
  else
    echo "ok   $name: $(tail -1 <<< "$out")"
  fi
}
check "all agree" 0 "digests: ok, one digest over 12 runs: 0123abcd"
check "one run fails" 1 "digests: FAILED, 1 of 12 runs failed, 1 different digests" FAIL_AT=3
check "failed run is listed" 1 "run=1: FAILED (exit 1, no digest)" FAIL_AT=7
check "final line without digest" 1 "digests: FAILED, 1 of 12 runs failed" EMPTY_AT=12
check "two digests" 1 "digests: FAILED, 0 of 12 runs failed, 2 different digests" OTHER_AT=5
check "two rounds" 0 "one digest over 24 runs" ZINF_DIGEST_ROUNDS=2
check "every run fails" 1 "digests: FAILED, 12 of 12 runs failed, 0 different digests" FAIL_ALL=1
check "one overlap mode" 0 "one digest over 6 runs: 0123abcd" ZINF_DIGEST_OVERLAPS=exact
check "variants add runs" 0 "one digest over 14 runs" "ZINF_DIGEST_VARIANTS=--set a.b=1;--set c.d=true --set e=2"
check "a variant's own arguments" 1 "digests: FAILED, 0 of 8 runs failed, 2 different digests" \
  ZINF_DIGEST_OVERLAPS=exact "ZINF_DIGEST_VARIANTS=--set a.b=1;--set c.d=true --set e=2" OTHER_ARG=c.d=true
check "a failed variant is named" 1 "overlap=exact --set a.b=1 run=1: FAILED" ZINF_DIGEST_VARIANTS="--set a.b=1" FAIL_AT=13
exit $bad
