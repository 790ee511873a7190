#!/usr/bin/env bash
# The main job (README): install dependencies, build (its progress shows; the first build takes a few
# minutes), then train the tiny GPT on the CPU device with its states offloaded to host memory, on
# the built-in default text. Extra arguments go to `zinf train`, e.g. scripts/run.sh --set train.steps=100
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/install-deps.sh"
echo "== building zinf into $root/build (the first build takes a few minutes; later ones only what changed)"
# Only the binary the run needs: the test binaries are left to scripts/test.sh, which builds them in
# the same directory with the same configuration and so reuses every object compiled here.
ZINF_BUILD_TARGETS=zinf "$root/scripts/build.sh" "$root/build"
# The CUDA libraries' folders outside the loader's own, when the configure found any (cuda-libs.env).
# shellcheck disable=SC1091  # written by the configure
[ -f "$root/build/cuda-libs.env" ] && . "$root/build/cuda-libs.env"
echo "== training: $root/build/src/zinf train --config configs/tiny.json $*"
exec "$root/build/src/zinf" train --config "$root/configs/tiny.json" "$@"
