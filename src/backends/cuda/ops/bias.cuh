// bias.cuh — out[r, o] += bias[o]; acc[c] += Σ_r x[r, c] (rows in order, one thread per column).
#pragma once
#include <cuda_runtime.h>
namespace zinf::cuda::ops {
void launch_add_bias(float* out, const float* bias, int R, int OC, cudaStream_t s);
void launch_column_sum(float* acc, const float* x, int R, int C, cudaStream_t s);
}  // namespace zinf::cuda::ops
