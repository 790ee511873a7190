#!/usr/bin/env python3
"""Trains a small byte-level BPE tokenizer with Hugging Face `tokenizers` and writes it as a model
folder zinf reads (data.tokenizer, zinf tokenize --tokenizer): tokenizer.json, tokenizer_config.json
(bos_token, eos_token, and the style's chat_template) and generation_config.json (bos_token_id, eos_token_id).

--style gpt2:   ByteLevel splitting with GPT-2's pattern (as GPT-2 ships); BOS = EOS = <|endoftext|>.
--style llama3: a Split with Llama 3's pattern, then ByteLevel without a pattern, ignore_merges (as
                Llama 3 ships); BOS <|begin_of_text|>, EOS <|eot_id|> and <|end_of_text|>.
--style smollm: Digits (one piece per digit), then ByteLevel with GPT-2's pattern (as SmolLM ships);
                BOS = EOS = <|endoftext|>.
--style qwen2:  a Split with Qwen2's pattern (single digits), then ByteLevel without a pattern, an NFC
                normalizer (as Qwen2 ships); no BOS, EOS <|im_end|> and <|endoftext|>.
--nfc adds an NFC normalizer (as Qwen2 ships).
The post-processor is as each family ships it: llama3 puts <|begin_of_text|> before a text
(TemplateProcessing), the others add nothing (ByteLevel). The special tokens of both chat formats come first
in the vocabulary (ids 0-7).

Runs with the checkers' python (scripts/install-checkers.sh: .venv-check/bin/python).

usage: make-tokenizer.py OUTPUT_DIR VOCAB_SIZE TEXT_FILE... [--style gpt2|llama3|smollm|qwen2] [--nfc]
"""
import argparse
import json
import os

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

# Llama 3's split pattern (tokenizer.json of Meta-Llama-3-8B).
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen2's split pattern (tokenizer.json of Qwen2-7B-Instruct): Llama 3's with single digits.
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

SPECIALS = ["<|endoftext|>", "<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
            "<|end_header_id|>", "<|eot_id|>", "<|im_start|>", "<|im_end|>"]


# The chat format each style's models use, as a Jinja chat_template in tokenizer_config.json (what
# transformers' apply_chat_template and zinf's data.chat_template auto read): Llama 3's headers for
# llama3, ChatML for smollm (as SmolLM2 ships); GPT-2 has none.
CHAT_TEMPLATES = {
    "llama3": ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
               "{{ m['content'] }}<|eot_id|>{% endfor %}"
               "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"),
    "qwen2": ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
              "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
              "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
              "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"),
    "smollm": ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
               "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"),
}


def build(style, nfc):
    tok = Tokenizer(models.BPE(ignore_merges=(style in ("llama3", "qwen2"))))
    if nfc or style == "qwen2":
        tok.normalizer = normalizers.NFC()
    if style == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    elif style == "smollm":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
    else:
        pattern = LLAMA3_PATTERN if style == "llama3" else QWEN2_PATTERN
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    tok.decoder = decoders.ByteLevel()
    return tok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("output", help="folder to write (created if missing)")
    ap.add_argument("vocab_size", type=int, help="vocabulary size, specials and the 256 bytes included")
    ap.add_argument("inputs", nargs="+", help="text files to train on")
    ap.add_argument("--style", choices=["gpt2", "llama3", "smollm", "qwen2"], default="gpt2")
    ap.add_argument("--nfc", action="store_true", help="add an NFC normalizer")
    a = ap.parse_args()
    if a.vocab_size < 256 + len(SPECIALS):
        ap.error(f"vocab_size must be at least {256 + len(SPECIALS)} (the bytes and the special tokens)")

    tok = build(a.style, a.nfc)
    trainer = trainers.BpeTrainer(vocab_size=a.vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train(a.inputs, trainer)
    if a.style == "llama3":
        bos_id = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                          special_tokens=[("<|begin_of_text|>", bos_id)]),
        ])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    os.makedirs(a.output, exist_ok=True)
    tok.save(os.path.join(a.output, "tokenizer.json"))

    if a.style in ("gpt2", "smollm"):
        bos, eos = "<|endoftext|>", ["<|endoftext|>"]
    elif a.style == "qwen2":
        bos, eos = None, ["<|im_end|>", "<|endoftext|>"]
    else:
        bos, eos = "<|begin_of_text|>", ["<|eot_id|>", "<|end_of_text|>"]
    config = {"bos_token": bos, "eos_token": eos[0], "model_max_length": 1 << 20,
              "tokenizer_class": "PreTrainedTokenizerFast"}
    if a.style in CHAT_TEMPLATES:
        config["chat_template"] = CHAT_TEMPLATES[a.style]
    with open(os.path.join(a.output, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(a.output, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": tok.token_to_id(bos) if bos else None,
                   "eos_token_id": [tok.token_to_id(e) for e in eos]}, f, indent=2)
    print(f"{a.output}: {a.style} byte-level BPE, {tok.get_vocab_size()} ids")


if __name__ == "__main__":
    main()
