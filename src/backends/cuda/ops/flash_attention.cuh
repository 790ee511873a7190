// flash_attention.cuh — causal attention for the 16-bit fast path, both model families, without the
// [T, T] probability matrix: the forward keeps the per-row log-sum-exp lse [B, H, T] (fp32) and the
// backward recomputes the probabilities from it. Row strides let GPT's packed qkv [B, T, 3C] (q = qkv,
// k = qkv + C, v = qkv + 2C, strides 3C, KV = H) and Llama's separate q [R, H·D], k, v [R, KV·D]
// (query head h reads key/value head h / (H / KV)) use the same kernels.
//
// Data pointers hold S (fp32, fp16 or bf16) unless named fp32; products run on tensor cores (wmma
// 16×16×16, fp32 accumulators) for 16-bit S and D a multiple of 16, on plain FMA tiles otherwise; the
// softmax is fp32. The tiles, the order of the key blocks and the rounding of the P and dS tiles to S
// are those of the CPU twin, cpu/ops_attention_tiled.h (cuda_tiling gives the tiles launched here).
// Deterministic: no atomics, every sum has one owner. Head widths up to 128; wider throw zinf::Error.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "cpu/ops_attention_tiled.h"
#include "model/tensor.h"

namespace zinf::cuda::fast {

// B, T, H, KV, D and the row strides in elements of q, k, v and out (dout has out's stride).
using AttnShape = ::zinf::ops::AttnShapeCpu;

// out (stride o_stride) = softmax(q·kᵀ / √D, causal, within a.W keys when a.W > 0)·v;  lse [B, H, T] fp32.
void flash_attention_forward(void* out, float* lse, const void* q, const void* k, const void* v, const AttnShape& a,
                             DType S, cudaStream_t s);
// Writes (=) dq, dk, dv (rows of stride q/k/v_stride); scratch: flash_backward_scratch_bytes(a) bytes.
// dq, dk and dv may be the three parts of one packed buffer (they do not overlap).
void flash_attention_backward(void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k,
                              const void* v, const void* out, const float* lse, const AttnShape& a, DType S,
                              void* scratch, cudaStream_t s);
std::size_t flash_backward_scratch_bytes(const AttnShape& a);

}  // namespace zinf::cuda::fast
