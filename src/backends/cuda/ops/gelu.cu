// gelu.cu — elementwise kernels.
#include "cuda/cuda_check.cuh"
#include "cuda/ops/gelu.cuh"

namespace zinf::cuda::ops {
namespace {
constexpr float kScale = 0.7978845608028654f;
__global__ void gelu_fwd(float* out, const float* inp, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float x = inp[i];
  out[i] = 0.5f * x * (1.0f + tanhf(kScale * (x + 0.044715f * x * x * x)));
}
__global__ void gelu_bwd(float* dinp, const float* inp, const float* dout, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float x = inp[i];
  const float t = tanhf(kScale * (x + 0.044715f * x * x * x));
  const float local = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kScale * (1.0f + 3.0f * 0.044715f * x * x);
  dinp[i] = local * dout[i];
}
__global__ void add_kernel(float* acc, const float* x, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) acc[i] += x[i];
}
}  // namespace
void launch_gelu_forward(float* out, const float* inp, std::size_t n, cudaStream_t s) {
  cuda::launch(gelu_fwd, blocks_for(n, 256), 256, 0, s, out, inp, n);
  ZINF_CUDA_LAUNCH_CHECK("gelu_forward");
}
void launch_gelu_backward(float* dinp, const float* inp, const float* dout, std::size_t n, cudaStream_t s) {
  cuda::launch(gelu_bwd, blocks_for(n, 256), 256, 0, s, dinp, inp, dout, n);
  ZINF_CUDA_LAUNCH_CHECK("gelu_backward");
}
void launch_add_inplace(float* acc, const float* x, std::size_t n, cudaStream_t s) {
  cuda::launch(add_kernel, blocks_for(n, 256), 256, 0, s, acc, x, n);
  ZINF_CUDA_LAUNCH_CHECK("add_inplace");
}
}  // namespace zinf::cuda::ops
