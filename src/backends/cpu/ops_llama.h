// ops_llama.h — the reference operations of the Llama family (Llama 2/3, Mistral, Qwen2, TinyLlama,
// SmolLM) beside GPT-2's (ops_gpt.h), in fp32 on the CPU: RMSNorm, rotary position embeddings (with
// Llama 3's frequency scaling), the SwiGLU activation, and causal attention with grouped-query heads.
// The rules of ops_gpt.h hold: every op is parallel over fixed chunks and every cross-row sum is done by
// one thread in row order, so results do not depend on the thread count; backward ops accumulate
// (+=) into weight gradients and, where noted, into input gradients.
//
// Shapes: B = batch, T = positions, R = B·T rows, C = model width, H query heads, KV key/value heads
// (H a multiple of KV), D = C / H head width (even), F = the MLP's hidden width.
#pragma once

#include <cstddef>
#include <vector>

#include "cpu/ops_gpt.h"

namespace zinf::ops {

// out[r] = inp[r] / sqrt(mean(inp[r]²) + eps) · w; rstd[r] keeps the reciprocal root for backward.
void rmsnorm_forward(ChunkPool& p, float* out, float* rstd, const float* inp, const float* w, int R, int C, float eps);
// dinp += ∂/∂inp, dw += ∂/∂w of Σ dout·out.
void rmsnorm_backward(ChunkPool& p, float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                      const float* rstd, int R, int C);

// Rotates each head of x [R, heads·D] in place by its row's position (r mod T), in Hugging Face's
// convention: the pairs are (i, i + D/2). backward = true rotates by the opposite angle, which is the
// gradient of the rotation (applied to dx in place).
void rope_apply(ChunkPool& p, float* x, const float* cos_t, const float* sin_t, int R, int T, int heads, int D,
                bool backward);

// SwiGLU: out = silu(gate) · up, elementwise over n. Backward writes (=) dgate and dup.
void swiglu_forward(ChunkPool& p, float* out, const float* gate, const float* up, std::size_t n);
void swiglu_backward(ChunkPool& p, float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                     std::size_t n);

// Causal attention with grouped-query heads: q [R, H·D], k and v [R, KV·D], out [R, H·D]; query head
// h reads key/value head h / (H / KV). att [B, H, T, T] keeps the probabilities for backward.
// W > 0: a sliding window (Mistral's, Qwen2's) — query t attends only keys s with t - s < W, the sums
// running over those keys alone (so a cached row of attention_decode, given the window's keys, equals
// its row here); W = 0: every key s <= t.
void gqa_attention_forward(ChunkPool& p, float* out, float* att, const float* q, const float* k, const float* v, int B,
                           int T, int H, int KV, int D, int W);
// Writes (=) dq, dk, dv; each key/value head's gradient sums its query heads in head order. `out`
// (the forward's output) is taken for the op list's sake and not read: the probabilities in att give
// the gradient without it, so this reference recomputes nothing.
void gqa_attention_backward(ChunkPool& p, float* dq, float* dk, float* dv, const float* dout, const float* q,
                            const float* k, const float* v, const float* att, const float* out, int B, int T, int H,
                            int KV, int D, int W);

// Attention of generation over a key/value cache (one sequence): q holds Q query rows for positions
// pos..pos+Q-1, k and v the keys and values of positions 0..pos+Q-1 (the new rows included); query row
// i attends to positions 0..pos+i, query head h to key/value head h / (H / KV), scale 1/√D. Row r of q
// starts at q + r·q_stride, of k and v at r·kv_stride (GPT-2's packed qkv rows: stride 3C). out [Q, H·D]
// is written (=). The sums run in gqa_attention_forward's order, so a cached row equals its row of a
// full forward bit for bit.
void attention_decode(ChunkPool& p, float* out, const float* q, const float* k, const float* v, int Q, int pos, int H,
                      int KV, int D, int q_stride, int kv_stride);

// Token embedding without positions (R rows): out[r] = wte[tokens[r]]; backward dwte[tokens[r]] +=
// dout[r], summed over rows in order (each column chunk by one thread).
void embedding_forward(ChunkPool& p, float* out, const int* tokens, const float* wte, int R, int C);
void embedding_backward(ChunkPool& p, float* dwte, const float* dout, const int* tokens, int R, int C);

}  // namespace zinf::ops
