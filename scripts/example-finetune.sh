#!/usr/bin/env bash
# The README's fine-tuning example, end to end on the CPU device, from files every Debian system has:
#   1. a byte-level BPE tokenizer.json (Llama 3's style) trained on the licence texts in
#      /usr/share/common-licenses (scripts/make-tokenizer.py, with Hugging Face `tokenizers`);
#   2. a small Llama-family base model pretrained on those texts (configs/example-base.json),
#      exported as a Hugging Face folder with the tokenizer beside it;
#   3. chat data about the licences (scripts/make-instructions.py, JSONL);
#   4. the base model answering a question, then a fine-tune on the chat data with the optimizer
#      offloaded to host memory and the loss on the answers only (configs/finetune-chat-tiny.json),
#      exported, and the fine-tuned model answering the same question.
# usage: scripts/example-finetune.sh [OUT_DIR]   (default: example; the configs' paths assume it)
# ZINF=path/to/zinf uses that binary (default build/src/zinf, built when missing);
# EXAMPLE_STEPS=N trains N steps in each phase instead of the configs' 300 and 200 (a quick check).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-example}"
zinf="${ZINF:-$root/build/src/zinf}"
if [ ! -x "$zinf" ]; then
  "$root/scripts/install-deps.sh"
  ZINF_BUILD_TARGETS=zinf "$root/scripts/build.sh" "$root/build"
fi
py="${ZINF_CHECK_PYTHON:-$root/.venv-check/bin/python}"
[ -x "$py" ] || "$root/scripts/install-checkers.sh"   # Hugging Face tokenizers, for step 1 only
steps_base=() steps_chat=()
if [ -n "${EXAMPLE_STEPS:-}" ]; then
  steps_base=(--set "train.steps=$EXAMPLE_STEPS" --set "train.checkpoint_interval=$EXAMPLE_STEPS" --set "train.eval_interval=$EXAMPLE_STEPS")
  steps_chat=("${steps_base[@]}")
fi
mkdir -p "$out"
q() { printf '"%s"' "$1"; }  # a --set value as a JSON string

echo "== 1. tokenizer: byte-level BPE, 2048 tokens, on the licence texts"
find /usr/share/common-licenses -maxdepth 1 -type f | sort | xargs cat > "$out/licences.txt"
"$py" "$root/scripts/make-tokenizer.py" "$out/tokenizer" 2048 "$out/licences.txt" --style llama3

echo "== 2. base model: a small Llama pretrained on the licences, exported as a Hugging Face folder"
rm -rf "$out/ck-base" "$out/base"
"$zinf" train --config "$root/configs/example-base.json" --set data.path="$(q "$out/licences.txt")" \
  --set data.tokenizer="$(q "$out/tokenizer")" --set train.checkpoint_dir="$(q "$out/ck-base")" "${steps_base[@]}"
"$zinf" export --format hf --checkpoint "$out/ck-base/$(printf 'step-%08d' "${EXAMPLE_STEPS:-300}")" -o "$out/base"
cp "$out"/tokenizer/*.json "$out/base/"

echo "== 3. chat data: questions and answers about the licences"
python3 "$root/scripts/make-instructions.py" "$out/chat.jsonl"

question="What is the title of the GPL-3 licence?"
echo "== 4. before: the base model answers \"$question\""
"$zinf" generate --model "$out/base" --chat auto --prompt "$question" --max-new-tokens 24

echo "== 5. fine-tune on the chat data (optimizer in host memory, loss on the answers only)"
rm -rf "$out/ck-chat" "$out/chat"
"$zinf" train --config "$root/configs/finetune-chat-tiny.json" --set model.init_from="$(q "$out/base")" \
  --set data.path="$(q "$out/chat.jsonl")" --set data.tokenizer="$(q "$out/base")" \
  --set train.checkpoint_dir="$(q "$out/ck-chat")" "${steps_chat[@]}"
"$zinf" export --format hf --checkpoint "$out/ck-chat/$(printf 'step-%08d' "${EXAMPLE_STEPS:-200}")" -o "$out/chat"
cp "$out"/tokenizer/*.json "$out/chat/"

echo "== 6. after: the fine-tuned model answers \"$question\""
"$zinf" generate --model "$out/chat" --chat auto --prompt "$question" --max-new-tokens 24
