#!/usr/bin/env bash
# gpu_check_test.sh — scripts/gpu-check.sh's verdicts, with a fake build folder (a fake `zinf info`
# and fake ctest tests; no GPU, no build): a passing stage is ok; with no GPU listed the stage stops
# at once with one line; a skipped GPU test fails the stage; a section that ignores SIGTERM is killed
# at its cap, its children with it, and the stage ends inside its budget; a section with no time left
# is "not run"; a stage killed half way leaves results.json with what finished; the sanitizer
# stand-in refuses arguments compute-sanitizer would not take.
# Usage: tests/scripts/gpu_check_test.sh [REPO_ROOT]   (ctest passes the source directory)
set -uo pipefail
root="${1:-$(cd "$(dirname "$0")/../.." && pwd)}"
tmp="$(mktemp -d)"
trap 'pkill -f "$tmp" 2> /dev/null; rm -rf "$tmp"' EXIT
fake="$tmp/build"
mkdir -p "$fake/src"
# The fake zinf: `info --json` lists one GPU, or none when FAKE_GPUS=0 (as a machine whose driver is
# too old for the runtime answers).
cat > "$fake/src/zinf" << 'FAKE'
#!/usr/bin/env bash
[ "$1 $2" = "info --json" ] || { echo "fake zinf: only info --json" >&2; exit 2; }
if [ "${FAKE_GPUS:-1}" = 0 ]; then
  echo '{"cuda": {"built": true, "status": "no GPU visible (CUDA driver version is insufficient for CUDA runtime version)"}, "gpus": []}'
else
  echo '{"cuda": {"built": true, "status": "1 GPU"}, "gpus": [{"index": 0, "name": "Fake H200", "compute_capability": "9.0"}]}'
fi
FAKE
chmod +x "$fake/src/zinf"
# Fake tests: one gpu-labelled test and one GPU case of another binary. FAKE_SKIP=1 makes the first
# skip as GoogleTest does; FAKE_SLEEP=1 makes it ignore SIGTERM and sleep (a child process whose
# command line names this test's folder, so that the test can look for it afterwards).
cat > "$fake/CTestTestfile.cmake" << EOF
add_test(FakeGpu.Op "/bin/bash" "-c" "if [ -n \"\$ENV{FAKE_SKIP}\" ]; then echo '[  SKIPPED ] FakeGpu.Op'; exit 0; fi; if [ -n \"\$ENV{FAKE_SLEEP}\" ]; then trap '' TERM; bash -c 'trap \"\" TERM; sleep 300; : $tmp' & wait; fi; echo '[       OK ] FakeGpu.Op'")
set_tests_properties(FakeGpu.Op PROPERTIES LABELS gpu SKIP_REGULAR_EXPRESSION "\\\\[  SKIPPED \\\\]")
add_test(TrainGpu.Fake "/bin/true")
set_tests_properties(TrainGpu.Fake PROPERTIES LABELS e2e)
add_test(FakeGpu.WithoutAGpuIsAnError "/bin/bash" "-c" "echo '[  SKIPPED ] FakeGpu.WithoutAGpuIsAnError'")
set_tests_properties(FakeGpu.WithoutAGpuIsAnError PROPERTIES LABELS gpu SKIP_REGULAR_EXPRESSION "\\\\[  SKIPPED \\\\]")
EOF
bad=0
field() {  # a results.json value, by a Python expression on `r`
  python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2" 2> /dev/null
}
expect() {  # name, condition's outcome (0 = holds), message
  if [ "$2" = 0 ]; then echo "ok   $1"; else echo "FAIL $1: $3"; bad=1; fi
}
run() {  # out folder, then env assignments; the stage's exit code in $rc, stdout+stderr in $out
  local o="$1"
  shift
  out="$(env OUT="$o" ZINF_GPU_BUILD="$fake" ZINF_GPU_CHECK_PARTS="gpu tests" ZINF_GPU_CHECK_COMMIT=fake "$@" \
         "$root/scripts/gpu-check.sh" correctness 2>&1)"
  rc=$?
}

run "$tmp/ok"
[ "$rc" = 0 ] && [ "$(field "$tmp/ok/results.json" 'r["ok"], r["complete"], [s["status"] for s in r["sections"]]')" = \
  "(True, True, ['ok', 'ok'])" ]
expect "a passing stage is ok" $? "exit $rc; $(tail -5 <<< "$out")"
grep -q "tests: ok, 2 passed, none skipped" "$tmp/ok/gpu-check.log"
expect "the tests section counts the passes (the no-GPU test is left out)" $? "$(grep 'tests:' "$tmp/ok/gpu-check.log")"

run "$tmp/nogpu" FAKE_GPUS=0
stops="$(grep -c '^gpu-check: correctness stopped: no GPU visible (CUDA driver version is insufficient' <<< "$out")"
[ "$rc" = 1 ] && [ "$stops" = 1 ] &&
  [ "$(field "$tmp/nogpu/results.json" 'r["ok"], [s["name"] for s in r["sections"]], bool(r["stopped"])')" = \
    "(False, ['gpu'], True)" ]
expect "no GPU: the stage stops at once, one line, tests not run" $? "exit $rc; $out"

run "$tmp/skip" FAKE_SKIP=1
[ "$rc" = 1 ] && [ "$(field "$tmp/skip/results.json" '[s["status"] for s in r["sections"]]')" = "['ok', 'FAILED']" ] &&
  grep -q "1 skipped, which a GPU stage counts as failed" "$tmp/skip/raw/tests.log"
expect "a skipped GPU test fails the stage" $? "exit $rc; $(cat "$tmp/skip/raw/tests.log" 2> /dev/null | tail -5)"

t0=$SECONDS
run "$tmp/slow" FAKE_SLEEP=1 ZINF_GPU_CHECK_SECONDS=20 ZINF_GPU_CHECK_PARTS="gpu tests repeat"
wall=$((SECONDS - t0))
[ "$rc" = 1 ] && [ "$wall" -le 21 ] &&
  [ "$(field "$tmp/slow/results.json" '[s["status"] for s in r["sections"]]')" = "['ok', 'TIMEOUT', 'not run']" ]
expect "a section that ignores SIGTERM is killed at its cap; the stage ends inside its budget" $? \
  "exit $rc after $wall s (budget 20); $(tail -6 <<< "$out")"
sleep 1
! pgrep -f "sleep 300; : $tmp" > /dev/null
expect "the killed section's children are gone" $? "$(pgrep -af "sleep 300; : $tmp")"

# Killed half way (as the device tool does at its limit): what finished is in results.json.
OUT="$tmp/cut" ZINF_GPU_BUILD="$fake" ZINF_GPU_CHECK_PARTS="gpu tests" FAKE_SLEEP=1 \
  setsid "$root/scripts/gpu-check.sh" correctness > /dev/null 2>&1 &
pid=$!
for _ in $(seq 100); do
  [ "$(field "$tmp/cut/results.json" 'len(r["sections"])')" = 1 ] && break
  sleep 0.2
done
kill -KILL -- "-$pid" 2> /dev/null
wait "$pid" 2> /dev/null
[ "$(field "$tmp/cut/results.json" 'r["ok"], r["complete"], [(s["name"], s["status"]) for s in r["sections"]]')" = \
  "(False, False, [('gpu', 'ok')])" ]
expect "a stage killed half way leaves results.json with what finished" $? "$(cat "$tmp/cut/results.json" 2> /dev/null)"

"$root/tests/scripts/sanitizer_standin.sh" --tool initcheck --error-exitcode 1 /bin/true > /dev/null 2>&1
[ $? = 2 ]
expect "the sanitizer stand-in refuses a tool the check does not use" $?
"$root/tests/scripts/sanitizer_standin.sh" --tool memcheck --error-exitcode 7 /bin/false > /dev/null 2>&1
[ $? = 7 ]
expect "the sanitizer stand-in fails with the error exit code when the binary fails" $?
exit $bad
