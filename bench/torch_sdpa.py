#!/usr/bin/env python3
"""PyTorch's causal scaled_dot_product_attention, forward then backward, on one shape: the peer of
`zinf bench attention` in the GPU check's speed stage.

Layout (B, H, T, D) as PyTorch takes it; grouped key/value heads (KV < H) through enable_gqa where this
PyTorch has it, else K and V repeated per query head (the repeat is outside the timed region). Prints
one JSON object: fwd_bwd_s (median of --iters after --warmup untimed calls, timed with CUDA events)
and tflops counted as zinf's bench counts them, 7·B·H·T²·D (forward 2, backward 5 products of
B·H·T²·D each, half of every T×T product masked), and which backend PyTorch picked is its own choice
(flash attention or cuDNN on a GPU). Exit 2 with one line when PyTorch or a GPU is missing.
"""
import argparse
import json
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="4,1024,25,25,64", help="B,T,H,KV,D")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    a = ap.parse_args()
    try:
        B, T, H, KV, D = (int(x) for x in a.shape.split(","))
    except ValueError:
        print(f"torch_sdpa: --shape expects B,T,H,KV,D, got {a.shape!r}", file=sys.stderr)
        return 2
    if min(B, T, H, KV, D) < 1 or H % KV:
        print(f"torch_sdpa: --shape {a.shape}: sizes must be positive and KV must divide H", file=sys.stderr)
        return 2
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print("torch_sdpa: PyTorch is not importable", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("torch_sdpa: no GPU visible to PyTorch", file=sys.stderr)
        return 2
    dt = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    dev = "cuda"
    q = torch.randn(B, H, T, D, device=dev, dtype=dt, requires_grad=True)
    k = torch.randn(B, KV, T, D, device=dev, dtype=dt, requires_grad=True)
    v = torch.randn(B, KV, T, D, device=dev, dtype=dt, requires_grad=True)
    dout = torch.randn(B, H, T, D, device=dev, dtype=dt)
    gqa = KV < H
    try:
        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        native_gqa = True
    except TypeError:  # a PyTorch before enable_gqa
        native_gqa = False
    if gqa and not native_gqa:
        k = k.detach().repeat_interleave(H // KV, dim=1).requires_grad_(True)
        v = v.detach().repeat_interleave(H // KV, dim=1).requires_grad_(True)

    def once():
        for t in (q, k, v):
            t.grad = None
        if native_gqa:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        else:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        o.backward(dout)

    for _ in range(a.warmup):
        once()
    torch.cuda.synchronize()
    times = []
    for _ in range(a.iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        once()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    times.sort()
    sec = times[len(times) // 2]
    flops = 7.0 * B * H * T * T * D
    print(json.dumps({"shape": {"B": B, "T": T, "H": H, "KV": KV, "D": D}, "attention": "torch-sdpa",
                      "dtype": a.dtype, "iters": a.iters, "fwd_bwd_s": sec, "tflops": flops / sec / 1e12,
                      "torch": torch.__version__, "native_gqa": native_gqa}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
