// ops_attention_tiled.h — causal attention computed in the order of the GPU's flash-attention
// kernels (cuda/ops/flash_attention.cu), on the CPU, in fp32: the reference the 16-bit fast path is
// checked against, and the attention of the CPU device's "fast" twin.
//
// The plain reference (ops_gpt.h, ops_llama.h) keeps the whole [T, T] probability matrix; a flash
// kernel never does. It walks the keys in blocks with an online softmax (a running max m, a running
// sum l and an accumulator rescaled whenever m grows), keeps only the per-row log-sum-exp for the
// backward pass, and rounds the probability tile P (and, backward, dS) to the run's 16-bit type
// before its tensor-core products. Those choices change the last bits of the result, so this file
// makes the same ones, in the same order, with the block sizes the CUDA kernel uses (cuda_tiling):
// what the GPU computes can then be compared with a CPU result that differs only by the summation
// order inside a tile and the last bit of exp.
//
// One pair of functions serves both model families through row strides: GPT's packed qkv [B, T, 3C]
// passes q = qkv, k = qkv + C, v = qkv + 2C with strides 3C (and KV = H); Llama passes q [R, H·D],
// k and v [R, KV·D] (grouped-query heads: query head h reads key/value head h / (H / KV)). out and
// dout rows have stride o_stride. Results do not depend on the thread count (fixed chunks, each
// summed by one thread in a fixed order) nor on the CPU (model/fixed_math.h's exp and log).
#pragma once

#include "cpu/ops_gpt.h"
#include "model/tensor.h"

namespace zinf::ops {

// Row strides in elements. T is the sequence length; rows are b·T + t.
struct AttnShapeCpu {
  int B, T, H, KV, D;
  long q_stride, k_stride, v_stride, o_stride;
  // The sliding window (0: none): query t attends key s iff s <= t and t - s < W. Key blocks wholly
  // outside a query block's windows are skipped; inside one, a row's keys outside its window get P = 0.
  int W = 0;
};

// The tiles of the flash kernels and the type the P and dS tiles are rounded to before their
// products (fp32: no rounding).
struct TiledAttention {
  int block_q, block_k;
  DType round_p;
};

// The widest head the flash kernels take (their tiles live in shared memory).
inline constexpr int kMaxFlashHeadDim = 128;

// The tiling the CUDA kernels use for head width D and storage type S (they launch exactly these):
// tensor-core tiles for 16-bit S and D a multiple of 16, plain-FMA tiles otherwise. Throws
// zinf::Error for a head wider than kMaxFlashHeadDim.
TiledAttention cuda_tiling(int D, DType S);

// out (stride o_stride) = softmax(q·kᵀ·scale, causal)·v with scale = 1/√D; lse [B, H, T] = the
// natural log of Σ exp(scaled score) per row (the only state kept for backward).
void tiled_attention_forward(ChunkPool& p, float* out, float* lse, const float* q, const float* k, const float* v,
                             const AttnShapeCpu& a, const TiledAttention& tiling);
// Writes (=) dq, dk, dv (rows of stride q/k/v_stride; dout has stride o_stride). Each key/value
// head's gradient sums its query heads in head order.
void tiled_attention_backward(ChunkPool& p, float* dq, float* dk, float* dv, const float* dout, const float* q,
                              const float* k, const float* v, const float* out, const float* lse, const AttnShapeCpu& a,
                              const TiledAttention& tiling);

}  // namespace zinf::ops
