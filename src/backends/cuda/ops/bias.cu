// bias.cu — bias add and deterministic column sums (bias and LayerNorm gradients).
#include "cuda/cuda_check.cuh"
#include "cuda/ops/bias.cuh"

namespace zinf::cuda::ops {
namespace {
__global__ void add_bias_kernel(float* out, const float* bias, int R, int OC) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < static_cast<std::size_t>(R) * OC) out[i] += bias[i % OC];
}
__global__ void column_sum_kernel(float* acc, const float* x, int R, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float s = acc[c];
  for (int r = 0; r < R; ++r) s += x[static_cast<std::size_t>(r) * C + c];
  acc[c] = s;
}
}  // namespace
void launch_add_bias(float* out, const float* bias, int R, int OC, cudaStream_t s) {
  cuda::launch(add_bias_kernel, blocks_for(static_cast<std::size_t>(R) * OC, 256), 256, 0, s, out, bias, R, OC);
  ZINF_CUDA_LAUNCH_CHECK("add_bias");
}
void launch_column_sum(float* acc, const float* x, int R, int C, cudaStream_t s) {
  cuda::launch(column_sum_kernel, blocks_for(C, 128), 128, 0, s, acc, x, R, C);
  ZINF_CUDA_LAUNCH_CHECK("column_sum");
}
}  // namespace zinf::cuda::ops
