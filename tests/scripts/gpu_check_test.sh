#!/usr/bin/env bash
# gpu_check_test.sh — scripts/gpu-check.sh's verdicts, with a fake build folder (a fake `zinf info`
# and fake ctest tests; no GPU, no build): a passing stage is ok; with no GPU listed the stage stops
# at once with one line; a skipped GPU test fails the stage; a section that ignores SIGTERM is killed
# at its cap, its children with it, and the stage ends inside its budget; a section with no time left
# is "not run"; a stage killed half way leaves results.json with what finished; after a stage, whole
# or killed half way, $OUT holds at most its four files, and raw.tar.gz unpacks to the sections' logs
# (cut down to its size limit, said in results.json); the attention section fails when cuDNN refused
# a check shape or the wmma kernel ran one; racecheck passes its kernel filter, and the sanitizer
# stand-in refuses arguments compute-sanitizer would not take.
# Usage: tests/scripts/gpu_check_test.sh [REPO_ROOT]   (ctest passes the source directory)
set -uo pipefail
root="${1:-$(cd "$(dirname "$0")/../.." && pwd)}"
tmp="$(mktemp -d)"
trap 'pkill -f "$tmp" 2> /dev/null; rm -rf "$tmp"' EXIT
# The stages' scratch folders too (a stage killed half way leaves its own behind).
export TMPDIR="$tmp"
fake="$tmp/build"
mkdir -p "$fake/src"
# The fake zinf: `info --json` lists one GPU, or none when FAKE_GPUS=0 (as a machine whose driver is
# too old for the runtime answers); its cuDNN is 9.19.0, or none with FAKE_CUDNN=0.
cat > "$fake/src/zinf" << 'FAKE'
#!/usr/bin/env bash
[ "$1 $2" = "info --json" ] || { echo "fake zinf: only info --json" >&2; exit 2; }
if [ "${FAKE_GPUS:-1}" = 0 ]; then
  echo '{"cuda": {"built": true, "status": "no GPU visible (CUDA driver version is insufficient for CUDA runtime version)"}, "gpus": []}'
else
  cudnn='"9.19.0"'
  [ "${FAKE_CUDNN:-1}" = 0 ] && cudnn=null
  echo '{"cuda": {"built": true, "status": "1 GPU", "cudnn": '"$cudnn"'}, "gpus": [{"index": 0, "name": "Fake H200", "compute_capability": "9.0"}]}'
fi
FAKE
chmod +x "$fake/src/zinf"
# The fake attention test: one attention-check line per shape of ZINF_ATTENTION_CHECK_SHAPES; with
# FAKE_ATTN=wmma its backward is the wmma kernel's, with FAKE_ATTN=refused it also says cuDNN refused,
# with FAKE_ATTN_BIG=N it prints N bytes that do not compress. Under a sanitizer, FAKE_ENV_LOG gets
# the shapes it was given.
mkdir -p "$fake/tests"
cat > "$fake/tests/flash_attention_test" << 'FAKE'
#!/usr/bin/env bash
[ -n "${FAKE_ENV_LOG:-}" ] && echo "shapes=${ZINF_ATTENTION_CHECK_SHAPES:-}" >> "$FAKE_ENV_LOG"
[ -n "${FAKE_ATTN_BIG:-}" ] && head -c "$FAKE_ATTN_BIG" /dev/urandom | base64
bwd=cudnn
[ "${FAKE_ATTN:-}" = wmma ] && bwd=wmma
[ "${FAKE_ATTN:-}" = refused ] && echo "zinf: cuDNN refused the attention backward at B 2 T 40 (fake); this shape's backward runs the wmma kernel's"
IFS=';' read -r -a shapes <<< "${ZINF_ATTENTION_CHECK_SHAPES:-2,40,5,5,64}"
for sh in "${shapes[@]}"; do
  IFS=, read -r b t h kv d w <<< "$sh"
  echo "attention-check: B $b T $t H $h KV $kv D $d W ${w:-0} bf16: fwd=cudnn bwd=$bwd; cudnn vs wmma worst/bound out 0.1 dq 0.2"
done
echo '[       OK ] FlashAttention.CudnnAgainstWmmaAndTwinAtCheckShapes'
FAKE
chmod +x "$fake/tests/flash_attention_test"
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
unpacked() {  # OUT folder: raw.tar.gz unpacked into OUT.unpacked (an empty folder when there is none)
  rm -rf "$1.unpacked"
  mkdir -p "$1.unpacked"
  tar -xzf "$1/raw.tar.gz" -C "$1.unpacked" 2> /dev/null
  echo "$1.unpacked"
}
only_outputs() {  # OUT folder: holds at most the stage's four files, raw.tar.gz among them, and nothing else
  local n
  n="$(find "$1" -mindepth 1 | wc -l)"
  [ "$n" -le 4 ] && [ -f "$1/raw.tar.gz" ] &&
    [ -z "$(find "$1" -mindepth 1 ! -name results.json ! -name results.md ! -name gpu-check-tail.log ! -name raw.tar.gz)" ]
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
u="$(unpacked "$tmp/ok")"
grep -q "tests: ok, 2 passed, none skipped" "$u/gpu-check.log"
expect "the tests section counts the passes (the no-GPU test is left out)" $? "$(grep 'tests:' "$u/gpu-check.log")"
only_outputs "$tmp/ok" && [ -s "$u/raw/gpu.log" ] && [ -s "$u/raw/tests.log" ] && [ -s "$u/raw/tests-ctest.log" ] &&
  grep -q '== tests: ok' "$tmp/ok/gpu-check-tail.log"
expect "a stage leaves its four files in \$OUT; raw.tar.gz unpacks to the sections' logs and the full log" $? \
  "$(find "$tmp/ok" "$u" | sort)"

run "$tmp/nogpu" FAKE_GPUS=0
stops="$(grep -c '^gpu-check: correctness stopped: no GPU visible (CUDA driver version is insufficient' <<< "$out")"
[ "$rc" = 1 ] && [ "$stops" = 1 ] &&
  [ "$(field "$tmp/nogpu/results.json" 'r["ok"], [s["name"] for s in r["sections"]], bool(r["stopped"])')" = \
    "(False, ['gpu'], True)" ]
expect "no GPU: the stage stops at once, one line, tests not run" $? "exit $rc; $out"

run "$tmp/skip" FAKE_SKIP=1
u="$(unpacked "$tmp/skip")"
[ "$rc" = 1 ] && [ "$(field "$tmp/skip/results.json" '[s["status"] for s in r["sections"]]')" = "['ok', 'FAILED']" ] &&
  grep -q "1 skipped, which a GPU stage counts as failed" "$u/raw/tests.log"
expect "a skipped GPU test fails the stage" $? "exit $rc; $(tail -5 "$u/raw/tests.log" 2> /dev/null)"

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
u="$(unpacked "$tmp/cut")"
only_outputs "$tmp/cut" && grep -q '^gpu: ok, Fake H200' "$u/raw/gpu.log" && grep -q '== gpu: ok' "$u/gpu-check.log"
expect "killed half way: \$OUT holds its four files at most, raw.tar.gz with the finished section's log" $? \
  "$(find "$tmp/cut" "$u" | sort)"

# A build with no gpu-labelled test (say, configured without CUDA) fails the tests section.
nogputests="$tmp/build-nogpu-tests"
mkdir -p "$nogputests/src"
cp "$fake/src/zinf" "$nogputests/src/zinf"
grep -v 'FakeGpu' "$fake/CTestTestfile.cmake" > "$nogputests/CTestTestfile.cmake"
run "$tmp/nogputests" ZINF_GPU_BUILD="$nogputests"
[ "$rc" = 1 ] && [ "$(field "$tmp/nogputests/results.json" '[s["status"] for s in r["sections"]]')" = "['ok', 'FAILED']" ]
expect "no test labelled gpu in the build: the tests section fails" $? "exit $rc; $(tail -5 <<< "$out")"

# The attention section: cuDNN must take every check shape, both directions.
attention() {  # out folder, then env assignments: runs gpu and attention
  out="$(env OUT="$1" ZINF_GPU_BUILD="$fake" ZINF_GPU_CHECK_PARTS="gpu attention" ZINF_GPU_CHECK_COMMIT=fake "${@:2}" \
         "$root/scripts/gpu-check.sh" correctness 2>&1)"
  rc=$?
}
attention "$tmp/att-ok"
[ "$rc" = 0 ] && [ "$(field "$tmp/att-ok/results.json" '[s["status"] for s in r["sections"]]')" = "['ok', 'ok']" ] &&
  field "$tmp/att-ok/results.json" 'r["sections"][1]["detail"]' |
    grep -q 'B4 T1024 H25 KV25 D64 W0: fwd=cudnn bwd=cudnn; B1 T4096 H32 KV8 D128 W0: fwd=cudnn bwd=cudnn; B1 T1024 H8 KV2 D128 W256: fwd=cudnn bwd=cudnn'
expect "attention: cuDNN at every check shape passes, every attention-check line in the verdict" $? \
  "exit $rc; $(field "$tmp/att-ok/results.json" 'r["sections"]')"
for kind in wmma refused; do
  attention "$tmp/att-$kind" FAKE_ATTN=$kind
  [ "$rc" = 1 ] && [ "$(field "$tmp/att-$kind/results.json" '[s["status"] for s in r["sections"]]')" = "['ok', 'FAILED']" ]
  expect "attention: a fake test whose cuDNN $kind fails the section" $? \
    "exit $rc; $(field "$tmp/att-$kind/results.json" 'r["sections"]')"
done

# A build without cuDNN: the attention section fails with one line, and the tests section leaves the
# tests that need cuDNN out (the fake one fails when run) and passes, saying so.
cat >> "$fake/CTestTestfile.cmake" << EOF
add_test(FakeGpu.CudnnCase "/bin/bash" "-c" "[ \"\$ENV{FAKE_CUDNN}\" != 0 ]")
set_tests_properties(FakeGpu.CudnnCase PROPERTIES LABELS gpu)
EOF
out="$(env OUT="$tmp/nocudnn" ZINF_GPU_BUILD="$fake" ZINF_GPU_CHECK_PARTS="gpu tests attention" ZINF_GPU_CHECK_COMMIT=fake \
       FAKE_CUDNN=0 "$root/scripts/gpu-check.sh" correctness 2>&1)"
rc=$?
[ "$rc" = 1 ] && [ "$(field "$tmp/nocudnn/results.json" '[s["status"] for s in r["sections"]]')" = "['ok', 'ok', 'FAILED']" ] &&
  field "$tmp/nocudnn/results.json" 'r["sections"][1]["detail"]' | grep -q "cuDNN's tests left out: this zinf was built without cuDNN" &&
  [ "$(field "$tmp/nocudnn/results.json" 'r["sections"][2]["detail"]')" = \
    "attention: FAILED, this zinf was built without cuDNN (the configure looked beside the toolkit, in the system and in python3's NVIDIA wheels: raw/build.log)" ]
expect "no cuDNN: only the attention section fails, with one line; cuDNN's tests are left out" $? \
  "exit $rc; $(field "$tmp/nocudnn/results.json" 'r["sections"]')"

# Past its size limit the archive cuts its biggest logs to their ends, and results.json says so.
attention "$tmp/big" FAKE_ATTN_BIG=3000000 ZINF_GPU_CHECK_ARCHIVE_MAX=400000
u="$(unpacked "$tmp/big")"
[ "$rc" = 0 ] && [ "$(stat -c %s "$tmp/big/raw.tar.gz")" -le 400000 ] && [ -s "$u/raw/gpu.log" ] &&
  [ "$(field "$tmp/big/results.json" '"raw/attention-test.log" in r["archive"]["cut"] and r["archive"]["bytes"] <= 400000')" = True ] &&
  tail -1 "$u/raw/attention-test.log" | grep -q 'OK \] FlashAttention'
expect "an archive over its limit is cut down to it, its logs' ends kept, and results.json names what was cut" $? \
  "exit $rc; $(stat -c %s "$tmp/big/raw.tar.gz"); $(field "$tmp/big/results.json" 'r["archive"]')"

# racecheck: zinf's kernels only (the stand-in echoes the filter), one small cuDNN shape.
out="$(env OUT="$tmp/race" ZINF_GPU_BUILD="$fake" ZINF_GPU_CHECK_EXECUTOR=1 ZINF_GPU_CHECK_PARTS="gpu racecheck" \
       ZINF_SANITIZE_TESTS="flash_attention_test:*" FAKE_ENV_LOG="$tmp/race-env" ZINF_GPU_CHECK_COMMIT=fake \
       "$root/scripts/gpu-check.sh" correctness 2>&1)"
rc=$?
u="$(unpacked "$tmp/race")"
[ "$rc" = 0 ] && grep -q 'kernels kns=zinf' "$u/raw/racecheck-flash_attention_test.log" &&
  [ "$(cat "$tmp/race-env" 2> /dev/null)" = "shapes=1,128,2,2,64,48" ]
expect "racecheck checks zinf's kernels only; the sanitizers run cuDNN at one small shape" $? \
  "exit $rc; $(cat "$tmp/race-env" 2> /dev/null); $(cat "$u/raw/racecheck.log" 2> /dev/null)"

"$root/tests/scripts/sanitizer_standin.sh" --tool initcheck --error-exitcode 1 /bin/true > /dev/null 2>&1
[ $? = 2 ]
expect "the sanitizer stand-in refuses a tool the check does not use" $?
"$root/tests/scripts/sanitizer_standin.sh" --tool memcheck --error-exitcode 7 /bin/false > /dev/null 2>&1
[ $? = 7 ]
expect "the sanitizer stand-in fails with the error exit code when the binary fails" $?
"$root/tests/scripts/sanitizer_standin.sh" --tool racecheck --kernel-name zinf --error-exitcode 1 /bin/true > /dev/null 2>&1
[ $? = 2 ]
expect "the sanitizer stand-in refuses a kernel filter without its key" $?
exit $bad
