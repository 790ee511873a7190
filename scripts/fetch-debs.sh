#!/usr/bin/env bash
# Downloads (does not install) the Debian packages zinf's build needs besides a compiler, CMake and
# CUDA, with the shared libraries they load, into DIR (default .debs/, git-ignored). For a machine
# that cannot reach a package registry — the lent GPU machine: carry DIR there and
# scripts/use-debs.sh unpacks it into a private prefix (scripts/gpu-check.sh does this by itself
# when DIR is present). Run it where apt works (this machine).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="${1:-$root/.debs}"
pkgs=(nlohmann-json3-dev libcli11-dev libeigen3-dev
      libtbb-dev libtbb12 libtbbmalloc2 libtbbbind-2-5
      libhwloc-dev libhwloc15 libudev1
      liburing-dev liburing2
      libxxhash-dev libxxhash0
      libsentencepiece-dev libsentencepiece0
      libboost-dev libboost1.74-dev
      libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 libutf8proc-dev libutf8proc2
      libgtest-dev libgmock-dev
      pkgconf pkgconf-bin libpkgconf3)
mkdir -p "$dir"
cd "$dir"
if ! apt-get download "${pkgs[@]}" 2>/dev/null; then
  [ "$(id -u)" -eq 0 ] && apt-get update -qq
  apt-get download "${pkgs[@]}"
fi
echo "fetch-debs: $(ls -1 ./*.deb | wc -l) packages, $(du -sh . | cut -f1) in $dir"
