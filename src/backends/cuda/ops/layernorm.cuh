// layernorm.cuh — LayerNorm (eps 1e-5) forward and backward; shapes as in cpu/ops_gpt.h.
#pragma once
#include <cuda_runtime.h>
namespace zinf::cuda::ops {
void launch_layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                              int R, int C, cudaStream_t s);
// dinp += …; dw += …; db += …
void launch_layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                               const float* mean, const float* rstd, int R, int C, cudaStream_t s);
}  // namespace zinf::cuda::ops
