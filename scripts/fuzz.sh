#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz: the run config, safetensors, a Hugging Face config.json
# and index, llm.c token files, checkpoint manifests, chat JSONL, tokenizer.json files, chat templates) with clang, ASan and UBSan in their own build
# directory (default build-fuzz/; no CUDA, no tests, no benches: only the parsers and what they
# call), then runs each from its seed corpus for a short while. A finding fails the script; its
# reproducer is saved under <build>/fuzz-artifacts/ and named, with its bytes in base64, in the output.
# Reproduce one with: <build>/tests/fuzz/<name>_fuzz <reproducer file>
# ZINF_FUZZ_SECONDS: seconds per target (default 15). ZINF_FUZZ_TARGETS: which (default all).
# Usage: scripts/fuzz.sh [BUILD_DIR]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="${1:-$root/build-fuzz}"
secs="${ZINF_FUZZ_SECONDS:-15}"
targets="${ZINF_FUZZ_TARGETS:-config safetensors hf_config hf_index token_file checkpoint instruct tokenizer_json jinja}"
cxx="$(command -v clang++-14 || command -v clang++ || true)"
cc="$(command -v clang-14 || command -v clang || true)"
if [ -z "$cxx" ] || [ -z "$cc" ]; then
  echo "fuzz: clang is not installed (scripts/install-deps.sh installs clang-14 and libclang-rt-14-dev)" >&2
  exit 1
fi
args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_C_COMPILER="$cc" -DZINF_FUZZ=ON
      -DZINF_CUDA=OFF -DZINF_MPI=OFF -DZINF_BUILD_TESTS=OFF -DZINF_BUILD_BENCH=OFF)
command -v ccache >/dev/null 2>&1 && args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
gen=()
command -v ninja >/dev/null 2>&1 && [ ! -f "$dir/CMakeCache.txt" ] && gen=(-G Ninja)
cmake -S "$root" -B "$dir" "${gen[@]}" "${args[@]}" >/dev/null
build=()
for t in $targets; do build+=(--target "${t}_fuzz"); done
cmake --build "$dir" -j "$(nproc)" "${build[@]}"

artifacts="$dir/fuzz-artifacts"
rm -rf "$artifacts"  # this run's findings only
mkdir -p "$artifacts"
failed=()
for t in $targets; do
  work="$dir/fuzz-corpus/$t"  # new inputs go here; the seeds in the repository stay as they are
  mkdir -p "$work"
  echo "== fuzz $t: ${secs}s"
  if ! ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
      "$dir/tests/fuzz/${t}_fuzz" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -dict="$root/tests/fuzz/fuzz.dict" -artifact_prefix="$artifacts/$t-" "$work" "$root/tests/fuzz/corpus/$t" \
      >"$dir/fuzz-$t.log" 2>&1; then
    tail -n 60 "$dir/fuzz-$t.log"
    failed+=("$t")
  else
    grep -E '^stat::number_of_executed_units|^Done' "$dir/fuzz-$t.log" | tr '\n' ' '
    echo
  fi
done
if [ ${#failed[@]} -ne 0 ]; then
  for f in "$artifacts"/*; do
    [ -f "$f" ] || continue
    echo "fuzz: reproducer $f ($(stat -c %s "$f") bytes), base64:"
    base64 -w 100 "$f" | head -c 20000
    echo
  done
  echo "fuzz: FAILED: ${failed[*]} (reproduce: $dir/tests/fuzz/<name>_fuzz <reproducer>)" >&2
  exit 1
fi
echo "fuzz: all targets ran ${secs}s each without a finding"
