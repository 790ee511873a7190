#!/usr/bin/env bash
# `zinf train --device cuda` end to end on the CPU executor build (ZINF_CUDA_EXECUTOR=ON): for each
# kernel set (reference, fast) and precision (fp32, bf16), configs/gpu-check.json's placements
# (optimizer none/cpu/nvme x parameters none/cpu/nvme x both overlap modes) and the variants for
# gradient accumulation (the config's GA is 2) — the layer-major order with the optimizer in host
# memory and on NVMe, with the checkpoints in pinned host memory and the parameters on NVMe, and
# gradient streaming with and without the speculative Update — under two jitter seeds of the
# executor's streams and thread orders must give one params_digest (the config clips every step, so
# the streamed Updates are redone from the NVMe copy of the gradient); without clipping, gradient
# streaming must equal the usual order on NVMe with every speculative Update kept (no rollback); and
# the per-step losses must stay within a stated tolerance of the CPU device's (fp32: the reference
# ops; bf16: the CPU twin of the fast kernels). A shrunken model keeps it to minutes: at this version
# the layer-major and streaming runs add about a quarter to the script's time (both kernel sets).
# Usage: scripts/executor-e2e.sh ZINF   (the executor build's zinf); exits 0 when every check holds.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
zinf="$1"
config="$root/configs/gpu-check.json"
swap="${TMPDIR:-/tmp}/zinf-executor-e2e.$$"
model=(--set model.n_layer=2 --set model.n_head=2 --set model.d_model=64 --set model.seq_len=32
       --set train_micro_batch_size_per_gpu=2 --set steps_per_print=1)
steps=3
fails=0
# Per-step losses of one run ("loss X" of each step line), space separated.
losses() { grep -oE '\| loss [0-9.]+' | awk '{printf "%s ", $3}'; }
# The parameters on NVMe, under every optimizer home and both overlap modes (digest-check.sh's own
# placements keep them on the device or in host memory).
param_nvme=""
for opt in none cpu nvme; do
  for ov in exact none; do
    param_nvme="$param_nvme;--set zero_optimization.offload_optimizer.device=$opt --set train.overlap=$ov"
    param_nvme="$param_nvme --set zero_optimization.offload_param.device=nvme"
    param_nvme="$param_nvme --set zero_optimization.offload_param.nvme_path=\"$swap\""
  done
done
param_nvme="${param_nvme#;}"
# The layer-major order and gradient streaming (both with GA > 1 only; streaming needs the optimizer
# on NVMe, overlap exact and, at GA > 1, the layer-major order). On the CUDA device they own the tied
# head's gradient buffer per micro batch, every micro batch's checkpoint rows (on the device, or in
# pinned host memory) and the ring slots, registered pinned memory written to NVMe with O_DIRECT.
lm="--set zero_optimization.offload_optimizer.layer_major=true"
stream="--set zero_optimization.offload_optimizer.device=nvme $lm"
stream="$stream --set zero_optimization.offload_optimizer.gradient_streaming=true"
ga_variants="$lm;--set zero_optimization.offload_optimizer.device=nvme $lm"
ga_variants="$ga_variants;--set zero_optimization.offload_optimizer.device=nvme $lm"
ga_variants="$ga_variants --set activation_checkpointing.cpu_checkpointing=true"
ga_variants="$ga_variants --set zero_optimization.offload_param.device=nvme"
ga_variants="$ga_variants --set zero_optimization.offload_param.nvme_path=\"$swap\""
ga_variants="$ga_variants;$stream;$stream --set zero_optimization.offload_optimizer.speculative=false"
# Without clipping: gradient streaming against the usual order, both with the optimizer on NVMe.
# Prints the run's digest and its last step's rollbacks ("DIGEST ROLLBACKS"), or nothing if it failed.
unclipped() {
  mkdir -p "$swap"
  "$zinf" train --config "$config" "${args[@]}" --set train.steps=$steps --set gradient_clipping=0 \
    --set zero_optimization.offload_optimizer.device=nvme --set zero_optimization.offload_param.device=none \
    --set train.overlap=exact --set "zero_optimization.offload_optimizer.nvme_path=\"$swap\"" "$@" 2>&1 |
    awk '/\| rollbacks / {r = $NF} /^final .*params_digest=/ {sub(/.*params_digest=/, ""); d = $1}
         END {if (d != "") print d, (r == "" ? "-" : r)}'
}
for kernels in reference fast; do
  for precision in fp32 bf16; do
    prec=(--set bf16.enabled=false)
    tol=2e-3
    if [ "$precision" = bf16 ]; then prec=(--set bf16.enabled=true); tol=3e-2; fi
    args=("${model[@]}" "${prec[@]}" --set device.kernels="$kernels")
    digests=""
    for seed in 1 2; do
      order=fifo
      [ "$seed" = 2 ] && order=lifo
      out="$(ZINF_CUDAX_SEED=$seed ZINF_CUDAX_ORDER=$order ZINF_DIGEST_STEPS=$steps \
             ZINF_DIGEST_VARIANTS="$param_nvme;$ga_variants" \
             "$root/scripts/digest-check.sh" "$zinf" "$config" "$swap" "${args[@]}")"
      rc=$?
      echo "$out" | sed "s/^/  [$kernels $precision seed $seed $order] /"
      read -r usual _ <<< "$(ZINF_CUDAX_SEED=$seed ZINF_CUDAX_ORDER=$order unclipped)"
      # shellcheck disable=SC2086  # the arguments, as words
      read -r kept rollbacks <<< "$(ZINF_CUDAX_SEED=$seed ZINF_CUDAX_ORDER=$order unclipped $stream)"
      tag="executor-e2e: $kernels $precision seed $seed $order: unclipped gradient streaming"
      if [ -n "${usual:-}" ] && [ "${kept:-}" = "$usual" ] && [ "${rollbacks:-}" = 0 ]; then
        echo "$tag: $kept, equal to the usual order, no rollback"
      else
        echo "$tag: FAILED (usual order: ${usual:-none}, streamed: ${kept:-none}, rollbacks ${rollbacks:-none})"
        fails=$((fails + 1))
      fi
      if [ "$rc" -ne 0 ]; then fails=$((fails + 1)); continue; fi
      digests="$digests $(grep -oE 'one digest over [0-9]+ runs: [0-9a-f]+' <<< "$out" | awk '{print $NF}')"
    done
    n=$(tr ' ' '\n' <<< "$digests" | grep -c . || true)
    u=$(tr ' ' '\n' <<< "$digests" | grep . | sort -u | wc -l)
    if [ "$n" -ne 2 ] || [ "$u" -ne 1 ]; then
      echo "executor-e2e: $kernels $precision: the two seeds gave digests:$digests"
      fails=$((fails + 1))
    fi
    # Losses against the CPU device (same kernels key: reference ops or the bf16 twin of the fast ones).
    cuda_l="$("$zinf" train --config "$config" "${args[@]}" --set train.steps=$steps \
              --set zero_optimization.offload_param.device=none 2>&1 | losses)"
    cpu_l="$("$zinf" train --config "$config" "${args[@]}" --set train.steps=$steps --set device.type=cpu \
             --set device.memory_budget=16GiB --set zero_optimization.offload_param.device=none 2>&1 | losses)"
    verdict="$(python3 - "$tol" "$cuda_l" "$cpu_l" <<'PY'
import sys
tol = float(sys.argv[1]); a = [float(x) for x in sys.argv[2].split()]; b = [float(x) for x in sys.argv[3].split()]
if not a or len(a) != len(b):
    print("FAILED: %d CUDA losses, %d CPU losses" % (len(a), len(b))); sys.exit(1)
worst = max(abs(x - y) / max(abs(y), 1e-6) for x, y in zip(a, b))
print("%s: losses %s against the CPU's %s, largest relative difference %.2e (tolerance %g)"
      % ("ok" if worst <= tol else "FAILED", a, b, worst, tol))
sys.exit(0 if worst <= tol else 1)
PY
)"
    rc=$?
    echo "executor-e2e: $kernels $precision: one digest $([ "$u" -eq 1 ] && echo ok || echo FAILED) ($digests ); $verdict"
    [ "$rc" -ne 0 ] && fails=$((fails + 1))
  done
done
# Data parallelism over the executor's NCCL: `mpirun -np 2` with ZeRO stages 1-3 (stage 3 with the
# parameters in host memory) against one rank with gradient accumulation 2, bit for bit.
if command -v mpirun > /dev/null; then
  dp=("${model[@]}" --set train.steps=$steps --set device.comm=nccl --set gradient_accumulation_steps=1
      --set zero_optimization.offload_param.device=none)
  one="$("$zinf" train --config "$config" "${dp[@]}" --set gradient_accumulation_steps=2 --set device.comm=auto 2>&1 |
         grep -oE 'params_digest=[0-9a-f]+')"
  for stage in 1 2 "3 --set zero_optimization.offload_param.device=cpu"; do
    # shellcheck disable=SC2086  # the stage and its extra setting, as words
    two="$(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe --bind-to none -np 2 \
           -x ZINF_CUDAX_DEVICES=2 "$zinf" train --config "$config" "${dp[@]}" --set zero_optimization.stage=$stage 2>&1)"
    d2="$(grep -oE 'params_digest=[0-9a-f]+' <<< "$two")"
    if [ -n "$one" ] && [ "$d2" = "$one" ] && grep -q "device memory: nccl" <<< "$two"; then
      echo "executor-e2e: mpirun -np 2 ZeRO stage ${stage%% *} over nccl: $d2, equal to one rank with GA 2"
    else
      echo "executor-e2e: mpirun -np 2 ZeRO stage ${stage%% *}: FAILED (one rank: ${one:-none}, two ranks: ${d2:-none})"
      tail -3 <<< "$two" | sed 's/^/    /'
      fails=$((fails + 1))
    fi
  done
else
  echo "executor-e2e: mpirun not found: the data-parallel runs need Open MPI (scripts/install-deps.sh)"
  fails=$((fails + 1))
fi
rm -rf "$swap"
[ "$fails" -eq 0 ] && echo "executor-e2e: ok" && exit 0
echo "executor-e2e: FAILED ($fails checks)"
exit 1
