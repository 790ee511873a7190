#!/usr/bin/env python3
"""zinf's PyTorch peer: a plain GPT-2 trained in PyTorch on the shapes `zinf bench step` trains.

scripts/compare-torch.sh runs it beside zinf on one GPU and puts both in one table, so the model and
the work per step are zinf's: GPT-2's architecture (learned positional embedding, pre-LayerNorm
blocks, GELU with the tanh approximation, causal attention, the LM head tied to the token embedding),
AdamW (lr 3e-4, weight decay 0.1, as configs/compare-*.json), gradient clipping at 1.0, optional
activation checkpointing per block, on random tokens (the step time does not depend on the text).

Modes:
  resident      the model on the device, fp32 master weights, bf16 autocast, attention through
                scaled_dot_product_attention (flash attention on a GPU), fused AdamW on CUDA;
  fsdp-offload  FullyShardedDataParallel with CPUOffload(offload_params=True) on one process (world
                size 1, a file:// rendezvous): parameters, gradients and the AdamW step on the host,
                bf16 compute on the device, one FSDP unit per block.

It prints progress on stderr and one JSON object on stdout (one line): step_s (the median over the
measured steps, after --warmup untimed ones), tokens_per_s, tflops (6·N·tokens per step, N every
parameter, counted the way `zinf bench step` counts them, so the two columns compare), and
tflops_with_attention (adding the attention score and value products, 12·L·T·C per token forward and
backward, as computed over the full score matrix), peak_device_bytes, and the run's settings.

  python3 bench/torch_gpt2.py resident --layers 24 --embd 1024 --heads 16 --vocab 256 --seq 512 \\
      --mb 8 --ga 1 --steps 3 --warmup 1 --activation-checkpointing
  python3 bench/torch_gpt2.py resident --device cpu --layers 2 --embd 64 --heads 4 --vocab 256 \\
      --seq 32 --mb 2 --steps 2 --warmup 1            # a quick check without a GPU

PyTorch is not a dependency of zinf: install it where this runs (pip install torch).
"""

import argparse
import json
import math
import os
import resource
import statistics
import sys
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


class Block(nn.Module):
    """One pre-LayerNorm transformer block: x + attn(ln_1(x)), then x + mlp(ln_2(x))."""

    def __init__(self, embd: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(embd)
        self.c_attn = nn.Linear(embd, 3 * embd)
        self.attn_proj = nn.Linear(embd, embd)
        self.ln_2 = nn.LayerNorm(embd)
        self.c_fc = nn.Linear(embd, 4 * embd)
        self.mlp_proj = nn.Linear(4 * embd, embd)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.attn_proj(y.transpose(1, 2).contiguous().view(b, t, c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers: int, embd: int, heads: int, vocab: int, seq: int, activation_checkpointing: bool):
        super().__init__()
        self.wte = nn.Embedding(vocab, embd)
        self.wpe = nn.Embedding(seq, embd)
        self.h = nn.ModuleList(Block(embd, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(embd)
        self.activation_checkpointing = activation_checkpointing
        # GPT-2's initialisation: normal(0, 0.02), zero biases, the residual projections scaled by
        # 1/sqrt(2·layers).
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif "ln_" in name:
                nn.init.ones_(p)
            else:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = checkpoint(block, x, use_reentrant=False) if self.activation_checkpointing else block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # the LM head, tied to the token embedding
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def count_params(layers: int, embd: int, vocab: int, seq: int) -> int:
    """Every parameter, the tied head counted once (as zinf's count_params)."""
    block = 12 * embd * embd + 13 * embd
    return vocab * embd + seq * embd + layers * block + 2 * embd


def make_optimizer(params, lr: float, weight_decay: float):
    """AdamW, fused where PyTorch has a fused kernel for these parameters (CUDA tensors; host tensors
    from 2.4 on), else the multi-tensor (foreach) path."""
    params = list(params)
    try:
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True), "fused"
    except (RuntimeError, ValueError, TypeError):
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, foreach=True), "foreach"


def log(msg: str) -> None:
    print(f"torch_gpt2: {msg}", file=sys.stderr, flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=["resident", "fsdp-offload"])
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--embd", type=int, required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--mb", type=int, required=True, help="micro-batch size (sequences)")
    ap.add_argument("--ga", type=int, default=1, help="gradient accumulation steps")
    ap.add_argument("--steps", type=int, default=3, help="measured steps")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps before the measured ones")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16", help="autocast compute type")
    ap.add_argument("--activation-checkpointing", action="store_true", help="recompute each block in the backward")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    if a.embd % a.heads:
        ap.error(f"--embd {a.embd} is not a multiple of --heads {a.heads}")
    if min(a.layers, a.embd, a.heads, a.vocab, a.seq, a.mb, a.ga, a.steps) < 1 or a.warmup < 0:
        ap.error("shapes, --mb, --ga and --steps must be at least 1, --warmup at least 0")
    if a.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no GPU visible to PyTorch (use --device cpu for a check without one)")
    if a.mode == "fsdp-offload" and a.device != "cuda":
        ap.error("fsdp-offload needs --device cuda: PyTorch's FSDP runs on an accelerator only")

    torch.manual_seed(a.seed)
    dev = torch.device(a.device)
    on_cuda = dev.type == "cuda"
    if on_cuda:
        torch.cuda.set_device(dev)
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 stays fp32, as in zinf
        torch.backends.cudnn.allow_tf32 = False
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32

    model = GPT(a.layers, a.embd, a.heads, a.vocab, a.seq, a.activation_checkpointing)
    n_params = sum(p.numel() for p in model.parameters())
    assert n_params == count_params(a.layers, a.embd, a.vocab, a.seq), (n_params, "parameter count")
    rendezvous = None
    if a.mode == "resident":
        model.to(dev)
        opt, opt_kind = make_optimizer(model.parameters(), a.lr, a.weight_decay)
        autocast = dict(device_type=dev.type, dtype=dtype, enabled=a.dtype == "bf16")
        clip = lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    else:
        import torch.distributed as dist
        from torch.distributed.fsdp import CPUOffload, FullyShardedDataParallel as FSDP, MixedPrecision
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        fd, rendezvous = tempfile.mkstemp(prefix="torch_gpt2-rdzv-")
        os.close(fd)
        os.unlink(rendezvous)  # the file store creates it; a stale one would hold an old job's keys
        dist.init_process_group("nccl" if on_cuda else "gloo", init_method=f"file://{rendezvous}", rank=0, world_size=1)
        mp = MixedPrecision(param_dtype=dtype, reduce_dtype=dtype, buffer_dtype=dtype) if a.dtype == "bf16" else None
        model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}), cpu_offload=CPUOffload(offload_params=True),
                     mixed_precision=mp, device_id=dev if on_cuda else None, use_orig_params=True)
        opt, opt_kind = make_optimizer(model.parameters(), a.lr, a.weight_decay)
        autocast = dict(device_type=dev.type, dtype=dtype, enabled=False)  # FSDP's MixedPrecision casts
        clip = lambda: model.clip_grad_norm_(1.0)

    gen = torch.Generator(device="cpu").manual_seed(a.seed + 1)
    batches = [torch.randint(0, a.vocab, (a.mb, a.seq + 1), generator=gen) for _ in range(a.ga)]
    batches = [(b[:, :-1].contiguous().to(dev), b[:, 1:].contiguous().to(dev)) for b in batches]

    def sync() -> None:
        if on_cuda:
            torch.cuda.synchronize(dev)

    def step() -> float:
        total = 0.0
        for x, y in batches:
            with torch.autocast(**autocast):
                loss = model(x, y) / a.ga
            loss.backward()
            total += loss.detach()
        clip()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(total)  # waits for the step, so the host clock brackets the device's work

    log(f"{a.mode} on {dev}: {n_params:,} parameters, {a.layers} layers x {a.embd} wide, {a.heads} heads, "
        f"vocab {a.vocab}, seq {a.seq}, micro-batch {a.mb}, GA {a.ga}, AdamW {opt_kind}, {a.dtype}"
        f"{', activation checkpointing' if a.activation_checkpointing else ''}")
    if on_cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    times, loss = [], float("nan")
    for i in range(a.warmup + a.steps):
        sync()
        t0 = time.perf_counter()
        loss = step()
        sync()
        dt = time.perf_counter() - t0
        if i >= a.warmup:
            times.append(dt)
        log(f"step {i + 1}/{a.warmup + a.steps}{' (warm-up)' if i < a.warmup else ''}: loss {loss:.4f}, {dt * 1e3:.1f} ms")

    step_s = statistics.median(times)
    tokens = a.mb * a.ga * a.seq
    flops_6n = 6.0 * n_params * tokens
    flops_attention = 12.0 * a.layers * a.seq * a.embd * tokens
    peak_device = torch.cuda.max_memory_allocated(dev) if on_cuda else None
    result = {
        "mode": a.mode, "device": str(dev), "device_name": torch.cuda.get_device_name(dev) if on_cuda else "cpu",
        "torch": torch.__version__, "params": n_params, "layers": a.layers, "embd": a.embd, "heads": a.heads,
        "vocab": a.vocab, "seq": a.seq, "mb": a.mb, "ga": a.ga, "dtype": a.dtype,
        "activation_checkpointing": a.activation_checkpointing, "optimizer": f"AdamW ({opt_kind})",
        "steps_measured": len(times), "warmup": a.warmup, "step_s": step_s, "step_s_all": times,
        "tokens_per_step": tokens, "tokens_per_s": tokens / step_s,
        "tflops": flops_6n / step_s / 1e12, "tflops_formula": "6*N*tokens/step_s, N every parameter",
        "tflops_with_attention": (flops_6n + flops_attention) / step_s / 1e12,
        "tflops_with_attention_formula": "(6*N + 12*layers*seq*embd)*tokens/step_s",
        "peak_device_bytes": peak_device,
        "peak_host_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "loss": loss,
    }
    print(json.dumps(result), flush=True)
    if rendezvous is not None:
        import torch.distributed as dist

        dist.destroy_process_group()
        if os.path.exists(rendezvous):
            os.unlink(rendezvous)
    return 0


if __name__ == "__main__":
    sys.exit(main())
