#!/usr/bin/env bash
# One params_digest across placements: trains CONFIG under every placement (optimizer none/cpu/nvme ×
# params none/cpu) and both overlap modes, and passes only when every run finished with a digest and
# all digests are the same. A run that fails (non-zero exit, or no `final` line) is a failure of the
# check, never a missing line. Run by scripts/gpu-check.sh; tests/scripts/digest_check_test.sh runs it
# with a fake zinf.
#
# Usage: scripts/digest-check.sh ZINF CONFIG [SWAP_DIR [ARGS...]]   (ARGS: more `zinf train` arguments,
# e.g. --set model.n_layer=12, for every run)
#   ZINF_DIGEST_ROUNDS   rounds over the 12 placements every check makes (default 1)
#   ZINF_DIGEST_SECONDS  after those, more rounds while this many seconds are not used up (default 0:
#                        none); a run is only started when the slowest run so far still fits
#   ZINF_DIGEST_STEPS    training steps per run (default 3)
# Prints one line per run and a verdict line starting "digests: ok" or "digests: FAILED"; exits 0 or 1.
set -uo pipefail
zinf="$1"
config="$2"
swap="${3:-${TMPDIR:-/tmp}/zinf-digest-check}"
shift "$(($# < 3 ? $# : 3))"
extra=("$@")
rounds="${ZINF_DIGEST_ROUNDS:-1}"
limit="${ZINF_DIGEST_SECONDS:-0}"
steps="${ZINF_DIGEST_STEPS:-3}"
mkdir -p "$swap"
start=$SECONDS
runs=0 failed=0 slowest=0
declare -A seen=()
placements=()
for opt in none cpu nvme; do
  for param in none cpu; do
    for ov in exact none; do placements+=("$opt $param $ov"); done
  done
done
# One training run: prints its line; records its digest or its failure.
one_run() {
  local opt="$1" param="$2" ov="$3" k="$4" budget=1536MiB out rc line digest t0=$SECONDS
  [ "$opt" = none ] && budget=16GiB  # nothing offloaded needs a larger budget
  out="$("$zinf" train --config "$config" --set train.steps="$steps" \
    --set zero_optimization.offload_optimizer.device="$opt" --set zero_optimization.offload_param.device="$param" \
    --set train.overlap="$ov" --set device.memory_budget="$budget" \
    --set "zero_optimization.offload_optimizer.nvme_path=\"$swap\"" "${extra[@]}" 2>&1)"
  rc=$?
  line="$(grep '^final ' <<< "$out" | tail -1)"
  digest=""
  [[ "$line" == *params_digest=* ]] && digest="${line##*params_digest=}" && digest="${digest%% *}"
  runs=$((runs + 1))
  (( SECONDS - t0 > slowest )) && slowest=$((SECONDS - t0))
  if [ "$rc" -ne 0 ] || [ -z "$digest" ]; then
    failed=$((failed + 1))
    echo "digest opt=$opt param=$param overlap=$ov run=$k: FAILED (exit $rc$([ -z "$digest" ] && echo ', no digest'))"
    tail -3 <<< "$out" | sed 's/^/    /'
    return
  fi
  seen["$digest"]=1
  echo "digest opt=$opt param=$param overlap=$ov run=$k: $digest ($((SECONDS - t0)) s)"
}
k=0
while :; do
  k=$((k + 1))
  if [ "$k" -gt "$rounds" ]; then  # an extra round: only while the time allows
    [ "$limit" -gt 0 ] || break
  fi
  stop=""
  for p in "${placements[@]}"; do
    if [ "$k" -gt "$rounds" ] && [ $((SECONDS - start + slowest)) -gt "$limit" ]; then stop=1; break; fi
    # shellcheck disable=SC2086  # p is three words
    one_run $p "$k"
  done
  [ -n "$stop" ] && break
done
rm -rf "$swap"
n=${#seen[@]}
if [ "$failed" -eq 0 ] && [ "$n" -eq 1 ]; then
  echo "digests: ok, one digest over $runs runs: ${!seen[*]}"
  exit 0
fi
echo "digests: FAILED, $failed of $runs runs failed, $n different digests among the rest"
exit 1
