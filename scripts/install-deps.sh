#!/usr/bin/env bash
# Installs the Debian packages zinf builds and tests with. Idempotent: packages already present are
# skipped, and apt is not touched at all when nothing is missing. Needs root (or sudo) only then.
#
# Usage: scripts/install-deps.sh [--check] [build|test-build|all]
#   build       what building zinf and its tests needs (the GPU check's stages need no more)
#   test-build  that, plus what the test build's configure looks for: Open MPI (the data-parallel
#               tests, mpirun) and ccache (CMake uses it where it is found)
#   all         (default) that, plus what the rest of the test commands need: Google Benchmark,
#               python3-venv for the independent checkers, clang-14 and its libFuzzer runtime for the
#               fuzz step
#   --check  install nothing; exit 0 when every package of the set is present, 1 naming the missing
# A machine that cannot reach Debian's archive (apt-get update fails or takes over a minute) gets
# one line saying so and exit 1, not a hung apt-get: carry the packages there instead
# (scripts/fetch-debs.sh, scripts/use-debs.sh).
set -euo pipefail
build_pkgs=(build-essential cmake ninja-build pkg-config git
            nlohmann-json3-dev libcli11-dev libtbb-dev libhwloc-dev liburing-dev libeigen3-dev
            libgtest-dev libgmock-dev libxxhash-dev libsentencepiece-dev
            libboost-dev  # header-only: CRC-32C for TensorBoard event files (boost/crc.hpp)
            libpcre2-dev libutf8proc-dev)  # tokenizer.json: split patterns, NFC
# What the test build's configure looks for besides (the test command installs these before it
# builds, the rest while it builds).
test_build_pkgs=(libopenmpi-dev openmpi-bin  # MPI: data parallelism and its tests (mpirun)
                 ccache)  # the test command's two trees (test build, executor build) share most objects: compiled once
test_pkgs=(libbenchmark-dev
           python3-venv  # scripts/install-checkers.sh: the independent checkers some tests compare against
           clang-14 libclang-rt-14-dev)  # the libFuzzer targets (scripts/fuzz.sh): clang and its fuzzer runtime
check=0
set_name=all
for a in "$@"; do
  case "$a" in
    --check) check=1 ;;
    build | test-build | all) set_name="$a" ;;
    *) echo "install-deps: unknown argument '$a' (usage: install-deps.sh [--check] [build|test-build|all])" >&2; exit 2 ;;
  esac
done
pkgs=("${build_pkgs[@]}")
[ "$set_name" = build ] || pkgs+=("${test_build_pkgs[@]}")
[ "$set_name" = all ] && pkgs+=("${test_pkgs[@]}")
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#pkgs[@]} packages ($set_name) present"
  exit 0
fi
if [ "$check" = 1 ]; then  # report only: exit 1 when something is missing
  echo "install-deps: missing ($set_name) ${missing[*]}"
  exit 1
fi
echo "install-deps: installing ${missing[*]}"
sudo_cmd=""
[ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
export DEBIAN_FRONTEND=noninteractive
if ! timeout -k 5 60 $sudo_cmd apt-get update -qq --error-on=any -o Acquire::Retries=0; then
  echo "install-deps: cannot reach Debian's archive (apt-get update failed or took over 60 s); missing: ${missing[*]}" >&2
  echo "install-deps: on a machine without network, carry the packages: scripts/fetch-debs.sh, then scripts/use-debs.sh" >&2
  exit 1
fi
$sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
