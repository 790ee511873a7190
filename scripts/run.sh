#!/usr/bin/env bash
# The main job (README): install dependencies, build, then train the tiny GPT on the CPU device on
# the built-in default text (about a minute on 2 cores). Extra arguments go to `zinf train`,
# e.g. scripts/run.sh --set train.steps=100
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh" "$root/build" >/dev/null
exec "$root/build/src/zinf" train --config "$root/configs/tiny.json" "$@"
