// llama.cuh — the Llama family's ops on the GPU (shapes and semantics as in cpu/ops_llama.h): RMSNorm,
// rotary positions, SwiGLU, grouped-query causal attention, token embedding without positions. Every
// reduction has one owner thread that sums in a fixed order, so results are deterministic.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

namespace zinf::cuda::ops {
void launch_rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int R, int C, float eps,
                            cudaStream_t s);
// dinp += …; dw += …
void launch_rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                             const float* rstd, int R, int C, cudaStream_t s);
void launch_rope_apply(float* x, const float* cos_t, const float* sin_t, int R, int T, int heads, int D, bool backward,
                       cudaStream_t s);
void launch_swiglu_forward(float* out, const float* gate, const float* up, std::size_t n, cudaStream_t s);
void launch_swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                            std::size_t n, cudaStream_t s);
// W: the sliding window (0: none), as in ops_llama.h.
void launch_gqa_attention_forward(float* out, float* att, const float* q, const float* k, const float* v, int B, int T,
                                  int H, int KV, int D, int W, cudaStream_t s);
// weighted: scratch of B·H·T floats. Writes (=) dq, dk, dv.
void launch_gqa_attention_backward(float* dq, float* dk, float* dv, float* weighted, const float* dout, const float* q,
                                   const float* k, const float* v, const float* att, int B, int T, int H, int KV, int D,
                                   int W, cudaStream_t s);
// Generation's attention over a key/value cache (ops_llama.h, attention_decode); scores: scratch of
// Q·H·(pos + Q) floats.
void launch_attention_decode(float* out, float* scores, const float* q, const float* k, const float* v, int Q, int pos,
                             int H, int KV, int D, int q_stride, int kv_stride, cudaStream_t s);
void launch_embedding_forward(float* out, const int* tokens, const float* wte, int R, int C, cudaStream_t s);
// dwte += …
void launch_embedding_backward(float* dwte, const float* dout, const int* tokens, int R, int C, cudaStream_t s);
}  // namespace zinf::cuda::ops
