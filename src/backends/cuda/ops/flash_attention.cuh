// flash_attention.cuh — one causal attention for both model families on the fast path (namespace
// zinf::cuda::fast), given row strides so GPT's packed qkv [B,T,3C] and Llama's separate q/k/v (GQA)
// both fit. `void*` data is of dtype S; lse is fp32 [B,H,T]. scale = 1/sqrt(D) computed as
// 1.0f / std::sqrt(float(D)) on the host, the same float the CPU uses.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "model/tensor.h"

namespace zinf::cuda::fast {

struct AttnShape {
  int B, T, H, KV, D;
  long q_stride, k_stride, v_stride, o_stride;  // row strides in elements
};
void flash_attention_forward(void* out, float* lse, const void* q, const void* k, const void* v, const AttnShape& a,
                             DType S, cudaStream_t s);
// writes (=) dq, dk, dv (rows of stride q/k/v_stride); scratch: flash_backward_scratch_bytes(a) bytes
void flash_attention_backward(void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k,
                              const void* v, const void* out, const float* lse, const AttnShape& a, DType S,
                              void* scratch, cudaStream_t s);
std::size_t flash_backward_scratch_bytes(const AttnShape& a);

}  // namespace zinf::cuda::fast
