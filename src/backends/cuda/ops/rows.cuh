// rows.cuh — the fast path's row, column and elementwise kernels on 16-bit or fp32 storage.
//
// Every `void*` tensor is of the storage dtype S (fp32, bf16 or fp16) unless its name or type says
// fp32. Each kernel widens its inputs to fp32, computes in fp32 and rounds every output element once
// to S (round to nearest even, by cpu_adam/spec.h's rule: cuda/round16.cuh); an output that
// accumulates (+=) is read, added to in fp32 and rounded once. Semantics (which outputs accumulate,
// LayerNorm's eps 1e-5, GELU's tanh form, RoPE's pairs (i, i + D/2) at position r mod T, SwiGLU's
// silu(gate)·up) are those of the CPU reference ops (cpu/ops_gpt.h, cpu/ops_llama.h).
//
// Nothing here uses atomics: every sum has one owner that adds in a fixed order, so the bits do not
// depend on scheduling. Cross-row sums (norm weight gradients, column_sum) run in two passes: fixed
// row chunks into `partials`, then the chunks in order. The embedding gradients sort the rows by
// token (stable) so that one owner per (token, column) adds its rows in row order.
//
// All launchers enqueue on stream `s` and return at once when there is nothing to do (n = 0, R = 0).
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
// dinp += …; dw += … (dw fp32). partials: column_partials_floats(R, C) floats of scratch
void rmsnorm_backward(void* dinp, float* dw, const void* dout, const void* inp, const void* w, const float* rstd, int R,
                      int C, DType S, float* partials, cudaStream_t s);
// Scratch (floats) for the two-pass column sums of R rows by C columns (room for two sums at once).
std::size_t column_partials_floats(int R, int C);
// acc[c] += Σ_r x[r, c] (acc fp32)
void column_sum(float* acc, const void* x, int R, int C, DType S, float* partials, cudaStream_t s);
// out[r, c] += bias[c]
void add_bias(void* out, const void* bias, int R, int C, DType S, cudaStream_t s);
// The unfused end of a GEMM with a bias (and GELU) epilogue, from its fp32 result acc [R, C]:
// v = acc + bias (bias may be null); gelu: pre = v, out = gelu(v); else out = v — each rounded once.
void bias_act_from_fp32(void* pre, void* out, const float* acc, const void* bias, int R, int C, bool gelu, DType S,
                        cudaStream_t s);
void gelu_forward(void* out, const void* inp, std::size_t n, DType S, cudaStream_t s);
// dinp = gelu'(inp)·dout
void gelu_backward(void* dinp, const void* inp, const void* dout, std::size_t n, DType S, cudaStream_t s);
// acc += x
void add_inplace(void* acc, const void* x, std::size_t n, DType S, cudaStream_t s);
void swiglu_forward(void* out, const void* gate, const void* up, std::size_t n, DType S, cudaStream_t s);
// dgate = …, dup = … (written)
void swiglu_backward(void* dgate, void* dup, const void* dout, const void* gate, const void* up, std::size_t n, DType S,
                     cudaStream_t s);
// x [R, heads·D] rotated in place; cos_t, sin_t [T, D/2] fp32
void rope_apply(void* x, const float* cos_t, const float* sin_t, int R, int T, int heads, int D, bool backward, DType S,
                cudaStream_t s);
void encoder_forward(void* out, const int* tokens, const void* wte, const void* wpe, int B, int T, int C, DType S,
                     cudaStream_t s);
// dwte += …; dwpe += … (fp32). sort_scratch: token_sort_ints(B·T) ints
void encoder_backward(float* dwte, float* dwpe, const void* dout, const int* tokens, int B, int T, int C, DType S,
                      int* sort_scratch, cudaStream_t s);
void embedding_forward(void* out, const int* tokens, const void* wte, int R, int C, DType S, cudaStream_t s);
// dwte += … (fp32). sort_scratch: token_sort_ints(R) ints
void embedding_backward(float* dwte, const void* dout, const int* tokens, int R, int C, DType S, int* sort_scratch,
                        cudaStream_t s);
// Scratch (ints) for the deterministic embedding backward of R rows.
std::size_t token_sort_ints(int R);
// logits [R,V] (S) → probs in place (S), losses[r] fp32; one pass with an online max for the loss. Rows are
// `ld` ≥ V elements apart (model/backend.h, logits_row_stride); elements V..ld−1 of a row are neither read
// nor written.
void softmax_crossentropy(void* probs, float* losses, const int* targets, int R, int V, int ld, DType S,
                          cudaStream_t s);
// dlogits = (probs − onehot)·dscale (written; may be the same buffer as probs); both with rows `ld` apart,
// as softmax_crossentropy's
void crossentropy_backward(void* dlogits, const void* probs, const int* targets, float dscale, int R, int V, int ld,
                           DType S, cudaStream_t s);
// dst = src converted (rounded once to dst_t); a plain copy when the dtypes match
void convert(void* dst, DType dst_t, const void* src, DType src_t, std::size_t n, cudaStream_t s);

}  // namespace zinf::cuda::fast
