#!/usr/bin/env bash
# Installs the Debian packages zinf builds and tests with. Idempotent: packages already present are
# skipped, and apt is not touched at all when nothing is missing. Needs root (or sudo) only then.
# --check: install nothing; exit 0 when every package is present, 1 (naming the missing) otherwise.
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config git
      nlohmann-json3-dev libcli11-dev libtbb-dev libhwloc-dev liburing-dev libeigen3-dev
      libgtest-dev libgmock-dev libbenchmark-dev libxxhash-dev libsentencepiece-dev
      libboost-dev  # header-only: CRC-32C for TensorBoard event files (boost/crc.hpp)
      libpcre2-dev libutf8proc-dev  # tokenizer.json: split patterns, NFC
      libopenmpi-dev openmpi-bin
      python3-venv  # scripts/install-checkers.sh: the independent checkers some tests compare against
      clang-14 libclang-rt-14-dev)  # the libFuzzer targets (scripts/fuzz.sh): clang and its fuzzer runtime
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#pkgs[@]} packages present"
  exit 0
fi
if [ "${1:-}" = "--check" ]; then  # report only: exit 1 when something is missing
  echo "install-deps: missing ${missing[*]}"
  exit 1
fi
echo "install-deps: installing ${missing[*]}"
sudo_cmd=""
[ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo_cmd apt-get update -qq
$sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
