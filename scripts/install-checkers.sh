#!/usr/bin/env bash
# Installs the independent checkers some tests compare zinf against, from PyPI into the virtual
# environment .venv-check/ at the repository root: Hugging Face's `tokenizers` (tokenizer.json ids),
# `tensorboard` (reads back the event files zinf writes), `safetensors` and `numpy` (reads model
# folders without zinf), `transformers` with `torch` (makes, runs and reads Hugging Face models),
# `jinja2` (chat templates) and `sentencepiece` (tokenizer.model files). Tests that need one skip,
# naming it, when it is missing; this script never fails the build: without network or pip it says
# so and exits 0. Idempotent: an environment that
# already has every package is left alone.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="$root/.venv-check"
pkgs=(tokenizers tensorboard safetensors numpy transformers torch jinja2 sentencepiece)
py="$venv/bin/python3"
if [ -x "$py" ] && "$py" -c 'import tokenizers, tensorboard, safetensors, numpy, transformers, torch, jinja2, sentencepiece' 2>/dev/null; then
  echo "install-checkers: ${pkgs[*]} present in $venv"
  exit 0
fi
if ! python3 -m venv "$venv" >/dev/null 2>&1; then
  echo "install-checkers: could not create $venv (python3 -m venv); the tests that compare against them will skip"
  exit 0
fi
if "$venv/bin/pip" install -q --disable-pip-version-check "${pkgs[@]}" >/dev/null 2>"$venv/pip.log"; then
  echo "install-checkers: installed ${pkgs[*]} in $venv"
else
  echo "install-checkers: pip failed (see $venv/pip.log); the tests that compare against them will skip"
fi
exit 0
