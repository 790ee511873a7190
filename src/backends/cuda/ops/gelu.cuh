// gelu.cuh — GELU (tanh form) forward/backward and the elementwise residual add.
#pragma once
#include <cuda_runtime.h>
#include <cstddef>
namespace zinf::cuda::ops {
void launch_gelu_forward(float* out, const float* inp, std::size_t n, cudaStream_t s);
void launch_gelu_backward(float* dinp, const float* inp, const float* dout, std::size_t n, cudaStream_t s);  // dinp = …
void launch_add_inplace(float* acc, const float* x, std::size_t n, cudaStream_t s);                          // acc += x
}  // namespace zinf::cuda::ops
