#!/usr/bin/env bash
# zinf beside PyTorch on the same GPU, in one go: `zinf bench step` (with --profile) and the PyTorch
# peer (bench/torch_gpt2.py: eager bf16 autocast with flash attention and fused AdamW, or FSDP with
# CPUOffload) train the same GPT-2 shapes, and one table compares them:
#   a          24 layers, 1024 wide, 16 heads, vocab 256, seq 512, micro-batch 8, GA 1, resident
#   b          GPT-2 XL's shape (48 / 1600 / 25), vocab 50304, seq 1024, micro-batch 4, GA 1, resident
#   b-ga4      b at GA 4, resident (zinf only: the reference for the next row)
#   b-ga4-opt  b at GA 4, optimizer states on the CPU (ZeRO-Offload; zinf only, against b-ga4), the
#              micro batches summed on the device (offload_optimizer.device_grad_accumulation)
#   b-ga4-all  b at GA 4, optimizer and parameters on the CPU, device budget under a third of the
#              training state; beside PyTorch FSDP with CPUOffload(offload_params=True) on the same work
# Usage: scripts/compare-torch.sh [PEER]   (PEER: a PyTorch GPT-2 script taking the same arguments,
# default bench/torch_gpt2.py; PyTorch must be installed for the python3 that runs it, or only zinf's
# side is measured). ZINF_COMPARE_CASES picks cases (default all, in the order above);
# ZINF_BIN the zinf binary (default build-gpu/src/zinf, built by scripts/gpu-check.sh's build part).
# ZINF_COMPARE_STEPS: zinf's `bench step --steps` (default 4, the first a warm-up);
# ZINF_COMPARE_PEER_STEPS: the peer's measured steps (default 3, after one warm-up);
# ZINF_COMPARE_PEER=none measures zinf's side only;
# ZINF_COMPARE_APPEND=1 adds to compare.jsonl instead of starting it afresh (one call per case, each
# under its own time cap, then a call with ZINF_COMPARE_CASES=none writes the table of them all).
# Writes compare.jsonl (every raw result) and compare.md (the table) under $OUT, or the repository.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out_dir="${OUT:-$root}"
peer="${1:-}"
for p in "$peer" "$root/bench/torch_gpt2.py"; do
  [ -n "$p" ] && [ -f "$p" ] && peer="$p" && break
done
[ "${ZINF_COMPARE_PEER:-}" = none ] && peer=""  # zinf's side only, asked for
if [ -n "$peer" ] && ! python3 -c 'import torch' 2>/dev/null; then
  echo "== PyTorch is not installed for $(command -v python3): measuring zinf's side only (pip install torch)" >&2
  peer=""
fi
zinf="${ZINF_BIN:-$root/build-gpu/src/zinf}"
cases=" ${ZINF_COMPARE_CASES:-a b b-ga4 b-ga4-opt b-ga4-all} "
raw="$out_dir/compare.jsonl"
[ "${ZINF_COMPARE_APPEND:-0}" = 1 ] || : > "$raw"
touch "$raw"
record() {  # case, side, then the command; its JSON (all it prints on stdout) goes into compare.jsonl
  local name="$1" side="$2"; shift 2
  echo "== $name $side: $*" >&2
  local t0=$SECONDS out="$out_dir/compare-$name-$side.json"
  if "$@" > "$out" 2> "$out_dir/compare-$name-$side.log"; then
    python3 -c 'import json, sys; print(json.dumps({"case": sys.argv[1], "side": sys.argv[2], "wall_s": int(sys.argv[3]),
                "result": json.load(open(sys.argv[4]))}))' "$name" "$side" "$((SECONDS - t0))" "$out" >> "$raw" ||
      echo "== $name $side: no JSON in its output" >&2
  else
    echo "== $name $side: FAILED (see compare-$name-$side.log)" >&2
    echo "{\"case\": \"$name\", \"side\": \"$side\", \"failed\": true}" >> "$raw"
  fi
}
has() { [[ "$cases" == *" $1 "* ]]; }
# ZINF_COMPARE_SET: extra `--set k=v` words for every zinf run (e.g. a dry run on the CPU device).
# shellcheck disable=SC2206  # ZINF_COMPARE_SET is words
step=(bench step --json --profile --no-baseline --steps "${ZINF_COMPARE_STEPS:-4}" ${ZINF_COMPARE_SET:-})
a_shape=(--layers 24 --embd 1024 --heads 16 --vocab 256 --seq 512)
b_shape=(--layers 48 --embd 1600 --heads 25 --vocab 50304 --seq 1024)
# configs/compare-a.json and compare-b.json recompute activations; the peer does the same work.
peer_steps=(--steps "${ZINF_COMPARE_PEER_STEPS:-3}" --warmup 1 --activation-checkpointing)
if has a; then
  record a zinf "$zinf" "${step[@]}" --config "$root/configs/compare-a.json"
  [ -n "$peer" ] && record a torch python3 "$peer" resident "${a_shape[@]}" --mb 8 --ga 1 "${peer_steps[@]}"
fi
if has b; then
  record b zinf "$zinf" "${step[@]}" --config "$root/configs/compare-b.json"
  [ -n "$peer" ] && record b torch python3 "$peer" resident "${b_shape[@]}" --mb 4 --ga 1 "${peer_steps[@]}"
fi
has b-ga4 && record b-ga4 zinf "$zinf" "${step[@]}" --config "$root/configs/compare-b.json" --set gradient_accumulation_steps=4
has b-ga4-opt && record b-ga4-opt zinf "$zinf" "${step[@]}" --config "$root/configs/compare-b.json" --set gradient_accumulation_steps=4 \
  --set zero_optimization.offload_optimizer.device_grad_accumulation=true \
  --set zero_optimization.stage=2 --set zero_optimization.offload_optimizer.device=cpu
if has b-ga4-all; then
  # 1.56B parameters x 16 bytes of training state = 24.9 GB; the device gets 7 GiB (under a third).
  record b-ga4-all zinf "$zinf" "${step[@]}" --config "$root/configs/compare-b.json" --set gradient_accumulation_steps=4 \
    --set zero_optimization.stage=3 --set zero_optimization.offload_optimizer.device=cpu \
    --set zero_optimization.offload_param.device=cpu --set device.memory_budget=7GiB
  [ -n "$peer" ] && record b-ga4-all torch python3 "$peer" fsdp-offload "${b_shape[@]}" --mb 4 --ga 4 "${peer_steps[@]}"
fi
[ -z "$peer" ] && echo "== no PyTorch peer found: zinf's side only" >&2
python3 - "$raw" > "$out_dir/compare.md" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
get = lambda c, s: next((r.get("result") for r in rows if r["case"] == c and r["side"] == s and not r.get("failed")), None)
def step(r, side): return None if r is None else r["step_s"]
def tf(r): return None if r is None else r.get("tflops")
f = lambda x, d=3: "-" if x is None else f"{x:.{d}f}"
print("| case | zinf s/step | zinf TFLOPS | PyTorch s/step | PyTorch TFLOPS | zinf / PyTorch |")
print("|---|---|---|---|---|---|")
for c in ["a", "b", "b-ga4", "b-ga4-opt", "b-ga4-all"]:
    z, t = get(c, "zinf"), get(c, "torch")
    if z is None and t is None: continue
    zs, ts = step(z, "zinf"), step(t, "torch")
    print(f"| {c} | {f(zs)} | {f(tf(z), 2)} | {f(ts)} | {f(tf(t), 2)} | {f(zs / ts if zs and ts else None, 2)} |")
ref, opt = get("b-ga4", "zinf"), get("b-ga4-opt", "zinf")
if ref and opt: print(f"\nb-ga4-opt against zinf's resident b-ga4: {opt['step_s'] / ref['step_s']:.3f} (target <= 1.10)")
for c in ["a", "b"]:
    z = get(c, "zinf")
    if z and z.get("profile"):
        print(f"\nzinf's top five op kinds, case {c} (of {z['step_s'] * 1e3:.1f} ms per step):\n")
        print("| op | ms/step | share | TFLOPS |")
        print("|---|---|---|---|")
        for o in z["profile"][:5]:
            print(f"| {o['op']} | {o['seconds_per_step'] * 1e3:.2f} | {100 * o['share_of_step']:.1f}% | {o['tflops']:.2f} |")
PY
cat "$out_dir/compare.md"
