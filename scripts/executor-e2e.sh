#!/usr/bin/env bash
# `zinf train --device cuda` end to end on the CPU executor build (ZINF_CUDA_EXECUTOR=ON): for each
# kernel set (reference, fast) and precision (fp32, bf16), configs/gpu-check.json's placements
# (optimizer none/cpu/nvme x parameters none/cpu/nvme x both overlap modes)
# under two jitter seeds of the executor's streams and thread orders must give one params_digest;
# and the per-step losses must stay within a stated tolerance of the CPU device's (fp32: the
# reference ops; bf16: the CPU twin of the fast kernels). A shrunken model keeps it to minutes.
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
             ZINF_DIGEST_VARIANTS="$param_nvme" \
             "$root/scripts/digest-check.sh" "$zinf" "$config" "$swap" "${args[@]}")"
      rc=$?
      echo "$out" | sed "s/^/  [$kernels $precision seed $seed $order] /"
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
