#!/usr/bin/env bash
# The main job (README): install dependencies, build (its progress shows; the first build takes a few
# minutes), then train the tiny GPT on the CPU device with its states offloaded to host memory, on
# the built-in default text. Extra arguments go to `zinf train`, e.g. scripts/run.sh --set train.steps=100
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/install-deps.sh"
echo "== building zinf into $root/build (the first build takes a few minutes; later ones only what changed)"
"$root/scripts/build.sh" "$root/build"
echo "== training: $root/build/src/zinf train --config configs/tiny.json $*"
exec "$root/build/src/zinf" train --config "$root/configs/tiny.json" "$@"
