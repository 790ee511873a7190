#!/usr/bin/env bash
# example_finetune_test.sh — the README's fine-tuning example (scripts/example-finetune.sh) end to end,
# a few steps per phase: a tokenizer.json trained with Hugging Face tokenizers, a base Llama pretrained
# and exported with its tokenizer, chat data, generation before, a masked fine-tune from the folder,
# export, generation after. Fails on any failed step or a missing product; skips (exit 77) without
# the checkers' python, which trains the tokenizer.
# Usage: tests/scripts/example_finetune_test.sh REPO_ROOT ZINF_BINARY [CHECK_PYTHON]
set -uo pipefail
root="$1" zinf="$2" py="${3:-$1/.venv-check/bin/python3}"
if ! "$py" -c "import tokenizers" 2>/dev/null; then
  echo "SKIP: no checker python with Hugging Face tokenizers at $py (scripts/install-checkers.sh installs it)"
  exit 77
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
out="$(cd "$tmp" && ZINF="$zinf" ZINF_CHECK_PYTHON="$py" EXAMPLE_STEPS=3 "$root/scripts/example-finetune.sh" ex 2>&1)"
rc=$?
bad=0
fail() { echo "FAIL: $*"; bad=1; }
[ "$rc" = 0 ] || fail "the example exited $rc"
for f in tokenizer/tokenizer.json base/config.json base/model.safetensors base/tokenizer.json chat.jsonl \
         ck-chat/step-00000003 chat/config.json chat/model.safetensors chat/tokenizer_config.json; do
  [ -e "$tmp/ex/$f" ] || fail "ex/$f was not written"
done
# Both generations rendered the folder's own (Llama 3 style) template, and trained on chat windows.
[ "$(grep -c 'generate: chat template model (.*tokenizer_config.json' <<<"$out")" = 2 ] ||
  fail "two generations with the folder's template expected"
grep -q 'chat template model (.*); one example per window' <<<"$out" || fail "the fine-tune did not render the folder's template"
grep -q 'init: parameters from the Hugging Face folder' <<<"$out" || fail "the fine-tune did not start from the base folder"
[ "$(grep -c '^final step=3 ' <<<"$out")" = 2 ] || fail "two training runs of 3 steps expected"
if [ "$bad" != 0 ]; then
  echo "$out" | tail -60
  exit 1
fi
echo "example-finetune: every phase ran and wrote its products"
