// layernorm.cu — one thread per row for the row statistics and dinp; one thread per column for the
// weight and bias gradients (rows in order), so nothing depends on scheduling.
#include "cuda/cuda_check.cuh"
#include "cuda/ops/layernorm.cuh"

namespace zinf::cuda::ops {
namespace {
__global__ void ln_forward_kernel(float* out, float* mean, float* rstd, const float* inp, const float* w,
                                  const float* b, int R, int C) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= R) return;
  const float* x = inp + static_cast<std::size_t>(r) * C;
  float m = 0;
  for (int i = 0; i < C; ++i) m += x[i];
  m /= C;
  float v = 0;
  for (int i = 0; i < C; ++i) v += (x[i] - m) * (x[i] - m);
  v /= C;
  const float s = 1.0f / sqrtf(v + 1e-5f);
  float* o = out + static_cast<std::size_t>(r) * C;
  for (int i = 0; i < C; ++i) o[i] = (x[i] - m) * s * w[i] + b[i];
  mean[r] = m;
  rstd[r] = s;
}
// One thread per row, the loop of the CPU reference (src/backends/cpu/ops_gpt.cpp) line for line, so the
// two agree to rounding.
__global__ void ln_backward_rows(float* dinp, const float* dout, const float* inp, const float* w, const float* mean,
                                 const float* rstd, int R, int C) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= R) return;
  const float* x = inp + static_cast<std::size_t>(r) * C;
  const float* dy = dout + static_cast<std::size_t>(r) * C;
  float* dx = dinp + static_cast<std::size_t>(r) * C;
  const float m = mean[r], s = rstd[r];
  float a = 0, bsum = 0;
  for (int i = 0; i < C; ++i) {
    const float dn = w[i] * dy[i];
    a += dn;
    bsum += dn * (x[i] - m) * s;
  }
  a /= C;
  bsum /= C;
  for (int i = 0; i < C; ++i) dx[i] += (w[i] * dy[i] - a - (x[i] - m) * s * bsum) * s;
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
