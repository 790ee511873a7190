#!/usr/bin/env python3
"""Writes a small instruction data set (JSONL, one {"messages": [...]} per line) from the licence
texts every Debian system has in /usr/share/common-licenses: for each licence, its title, and each
of its first paragraphs by number. The README's fine-tuning example trains on it; standard library
only.

usage: make-instructions.py OUTPUT.jsonl [--dir /usr/share/common-licenses] [--paragraphs 12]
"""
import argparse
import json
import os
import random
import re


def paragraphs(text):
    """The licence's paragraphs: blank-line separated, whitespace runs folded, short ones dropped."""
    out = []
    for block in re.split(r"\n\s*\n", text):
        p = " ".join(block.split())
        if len(p) >= 40:
            out.append(p[:240].rsplit(" ", 1)[0] if len(p) > 240 else p)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("output")
    ap.add_argument("--dir", default="/usr/share/common-licenses")
    ap.add_argument("--paragraphs", type=int, default=12, help="paragraphs asked for per licence")
    args = ap.parse_args()
    examples = []
    for name in sorted(os.listdir(args.dir)):
        path = os.path.join(args.dir, name)
        if not os.path.isfile(path) or os.path.islink(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        lines = [" ".join(l.split()) for l in text.splitlines() if l.strip()]
        if not lines:
            continue
        examples.append({"messages": [
            {"role": "user", "content": f"What is the title of the {name} licence?"},
            {"role": "assistant", "content": lines[0]}]})
        for i, p in enumerate(paragraphs(text)[: args.paragraphs], start=1):
            examples.append({"messages": [
                {"role": "system", "content": "You quote licences exactly."},
                {"role": "user", "content": f"Quote paragraph {i} of the {name} licence."},
                {"role": "assistant", "content": p}]})
    random.Random(0).shuffle(examples)  # the validation split (the file's tail) mixes licences
    with open(args.output, "w", encoding="utf-8") as f:
        for e in examples:
            f.write(json.dumps(e, ensure_ascii=False) + "\n")
    print(f"make-instructions: {len(examples)} conversations -> {args.output}")


if __name__ == "__main__":
    main()
