#!/usr/bin/env bash
# The main job (README): install dependencies, build, then show what zinf sees on this machine and
# plan the tiny model's training state. (Training lands with issue 5; this will then train it.)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh" "$root/build" >/dev/null
"$root/build/src/zinf" info --path "${TMPDIR:-/tmp}"
echo
"$root/build/src/zinf" plan --config "$root/configs/tiny.json" "$@"
