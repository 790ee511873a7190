#!/usr/bin/env bash
# install_deps_test.sh — scripts/install-deps.sh's three package sets and its behaviour without
# network, with fake dpkg-query and apt-get on PATH (nothing is installed or fetched): an unknown
# argument is a usage error; with nothing installed, `--check build` names what building needs and
# none of what only the tests and fuzzers need (clang, MPI, Benchmark, venv), `--check test-build`
# adds MPI and ccache only, `--check` names them all;
# where Debian's archive cannot be reached, an install says so in one line and exits 1 without
# calling apt-get install.
# Usage: tests/scripts/install_deps_test.sh [REPO_ROOT]   (ctest passes the source directory)
set -uo pipefail
root="${1:-$(cd "$(dirname "$0")/../.." && pwd)}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bin"
printf '#!/bin/sh\nexit 1\n' > "$tmp/bin/dpkg-query"  # nothing is installed
# apt-get records its calls; its update fails, as without network.
printf '#!/bin/sh\necho "$*" >> "%s/apt-calls"\n[ "$1" = update ] && exit 100\nexit 0\n' "$tmp" > "$tmp/bin/apt-get"
chmod +x "$tmp/bin/dpkg-query" "$tmp/bin/apt-get"
touch "$tmp/apt-calls"
bad=0
expect() {  # name, condition's outcome (0 = holds), message
  if [ "$2" = 0 ]; then echo "ok   $1"; else echo "FAIL $1: $3"; bad=1; fi
}
out="$("$root/scripts/install-deps.sh" bogus 2>&1)"
[ $? = 2 ] && [[ "$out" == *"unknown argument 'bogus'"* ]]
expect "an unknown argument is a usage error" $? "$out"

out="$(PATH="$tmp/bin:$PATH" "$root/scripts/install-deps.sh" --check build 2>&1)"
rc=$?
[ "$rc" = 1 ] && [[ "$out" == *"missing (build)"*cmake*liburing-dev* ]] &&
  ! grep -qE 'clang-14|openmpi|libbenchmark|python3-venv' <<< "$out"
expect "--check build names what building needs, nothing the tests alone need" $? "exit $rc: $out"

out="$(PATH="$tmp/bin:$PATH" "$root/scripts/install-deps.sh" --check test-build 2>&1)"
rc=$?
[ "$rc" = 1 ] && [[ "$out" == *"missing (test-build)"*cmake*libopenmpi-dev*ccache* ]] &&
  ! grep -qE 'clang-14|libbenchmark|python3-venv' <<< "$out"
expect "--check test-build adds what the test build's configure looks for (MPI, ccache), not the rest" $? "exit $rc: $out"

out="$(PATH="$tmp/bin:$PATH" "$root/scripts/install-deps.sh" --check 2>&1)"
rc=$?
[ "$rc" = 1 ] && [[ "$out" == *"missing (all)"*cmake*clang-14*libclang-rt-14-dev* ]]
expect "--check names both sets" $? "exit $rc: $out"

out="$(PATH="$tmp/bin:$PATH" "$root/scripts/install-deps.sh" build 2>&1)"
rc=$?
[ "$rc" = 1 ] && [[ "$out" == *"cannot reach Debian's archive"* ]] && ! grep -q '^install' "$tmp/apt-calls"
expect "no network: one line and exit 1, no apt-get install" $? "exit $rc: $out; apt-get calls: $(cat "$tmp/apt-calls")"
exit $bad
