#!/usr/bin/env bash
# The include direction of the tree (docs/layout.md): a file may include its own layer's headers and
# those of the layers its row allows, never one above it. Layers, bottom up, and what each may include:
#   1 include/zinf          the vocabulary and the seams (types, errors, the device, the communicator,
#                           pinned memory), header-only                                  1
#   2 cpu_adam/, nvme/      the leaves (never each other)                                1, 2
#   3 offload/              the offload engine                                           1–3
#   4 src/model/            the model families and the op seam: beside the engine, not on it   1, 4
#   5 src/io/               model I/O                                                    1, 2, 4, 5
#   6 src/backends/         the device backends (cpu/, cuda/, mpi/), their factory, machine facts, the
#                           job's ranks                                                  1–4, 6
#   7 src/app/, bench/      the application: config, plan, training loop, checkpoints; what `zinf bench` measures   1–7
#   8 src/app/cli/          the command line                                             everything
# Implementation files are held to the same table: a .cpp or .cu file implements its own header (its
# first include when that has the file's name: world.cpp, "zinf/backends/world.h") in its own layer, so that a layer's
# declarations never link to code above it (a header at layer 1 whose functions were defined in
# src/backends would let every layer call into layer 6).
# Prints every include that points up, and every file that implements a header of another layer,
# and exits 1 if there is one. Run by ctest (include_layers).
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
# The layers a layer may include (the table above; its own, too).
allowed() {
  case "$1" in
    1) echo " 1 " ;;
    2) echo " 1 2 " ;;
    3) echo " 1 2 3 " ;;
    4) echo " 1 4 " ;;
    5) echo " 1 2 4 5 " ;;
    6) echo " 1 2 3 4 6 " ;;
    7) echo " 1 2 3 4 5 6 7 " ;;
    *) echo " 1 2 3 4 5 6 7 8 " ;;
  esac
}
bad=0
while IFS= read -r f; do
  from=$(layer_of_file "$f")
  [ "$from" = 0 ] && continue
  first=1
  while IFS= read -r inc; do
    to=$(layer_of_include "$inc")
    if [ "$to" -gt "$from" ]; then
      echo "$f includes \"$inc\": layer $to above its own layer $from"
      bad=1
    elif [ "$to" != 0 ] && [[ "$(allowed "$from")" != *" $to "* ]]; then
      echo "$f includes \"$inc\": layer $from may include layers$(allowed "$from")only"
      bad=1
    fi
    case "$f:$inc" in  # the two leaves never include each other
      cpu_adam/*:zinf/nvme/* | nvme/*:zinf/cpu_adam/*)
        echo "$f includes \"$inc\": cpu_adam/ and nvme/ never include each other"
        bad=1
        ;;
    esac
    [ "$first" = 1 ] || continue
    first=0
    case "$f" in
      *.cpp | *.cu)  # its own header: the first include, of the same name
        own="$(basename "${f%.*}")"
        case "$(basename "$inc")" in
          "$own.h" | "$own.cuh")
            if [ "$to" != 0 ] && [ "$to" != "$from" ]; then
              echo "$f implements \"$inc\" of layer $to in layer $from"
              bad=1
            fi
            ;;
        esac
        ;;
    esac
  done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f")
done < <(git ls-files -- include cpu_adam nvme offload src bench | grep -E '\.(h|hpp|cpp|cu|cuh)$')
if [ "$bad" = 0 ]; then echo "include direction: every include is one its layer may make; every file implements its own layer's header"; fi
exit "$bad"
