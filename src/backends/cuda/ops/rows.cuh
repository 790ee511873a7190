// rows.cuh — the fast path's row, column and elementwise kernels on 16-bit or fp32 storage (namespace
// zinf::cuda::fast). `void*` data is of dtype S unless the name says fp32; every launcher runs on
// stream `s` without atomics (deterministic) and returns at once for n = 0 / R = 0.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "model/tensor.h"

namespace zinf::cuda::fast {

void layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const void* w, const void* b, int R, int C,
                       DType S, cudaStream_t s);
// dinp += …; dw += …; db += … (dw, db fp32). partials: column_partials_floats(R, C) floats of scratch
void layernorm_backward(void* dinp, float* dw, float* db, const void* dout, const void* inp, const void* w,
                        const float* mean, const float* rstd, int R, int C, DType S, float* partials, cudaStream_t s);
void rmsnorm_forward(void* out, float* rstd, const void* inp, const void* w, int R, int C, float eps, DType S,
                     cudaStream_t s);
void rmsnorm_backward(void* dinp, float* dw, const void* dout, const void* inp, const void* w, const float* rstd, int R,
                      int C, DType S, float* partials, cudaStream_t s);
std::size_t column_partials_floats(int R, int C);  // scratch for the two-pass column sums
void column_sum(float* acc, const void* x, int R, int C, DType S, float* partials,
                cudaStream_t s);  // acc[c] += Σ_r x[r,c]
void add_bias(void* out, const void* bias, int R, int C, DType S, cudaStream_t s);
void gelu_forward(void* out, const void* inp, std::size_t n, DType S, cudaStream_t s);
void gelu_backward(void* dinp, const void* inp, const void* dout, std::size_t n, DType S, cudaStream_t s);
void add_inplace(void* acc, const void* x, std::size_t n, DType S, cudaStream_t s);
void swiglu_forward(void* out, const void* gate, const void* up, std::size_t n, DType S, cudaStream_t s);
void swiglu_backward(void* dgate, void* dup, const void* dout, const void* gate, const void* up, std::size_t n, DType S,
                     cudaStream_t s);
void rope_apply(void* x, const float* cos_t, const float* sin_t, int R, int T, int heads, int D, bool backward, DType S,
                cudaStream_t s);
void encoder_forward(void* out, const int* tokens, const void* wte, const void* wpe, int B, int T, int C, DType S,
                     cudaStream_t s);
void encoder_backward(float* dwte, float* dwpe, const void* dout, const int* tokens, int B, int T, int C, DType S,
                      int* sort_scratch, cudaStream_t s);
void embedding_forward(void* out, const int* tokens, const void* wte, int R, int C, DType S, cudaStream_t s);
void embedding_backward(float* dwte, const void* dout, const int* tokens, int R, int C, DType S, int* sort_scratch,
                        cudaStream_t s);
std::size_t token_sort_ints(int R);  // scratch for the deterministic embedding backward
// logits [R,V] (S) → probs in place (S), losses[r] fp32; one pass with an online max for the loss
void softmax_crossentropy(void* probs, float* losses, const int* targets, int R, int V, DType S, cudaStream_t s);
void crossentropy_backward(void* dlogits, const void* probs, const int* targets, float dscale, int R, int V, DType S,
                           cudaStream_t s);
void convert(void* dst, DType dst_t, const void* src, DType src_t, std::size_t n, cudaStream_t s);

}  // namespace zinf::cuda::fast
