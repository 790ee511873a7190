# hf_transformers_check.py — the transformers side of hf_transformers_test: small random models made
# and saved by transformers itself (torch, save_pretrained), their per-token losses and greedy
# generations computed by transformers in float64, and zinf's exports loaded back by transformers.
#
#   make DIR FAMILY ROPE FORMAT   a model in DIR (FAMILY llama, qwen2, mistral, gpt2, or mistral-window
#                                 (sliding_window 5) or qwen2-window (sliding_window 8 on layer 1 only,
#                                 max_window_layers 1), windows shorter than T and the generation; ROPE a rope_type
#                                 or "none"; FORMAT v5 as save_pretrained writes it, or v4: config.json
#                                 rewritten with rope_theta / rope_scaling at the top, as transformers 4
#                                 wrote it), and DIR/expect.json: tokens, targets, losses, prompt, ids
#   check SRC OUT                 OUT (zinf's export of SRC) loads in transformers as the same class and
#                                 gives SRC's losses; prints the largest difference
import json
import os
import sys

import torch
import transformers

B, T, V = 2, 64, 128
PROMPT, NEW = 8, 8


def rope_parameters(kind, head_dim):
    half = head_dim // 2
    return {
        "default": {"rope_type": "default"},
        "linear": {"rope_type": "linear", "factor": 2.0},
        "dynamic": {"rope_type": "dynamic", "factor": 2.0},
        "llama3": {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 16},
        "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 8.0,
                 "beta_slow": 1.0},
        "yarn-mscale": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                        "mscale": 0.8, "mscale_all_dim": 0.5, "truncate": False},
        "longrope": {"rope_type": "longrope", "original_max_position_embeddings": 32,
                     "short_factor": [1.0 + 0.05 * i for i in range(half)],
                     "long_factor": [1.0 + 0.4 * i for i in range(half)]},
    }[kind]


def config(family, rope):
    common = dict(vocab_size=V, initializer_range=0.15, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                  tie_word_embeddings=False)
    if family == "gpt2":
        return transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=T, resid_pdrop=0.0,
                                       embd_pdrop=0.0, attn_pdrop=0.0, **dict(common, tie_word_embeddings=True))
    kw = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
              num_hidden_layers=2, max_position_embeddings=T, rms_norm_eps=1e-5, **common)
    rp = dict(rope_parameters("default" if rope == "none" else rope, 16), rope_theta=1000.0)
    kw["rope_parameters"] = rp
    if family == "llama":
        return transformers.LlamaConfig(**kw)
    if family == "qwen2":
        return transformers.Qwen2Config(use_sliding_window=False, **kw)
    if family == "mistral":
        return transformers.MistralConfig(sliding_window=T, **kw)
    if family == "mistral-window":
        return transformers.MistralConfig(sliding_window=5, **kw)
    if family == "qwen2-window":
        return transformers.Qwen2Config(use_sliding_window=True, sliding_window=8, max_window_layers=1, **kw)
    raise SystemExit("unknown family " + family)


def as_v4(d):
    """config.json as transformers 4 wrote it: rope_theta and rope_scaling at the top."""
    path = os.path.join(d, "config.json")
    c = json.load(open(path))
    rp = c.pop("rope_parameters")
    c["rope_theta"] = rp.pop("rope_theta")
    c["rope_scaling"] = None if rp.get("rope_type") == "default" else rp
    json.dump(c, open(path, "w"), indent=2)


def per_token_losses(model, tok, tgt):
    with torch.no_grad():
        logits = model(input_ids=tok).logits.double()
    return torch.nn.functional.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1), reduction="none")


def load(d):
    return transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float64).eval()


def make(d, family, rope, fmt):
    torch.manual_seed(11)
    model = transformers.AutoModelForCausalLM.from_config(config(family, rope)).float().eval()
    model.save_pretrained(d, safe_serialization=True)
    if fmt == "v4":
        as_v4(d)
    model = load(d)  # what transformers reads back, in float64: the reference
    g = torch.Generator().manual_seed(5)
    tok = torch.randint(0, V, (B, T), generator=g)
    tgt = torch.randint(0, V, (B, T), generator=g)
    losses = per_token_losses(model, tok, tgt)
    prompt = tok[:1, :PROMPT]
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=NEW, do_sample=False, eos_token_id=None, pad_token_id=0,
                             attention_mask=torch.ones_like(prompt))
    json.dump({"tokens": tok.reshape(-1).tolist(), "targets": tgt.reshape(-1).tolist(), "losses": losses.tolist(),
               "prompt": prompt[0].tolist(), "generated": out[0, PROMPT:].tolist(),
               "class": type(model).__name__}, open(os.path.join(d, "expect.json"), "w"))


def check(src, out):
    e = json.load(open(os.path.join(src, "expect.json")))
    model = load(out)
    if type(model).__name__ != e["class"]:
        raise SystemExit("the export loads as %s, the source as %s" % (type(model).__name__, e["class"]))
    a, b = json.load(open(os.path.join(src, "config.json"))), json.load(open(os.path.join(out, "config.json")))
    for k in ("rope_parameters", "rope_theta", "rope_scaling", "sliding_window"):
        if (k in a) != (k in b):
            raise SystemExit("config.json: %s is %s in the source, %s in the export" %
                             (k, "present" if k in a else "absent", "present" if k in b else "absent"))
    tok = torch.tensor(e["tokens"]).reshape(B, T)
    tgt = torch.tensor(e["targets"]).reshape(B, T)
    got = per_token_losses(model, tok, tgt)
    print("max_loss_diff %.3e" % (got - torch.tensor(e["losses"], dtype=torch.float64)).abs().max().item())


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5])
    else:
        check(sys.argv[2], sys.argv[3])
