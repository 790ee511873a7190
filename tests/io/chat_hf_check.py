#!/usr/bin/env python3
"""Hugging Face transformers' encoding of chats and prompts, for tests/io/chat_hf_test.cpp to compare
zinf against (run with the checkers' python, scripts/install-checkers.sh).

usage: chat_hf_check.py MODEL_FOLDER CASES_JSON

CASES_JSON is a list; each case is one of
  {"template": TEXT, "messages": [...], "add_generation_prompt": BOOL, "mask": BOOL}
      -> {"ids": apply_chat_template(..., tokenize=True), "mask": its assistant_masks (when "mask")}
  {"prompt": TEXT, "split_special_tokens": BOOL}
      -> {"ids": tokenizer(TEXT)["input_ids"]}
Prints the list of results as JSON.
"""
import json
import sys

from transformers import AutoTokenizer


def main():
    folder, cases_path = sys.argv[1], sys.argv[2]
    tok = AutoTokenizer.from_pretrained(folder)
    with open(cases_path, encoding="utf-8") as f:
        cases = json.load(f)
    out = []
    for c in cases:
        if "prompt" in c:
            enc = tok(c["prompt"], split_special_tokens=c.get("split_special_tokens", False))
            out.append({"ids": list(enc["input_ids"])})
            continue
        r = tok.apply_chat_template(c["messages"], chat_template=c["template"],
                                    add_generation_prompt=c.get("add_generation_prompt", False),
                                    tokenize=True, return_dict=True,
                                    return_assistant_tokens_mask=c.get("mask", False))
        res = {"ids": list(r["input_ids"])}
        if c.get("mask", False):
            res["mask"] = list(r["assistant_masks"])
        out.append(res)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
