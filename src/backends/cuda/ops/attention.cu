// attention.cu — one thread per (batch, head, query row) forward; backward in two passes so every
// sum has one owner: rows (dq, and the softmax gradient into scratch), then columns (dk, dv).
#include "cuda/cuda_check.cuh"
#include "cuda/ops/attention.cuh"

namespace zinf::cuda::ops {
namespace {
__device__ inline std::size_t qkv_at(int b, int t, int part, int h, int T, int C, int hs) {
  return (static_cast<std::size_t>(b) * T + t) * 3 * C + static_cast<std::size_t>(part) * C +
         static_cast<std::size_t>(h) * hs;
}
__global__ void attn_fwd(float* out, float* att, const float* qkv, int B, int T, int C, int H) {
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= B * H * T) return;
  const int t = idx % T, h = (idx / T) % H, b = idx / (T * H);
  const int hs = C / H;
  const float scale = 1.0f / sqrtf(static_cast<float>(hs));
  const float* q = qkv + qkv_at(b, t, 0, h, T, C, hs);
  float* a = att + ((static_cast<std::size_t>(b) * H + h) * T + t) * T;
  float mx = -INFINITY;
  for (int s = 0; s <= t; ++s) {
    const float* k = qkv + qkv_at(b, s, 1, h, T, C, hs);
    float d = 0;
    for (int i = 0; i < hs; ++i) d += q[i] * k[i];
    a[s] = d * scale;
    mx = fmaxf(mx, a[s]);
  }
  float sum = 0;
  for (int s = 0; s <= t; ++s) {
    a[s] = expf(a[s] - mx);
    sum += a[s];
  }
  const float inv = 1.0f / sum;
  for (int s = 0; s <= t; ++s) a[s] *= inv;
  for (int s = t + 1; s < T; ++s) a[s] = 0;
  float* o = out + (static_cast<std::size_t>(b) * T + t) * C + static_cast<std::size_t>(h) * hs;
  for (int i = 0; i < hs; ++i) {
    float acc = 0;
    for (int s = 0; s <= t; ++s) acc += a[s] * qkv[qkv_at(b, s, 2, h, T, C, hs) + i];
    o[i] = acc;
  }
}
// Rows: dpre[t][s] = a[t][s]·(dy_t·v_s − Σ_s' a[t][s'] dy_t·v_s')·scale into scratch; dq_t = Σ_s dpre·k_s.
__global__ void attn_bwd_rows(float* dqkv, float* dpre, const float* dout, const float* qkv, const float* att, int B,
                              int T, int C, int H) {
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= B * H * T) return;
  const int t = idx % T, h = (idx / T) % H, b = idx / (T * H);
  const int hs = C / H;
  const float scale = 1.0f / sqrtf(static_cast<float>(hs));
  const float* a = att + ((static_cast<std::size_t>(b) * H + h) * T + t) * T;
  float* dp = dpre + ((static_cast<std::size_t>(b) * H + h) * T + t) * T;
  const float* dy = dout + (static_cast<std::size_t>(b) * T + t) * C + static_cast<std::size_t>(h) * hs;
  float dot = 0;
  for (int s = 0; s <= t; ++s) {
    const float* v = qkv + qkv_at(b, s, 2, h, T, C, hs);
    float d = 0;
    for (int i = 0; i < hs; ++i) d += dy[i] * v[i];
    dp[s] = d;
    dot += a[s] * d;
  }
  for (int s = 0; s <= t; ++s) dp[s] = a[s] * (dp[s] - dot) * scale;
  for (int s = t + 1; s < T; ++s) dp[s] = 0;
  float* dq = dqkv + qkv_at(b, t, 0, h, T, C, hs);
  for (int i = 0; i < hs; ++i) {
    float acc = 0;
    for (int s = 0; s <= t; ++s) acc += dp[s] * qkv[qkv_at(b, s, 1, h, T, C, hs) + i];
    dq[i] = acc;
  }
}
// Columns: dk_s = Σ_{t≥s} dpre[t][s]·q_t; dv_s = Σ_{t≥s} a[t][s]·dy_t.
__global__ void attn_bwd_cols(float* dqkv, const float* dpre, const float* dout, const float* qkv, const float* att,
                              int B, int T, int C, int H) {
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= B * H * T) return;
  const int s = idx % T, h = (idx / T) % H, b = idx / (T * H);
  const int hs = C / H;
  const std::size_t base = (static_cast<std::size_t>(b) * H + h) * T;
  float* dk = dqkv + qkv_at(b, s, 1, h, T, C, hs);
  float* dv = dqkv + qkv_at(b, s, 2, h, T, C, hs);
  for (int i = 0; i < hs; ++i) {
    float gk = 0, gv = 0;
    for (int t = s; t < T; ++t) {
      gk += dpre[(base + t) * T + s] * qkv[qkv_at(b, t, 0, h, T, C, hs) + i];
      gv += att[(base + t) * T + s] *
            dout[(static_cast<std::size_t>(b) * T + t) * C + static_cast<std::size_t>(h) * hs + i];
    }
    dk[i] = gk;
    dv[i] = gv;
  }
}
}  // namespace
void launch_attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int H, cudaStream_t s) {
  cuda::launch(attn_fwd, blocks_for(static_cast<std::size_t>(B) * H * T, 64), 64, 0, s, out, att, qkv, B, T, C, H);
  ZINF_CUDA_LAUNCH_CHECK("attention_forward");
}
void launch_attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* att,
                               int B, int T, int C, int H, cudaStream_t s) {
  const unsigned n = blocks_for(static_cast<std::size_t>(B) * H * T, 64);
  cuda::launch(attn_bwd_rows, n, 64, 0, s, dqkv, scratch, dout, qkv, att, B, T, C, H);
  ZINF_CUDA_LAUNCH_CHECK("attention_backward_rows");
  cuda::launch(attn_bwd_cols, n, 64, 0, s, dqkv, scratch, dout, qkv, att, B, T, C, H);
  ZINF_CUDA_LAUNCH_CHECK("attention_backward_cols");
}
}  // namespace zinf::cuda::ops
