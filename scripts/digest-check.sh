#!/usr/bin/env bash
# One params_digest across placements: trains CONFIG under every placement (optimizer none/cpu/nvme ×
# params none/cpu) and both overlap modes, and passes only when every run finished with a digest and
# all digests are the same. A run that fails (non-zero exit, or no `final` line) is a failure of the
# check, never a missing line. Run by scripts/gpu-check.sh; tests/scripts/digest_check_test.sh runs it
# with a fake zinf.
#
# Usage: scripts/digest-check.sh ZINF CONFIG [SWAP_DIR [ARGS...]]   (ARGS: more `zinf train` arguments,
# e.g. --set model.n_layer=12, for every run)
#   ZINF_DIGEST_ROUNDS   rounds over the placements (12 by default) and variants every check makes
#                        (default 1)
#   ZINF_DIGEST_SECONDS  after those, more rounds while this many seconds are not used up (default 0:
#                        none); a run is only started when the slowest run so far still fits
#   ZINF_DIGEST_STEPS    training steps per run (default 3)
#   ZINF_DIGEST_OVERLAPS the overlap modes to run (default "exact none")
#   ZINF_DIGEST_VARIANTS more runs per round, each with the optimizer on the CPU, the parameters on the
#                        device and overlap exact plus its own arguments; variants are separated by `;`
#                        (e.g. "--set activation_checkpointing.cpu_checkpointing=true;--set
#                        zero_optimization.offload_optimizer.speculative=true"): each must give the same
#                        digest as the placements
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
read -r -a overlaps <<< "${ZINF_DIGEST_OVERLAPS:-exact none}"
variants=()
IFS=';' read -r -a variants <<< "${ZINF_DIGEST_VARIANTS:-}"
mkdir -p "$swap"
start=$SECONDS
runs=0 failed=0 slowest=0
declare -A seen=()
placements=()
for opt in none cpu nvme; do
  for param in none cpu; do
    for ov in "${overlaps[@]}"; do placements+=("$opt $param $ov -"); done
  done
done
for v in "${!variants[@]}"; do
  [[ "${variants[$v]}" =~ [^[:space:]] ]] && placements+=("cpu none exact $v")
done
# One training run: prints its line; records its digest or its failure. VARIANT is `-` or an index
# into variants.
one_run() {
  local opt="$1" param="$2" ov="$3" variant="$4" k="$5" budget=1536MiB out rc line digest t0=$SECONDS
  local more=() name="opt=$opt param=$param overlap=$ov"
  [ "$opt" = none ] && budget=16GiB  # nothing offloaded needs a larger budget
  if [ "$variant" != - ]; then
    # shellcheck disable=SC2206  # the variant's arguments, as words
    more=(${variants[$variant]})
    name="$name ${variants[$variant]}"
  fi
  out="$("$zinf" train --config "$config" --set train.steps="$steps" \
    --set zero_optimization.offload_optimizer.device="$opt" --set zero_optimization.offload_param.device="$param" \
    --set train.overlap="$ov" --set device.memory_budget="$budget" \
    --set "zero_optimization.offload_optimizer.nvme_path=\"$swap\"" "${extra[@]}" "${more[@]}" 2>&1)"
  rc=$?
  line="$(grep '^final ' <<< "$out" | tail -1)"
  digest=""
  [[ "$line" == *params_digest=* ]] && digest="${line##*params_digest=}" && digest="${digest%% *}"
  runs=$((runs + 1))
  (( SECONDS - t0 > slowest )) && slowest=$((SECONDS - t0))
  if [ "$rc" -ne 0 ] || [ -z "$digest" ]; then
    failed=$((failed + 1))
    echo "digest $name run=$k: FAILED (exit $rc$([ -z "$digest" ] && echo ', no digest'))"
    tail -3 <<< "$out" | sed 's/^/    /'
    return
  fi
  seen["$digest"]=1
  echo "digest $name run=$k: $digest ($((SECONDS - t0)) s)"
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
    # shellcheck disable=SC2086  # p is four words
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
