// encoder.cu — embedding lookups.
#include "cuda/cuda_check.cuh"
#include "cuda/ops/encoder.cuh"

namespace zinf::cuda::ops {
namespace {
__global__ void enc_fwd(float* out, const int* tokens, const float* wte, const float* wpe, int R, int T, int C) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<std::size_t>(R) * C) return;
  const std::size_t r = i / C, c = i % C;
  out[i] = wte[static_cast<std::size_t>(tokens[r]) * C + c] + wpe[(r % T) * C + c];
}
__global__ void enc_bwd(float* dwte, float* dwpe, const float* dout, const int* tokens, int R, int T, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (int r = 0; r < R; ++r) {
    const float d = dout[static_cast<std::size_t>(r) * C + c];
    dwte[static_cast<std::size_t>(tokens[r]) * C + c] += d;
    dwpe[static_cast<std::size_t>(r % T) * C + c] += d;
  }
}
}  // namespace
void launch_encoder_forward(float* out, const int* tokens, const float* wte, const float* wpe, int B, int T, int C,
                            cudaStream_t s) {
  cuda::launch(enc_fwd, blocks_for(static_cast<std::size_t>(B) * T * C, 256), 256, 0, s, out, tokens, wte, wpe, B * T,
               T, C);
  ZINF_CUDA_LAUNCH_CHECK("encoder_forward");
}
void launch_encoder_backward(float* dwte, float* dwpe, const float* dout, const int* tokens, int B, int T, int C,
                             cudaStream_t s) {
  cuda::launch(enc_bwd, blocks_for(C, 64), 64, 0, s, dwte, dwpe, dout, tokens, B * T, T, C);
  ZINF_CUDA_LAUNCH_CHECK("encoder_backward");
}
}  // namespace zinf::cuda::ops
