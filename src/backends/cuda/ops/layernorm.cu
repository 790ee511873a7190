// layernorm.cu — one thread per row for the row statistics and dinp; one thread per column for the
// weight and bias gradients (rows in order), so nothing depends on scheduling.
#include "cpu/reference_rows.h"
#include "cuda/cuda_check.cuh"
#include "cuda/ops/layernorm.cuh"

namespace zinf::cuda::ops {
namespace {
__global__ void ln_forward_kernel(float* out, float* mean, float* rstd, const float* inp, const float* w,
                                  const float* b, int R, int C) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= R) return;
  const std::size_t at = static_cast<std::size_t>(r) * C;
  reference_rows::layernorm_forward(out + at, mean[r], rstd[r], inp + at, w, b, C);
}
// One thread per row, the row of the CPU reference (cpu/reference_rows.h), so the two agree to rounding.
__global__ void ln_backward_rows(float* dinp, const float* dout, const float* inp, const float* w, const float* mean,
                                 const float* rstd, int R, int C) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= R) return;
  const std::size_t at = static_cast<std::size_t>(r) * C;
  reference_rows::layernorm_backward(dinp + at, dout + at, inp + at, w, mean[r], rstd[r], C);
}
__global__ void ln_backward_cols(float* dw, float* db, const float* dout, const float* inp, const float* mean,
                                 const float* rstd, int R, int C) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= C) return;
  float gw = dw[i], gb = db[i];
  for (int r = 0; r < R; ++r) {
    const float dy = dout[static_cast<std::size_t>(r) * C + i];
    gb += dy;
    gw += (inp[static_cast<std::size_t>(r) * C + i] - mean[r]) * rstd[r] * dy;
  }
  dw[i] = gw;
  db[i] = gb;
}
}  // namespace
void launch_layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                              int R, int C, cudaStream_t s) {
  cuda::launch(ln_forward_kernel, blocks_for(R, 128), 128, 0, s, out, mean, rstd, inp, w, b, R, C);
  ZINF_CUDA_LAUNCH_CHECK("layernorm_forward");
}
void launch_layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                               const float* mean, const float* rstd, int R, int C, cudaStream_t s) {
  cuda::launch(ln_backward_rows, blocks_for(R, 128), 128, 0, s, dinp, dout, inp, w, mean, rstd, R, C);
  ZINF_CUDA_LAUNCH_CHECK("layernorm_backward_rows");
  cuda::launch(ln_backward_cols, blocks_for(C, 128), 128, 0, s, dw, db, dout, inp, mean, rstd, R, C);
  ZINF_CUDA_LAUNCH_CHECK("layernorm_backward_cols");
}
}  // namespace zinf::cuda::ops
