#!/usr/bin/env bash
# Trains the same runs under each optimizer-state mode (zero_optimization.optimizer_states: fp32,
# bf16, 8bit) and prints a Markdown table of their losses against fp32's — the evidence behind the
# compressed modes (docs/numerics.md, "Compressed optimizer states").
#
# Usage: scripts/states-evidence.sh [ZINF] [CASES]
#   ZINF   the zinf binary (default build/src/zinf)
#   CASES  any of "tiny gpt2 llama" (default all three):
#     tiny   configs/tiny.json as it is: 300 steps, optimizer in host memory
#     gpt2   GPT-2 124M's shape on the default data, 200 steps, micro batch 1, seq 64, fp16,
#            optimizer in host memory
#     llama  a Llama-family model (4 layers, d 256, GQA 8/2 heads) pretrained 300 steps in fp32,
#            written as a Hugging Face folder by `zinf export --format hf`, then fine-tuned from that
#            folder for 150 steps in bf16 with ZeRO-3, optimizer and parameters in host memory
# Every run is seeded; the same command gives the same table. Work files go to a temporary folder.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
zinf="$(realpath "${1:-$root/build/src/zinf}")"
cases="${2:-tiny gpt2 llama}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
modes=(fp32 bf16 8bit)

# run NAME MODE CONFIG [--set ...]: trains in $work/NAME-MODE, metrics in metrics.jsonl
run() {
  local name="$1" mode="$2" cfg="$3"
  shift 3
  local dir="$work/$name-$mode"
  mkdir -p "$dir"
  (cd "$dir" && "$zinf" train --config "$cfg" --set zero_optimization.optimizer_states=\""$mode"\" \
     --set train.metrics_file=\"metrics.jsonl\" "$@" >log.txt 2>&1) || {
    echo "states-evidence: $name ($mode) failed:" >&2
    tail -5 "$dir/log.txt" >&2
    exit 1
  }
}

# summary FILE: "train_last20 val_last max_abs_dev_later" — mean train loss of the last 20 steps and the
# last validation loss.
summary() {
  python3 - "$1" <<'EOF'
import json, sys
tr, va = [], []
for line in open(sys.argv[1]):
    j = json.loads(line)
    if "val_loss" in j: va.append(j["val_loss"])
    elif "loss" in j: tr.append(j["loss"])
print(f"{sum(tr[-20:]) / len(tr[-20:]):.4f} {va[-1] if va else float('nan'):.4f} {len(tr)}")
EOF
}

# curve_dev A B: the largest |loss difference| over the steps of two runs, and the steps compared.
curve_dev() {
  python3 - "$1" "$2" <<'EOF'
import json, sys
def losses(p):
    return [j["loss"] for j in map(json.loads, open(p)) if "loss" in j and "val_loss" not in j]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
print(f"{max(abs(x - y) for x, y in zip(a, b)):.4f}")
EOF
}

table_rows=()
for c in $cases; do
  case "$c" in
    tiny)
      for m in "${modes[@]}"; do run tiny "$m" "$root/configs/tiny.json"; done ;;
    gpt2)
      for m in "${modes[@]}"; do
        run gpt2 "$m" "$root/configs/gpt2-124m-cpu.json" --set train.steps=200 --set train_batch_size=1 \
          --set train_micro_batch_size_per_gpu=1 --set model.seq_len=64 --set train.eval_interval=50 \
          --set train.eval_batches=8 --set train.seed=1234 --set scheduler.params.warmup_num_steps=20 \
          --set scheduler.params.total_num_steps=200 --set data.val_fraction=0.05 --set device.type=\"cpu\"
      done ;;
    llama)
      pre="$work/llama-pre"
      mkdir -p "$pre"
      (cd "$pre" && "$zinf" train --config "$root/configs/tiny.json" --set model.family=\"llama\" \
         --set model.n_layer=4 --set model.n_head=8 --set model.n_kv_head=2 --set model.d_model=256 \
         --set model.d_ff=512 --set train.steps=300 --set train.checkpoint_dir=\"ck\" \
         --set train.checkpoint_interval=300 >log.txt 2>&1 &&
       "$zinf" export --format hf --dtype bf16 --checkpoint ck/step-00000300 -o "$work/llama-hf" >>log.txt 2>&1) || {
        echo "states-evidence: llama pretraining or export failed:" >&2
        tail -5 "$pre/log.txt" >&2
        exit 1
      }
      # The fine-tune: tiny.json's run settings, the shape from the folder's config.json.
      python3 - "$root/configs/tiny.json" "$work/llama-hf" "$work/llama-ft.json" <<'EOF2'
import json, sys
c = json.load(open(sys.argv[1]))
c["model"] = {"init_from": sys.argv[2], "seq_len": 128}
c["train"].update({"steps": 150, "seed": 99})
c["optimizer"]["params"]["lr"] = 3e-4
c["bf16"] = {"enabled": True}
c["zero_optimization"] = {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}
json.dump(c, open(sys.argv[3], "w"), indent=1)
EOF2
      for m in "${modes[@]}"; do run llama "$m" "$work/llama-ft.json"; done ;;
    *) echo "states-evidence: unknown case $c (tiny, gpt2, llama)" >&2; exit 2 ;;
  esac
  for m in "${modes[@]}"; do
    read -r tr va n < <(summary "$work/$c-$m/metrics.jsonl")
    dev="—"
    [ "$m" != fp32 ] && dev="$(curve_dev "$work/$c-fp32/metrics.jsonl" "$work/$c-$m/metrics.jsonl")"
    table_rows+=("| $c | $m | $n | $tr | $va | $dev |")
  done
done

echo "| run | optimizer_states | steps | train loss (mean of last 20 steps) | last val loss | max step-loss difference to fp32 |"
echo "|---|---|---|---|---|---|"
printf '%s\n' "${table_rows[@]}"
