#!/usr/bin/env bash
# The include direction of the tree (docs/design.md, "Module layers and include direction"): a file
# may include its own layer's headers and those of the layers below it, never one above. Layers,
# bottom up:
#   1 include/zinf          the vocabulary (types, errors, the device, the communicator, pinned memory)
#   2 cpu_adam/, nvme/      the leaves
#   3 offload/              the offload engine
#   4 src/model/            the model families and the op seam
#   5 src/io/               model I/O
#   6 src/backends/         the device backends (cpu/, cuda/, mpi/) and their factory
#   7 src/app/, bench/      the application: config, plan, training loop, checkpoints; what `zinf bench` measures
#   8 src/app/cli/          the command line
# Prints every include that points up and exits 1 if there is one. Run by ctest (include_layers).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
layer_of_file() {
  case "$1" in
    include/zinf/*) echo 1 ;;
    cpu_adam/* | nvme/*) echo 2 ;;
    offload/*) echo 3 ;;
    src/model/*) echo 4 ;;
    src/io/*) echo 5 ;;
    src/backends/*) echo 6 ;;
    src/app/cli/*) echo 8 ;;
    src/app/* | bench/*) echo 7 ;;
    *) echo 0 ;;
  esac
}
layer_of_include() {
  case "$1" in
    zinf/cpu_adam/* | zinf/nvme/*) echo 2 ;;
    zinf/offload/*) echo 3 ;;
    zinf/backends/*) echo 6 ;;
    zinf/*) echo 1 ;;
    model/*) echo 4 ;;
    io/*) echo 5 ;;
    cpu/* | cuda/* | mpi/*) echo 6 ;;
    app/* | bench/*) echo 7 ;;
    *) echo 0 ;;  # a file beside the includer: its own layer
  esac
}
bad=0
while IFS= read -r f; do
  from=$(layer_of_file "$f")
  [ "$from" = 0 ] && continue
  while IFS= read -r inc; do
    to=$(layer_of_include "$inc")
    if [ "$to" -gt "$from" ]; then
      echo "$f includes \"$inc\": layer $to above its own layer $from"
      bad=1
    fi
  done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f")
done < <(git ls-files -- include cpu_adam nvme offload src bench | grep -E '\.(h|hpp|cpp|cu|cuh)$')
if [ "$bad" = 0 ]; then echo "include direction: no include points up the layers"; fi
exit "$bad"
