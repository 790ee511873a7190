// llama.cu — the Llama family's kernels (llama.cuh): one thread per row for RMSNorm and the attention
// rows, one per column for the weight gradients and the embedding gradient (rows in order), one per
// key position for the key/value gradients (query heads and positions in order).
#include <cmath>

#include "cpu/reference_rows.h"
#include "cuda/cuda_check.cuh"
#include "cuda/ops/llama.cuh"

namespace zinf::cuda::ops {
namespace {

struct DeviceExp {
  ZINF_HD float operator()(float x) const { return expf(x); }
};

__global__ void rmsnorm_forward_kernel(float* out, float* rstd, const float* inp, const float* w, int R, int C,
                                       float eps) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= R) return;
  const std::size_t at = static_cast<std::size_t>(r) * C;
  rstd[r] = reference_rows::rmsnorm_forward(out + at, inp + at, w, C, eps);
}
// One thread per row, the row of the CPU reference (cpu/reference_rows.h), as LayerNorm's in layernorm.cu.
__global__ void rmsnorm_backward_rows(float* dinp, const float* dout, const float* inp, const float* w,
                                      const float* rstd, int R, int C) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= R) return;
  const std::size_t at = static_cast<std::size_t>(r) * C;
  reference_rows::rmsnorm_backward(dinp + at, dout + at, inp + at, w, rstd[r], C);
}
__global__ void rmsnorm_backward_cols(float* dw, const float* dout, const float* inp, const float* rstd, int R, int C) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= C) return;
  float g = dw[i];
  for (int r = 0; r < R; ++r)
    g += inp[static_cast<std::size_t>(r) * C + i] * rstd[r] * dout[static_cast<std::size_t>(r) * C + i];
  dw[i] = g;
}
__global__ void rope_kernel(float* x, const float* cos_t, const float* sin_t, int R, int T, int heads, int D,
                            float sign) {
  const int half = D / 2;
  const std::size_t n = static_cast<std::size_t>(R) * heads * half;
  const std::size_t idx = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n) return;
  const int i = static_cast<int>(idx % half);
  const std::size_t rh = idx / half;  // row · heads + head
  const int r = static_cast<int>(rh / heads);
  const std::size_t t = static_cast<std::size_t>(r % T);
  float* v = x + rh * D;
  const float co = cos_t[t * half + i], si = sign * sin_t[t * half + i];
  const float a = v[i], b = v[i + half];
  v[i] = a * co - b * si;
  v[i + half] = b * co + a * si;
}
__global__ void swiglu_forward_kernel(float* out, const float* gate, const float* up, std::size_t n) {
  const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float g = gate[i], sig = 1.0f / (1.0f + expf(-g));
  out[i] = g * sig * up[i];
}
__global__ void swiglu_backward_kernel(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                                       std::size_t n) {
  const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float g = gate[i], sig = 1.0f / (1.0f + expf(-g)), silu = g * sig;
  dup[i] = dout[i] * silu;
  dgate[i] = dout[i] * up[i] * (sig + silu * (1.0f - sig));
}
// One thread per (batch, head, query position).
__global__ void gqa_forward_kernel(float* out, float* att, const float* q, const float* k, const float* v, int B, int T,
                                   int H, int KV, int D, int W, float scale) {
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= B * H * T) return;
  const int t = idx % T, h = (idx / T) % H, b = idx / (T * H), j = h / (H / KV);
  const std::size_t qw = static_cast<std::size_t>(H) * D, kw = static_cast<std::size_t>(KV) * D;
  const std::size_t row = (static_cast<std::size_t>(b) * T + t) * qw + static_cast<std::size_t>(h) * D;
  const std::size_t kv0 = static_cast<std::size_t>(b) * T * kw + static_cast<std::size_t>(j) * D;
  reference_rows::gqa_forward_row(out + row, att + ((static_cast<std::size_t>(b) * H + h) * T + t) * T, q + row,
                                  k + kv0, v + kv0, kw, t, T, D, W, scale, DeviceExp{});
}
// One thread per (query row, head), in the CPU reference's order; `scores` holds each thread's
// pos + Q scores (Q·H rows of that length).
__global__ void attention_decode_kernel(float* out, float* scores, const float* q, const float* k, const float* v,
                                        int Q, int pos, int H, int KV, int D, int q_stride, int kv_stride,
                                        float scale) {
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= Q * H) return;
  const int t = idx / H, h = idx % H, j = h / (H / KV), n = pos + t + 1, L = pos + Q;
  const float* qt = q + static_cast<std::size_t>(t) * q_stride + static_cast<std::size_t>(h) * D;
  float* a = scores + static_cast<std::size_t>(idx) * L;
  float maxv = -INFINITY;
  for (int s = 0; s < n; ++s) {
    const float* ks = k + static_cast<std::size_t>(s) * kv_stride + static_cast<std::size_t>(j) * D;
    float dot = 0;
    for (int i = 0; i < D; ++i) dot += qt[i] * ks[i];
    a[s] = dot * scale;
    maxv = fmaxf(maxv, a[s]);
  }
  float sum = 0;
  for (int s = 0; s < n; ++s) sum += (a[s] = expf(a[s] - maxv));
  const float inv = 1.0f / sum;
  for (int s = 0; s < n; ++s) a[s] *= inv;
  float* o = out + static_cast<std::size_t>(t) * H * D + static_cast<std::size_t>(h) * D;
  for (int i = 0; i < D; ++i) {  // each output summed over s in ascending order, in a register
    float acc = 0;
    for (int s = 0; s < n; ++s)
      acc += a[s] * v[static_cast<std::size_t>(s) * kv_stride + static_cast<std::size_t>(j) * D + i];
    o[i] = acc;
  }
}
// dq and Σ_s a·datt per (batch, head, query position).
__global__ void gqa_backward_queries(float* dq, float* weighted, const float* dout, const float* q, const float* k,
                                     const float* v, const float* att, int B, int T, int H, int KV, int D, int W,
                                     float scale) {
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= B * H * T) return;
  const int t = idx % T, h = (idx / T) % H, b = idx / (T * H), j = h / (H / KV);
  const int lo = W > 0 ? max(0, t - W + 1) : 0;  // the first key in the window
  const std::size_t qw = static_cast<std::size_t>(H) * D, kw = static_cast<std::size_t>(KV) * D,
                    row = static_cast<std::size_t>(b) * T + t;
  const float* a = att + ((static_cast<std::size_t>(b) * H + h) * T + t) * T;
  const float* dy = dout + row * qw + static_cast<std::size_t>(h) * D;
  float w = 0;
  for (int s = lo; s <= t; ++s) {
    const float* vs = v + (static_cast<std::size_t>(b) * T + s) * kw + static_cast<std::size_t>(j) * D;
    float d = 0;
    for (int i = 0; i < D; ++i) d += dy[i] * vs[i];
    w += a[s] * d;
  }
  weighted[idx] = w;
  float* dqt = dq + row * qw + static_cast<std::size_t>(h) * D;
  for (int i = 0; i < D; ++i) dqt[i] = 0;
  for (int s = lo; s <= t; ++s) {
    const std::size_t srow = static_cast<std::size_t>(b) * T + s;
    const float* vs = v + srow * kw + static_cast<std::size_t>(j) * D;
    const float* ks = k + srow * kw + static_cast<std::size_t>(j) * D;
    float d = 0;
    for (int i = 0; i < D; ++i) d += dy[i] * vs[i];
    const float dpre = a[s] * (d - w) * scale;
    for (int i = 0; i < D; ++i) dqt[i] += dpre * ks[i];
  }
}
// dk and dv per (batch, key/value head, key position): query heads of the group, then positions, in order.
__global__ void gqa_backward_keys(float* dk, float* dv, const float* weighted, const float* dout, const float* q,
                                  const float* v, const float* att, int B, int T, int H, int KV, int D, int W,
                                  float scale) {
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= B * KV * T) return;
  const int s = idx % T, j = (idx / T) % KV, b = idx / (T * KV), group = H / KV;
  const std::size_t qw = static_cast<std::size_t>(H) * D, kw = static_cast<std::size_t>(KV) * D,
                    srow = static_cast<std::size_t>(b) * T + s;
  float* dks = dk + srow * kw + static_cast<std::size_t>(j) * D;
  float* dvs = dv + srow * kw + static_cast<std::size_t>(j) * D;
  const float* vs = v + srow * kw + static_cast<std::size_t>(j) * D;
  for (int i = 0; i < D; ++i) dks[i] = dvs[i] = 0;
  for (int h = j * group; h < (j + 1) * group; ++h)
    for (int t = s; t < (W > 0 ? min(T, s + W) : T); ++t) {  // the queries whose window holds s
      const std::size_t row = static_cast<std::size_t>(b) * T + t;
      const float a = att[((static_cast<std::size_t>(b) * H + h) * T + t) * T + s];
      const float* dy = dout + row * qw + static_cast<std::size_t>(h) * D;
      const float* qt = q + row * qw + static_cast<std::size_t>(h) * D;
      float d = 0;
      for (int i = 0; i < D; ++i) d += dy[i] * vs[i];
      const float dpre = a * (d - weighted[(static_cast<std::size_t>(b) * H + h) * T + t]) * scale;
      for (int i = 0; i < D; ++i) {
        dvs[i] += a * dy[i];
        dks[i] += dpre * qt[i];
      }
    }
}
__global__ void embedding_forward_kernel(float* out, const int* tokens, const float* wte, int R, int C) {
  const std::size_t idx = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<std::size_t>(R) * C) return;
  const std::size_t r = idx / C, i = idx % C;
  out[idx] = wte[static_cast<std::size_t>(tokens[r]) * C + i];
}
__global__ void embedding_backward_kernel(float* dwte, const float* dout, const int* tokens, int R, int C) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= C) return;
  for (int r = 0; r < R; ++r)
    dwte[static_cast<std::size_t>(tokens[r]) * C + i] += dout[static_cast<std::size_t>(r) * C + i];
}

// The attention scale as the CPU reference computes it: rsqrtf is an approximation (up to 2 ulp off
// the correctly rounded 1/√D), and the scale multiplies every score, so it is computed once here.
float attention_scale(int D) { return 1.0f / std::sqrt(static_cast<float>(D)); }

}  // namespace

void launch_rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int R, int C, float eps,
                            cudaStream_t s) {
  cuda::launch(rmsnorm_forward_kernel, blocks_for(R, 128), 128, 0, s, out, rstd, inp, w, R, C, eps);
  ZINF_CUDA_LAUNCH_CHECK("rmsnorm_forward");
}
void launch_rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                             const float* rstd, int R, int C, cudaStream_t s) {
  cuda::launch(rmsnorm_backward_rows, blocks_for(R, 128), 128, 0, s, dinp, dout, inp, w, rstd, R, C);
  ZINF_CUDA_LAUNCH_CHECK("rmsnorm_backward_rows");
  cuda::launch(rmsnorm_backward_cols, blocks_for(C, 128), 128, 0, s, dw, dout, inp, rstd, R, C);
  ZINF_CUDA_LAUNCH_CHECK("rmsnorm_backward_cols");
}
void launch_rope_apply(float* x, const float* cos_t, const float* sin_t, int R, int T, int heads, int D, bool backward,
                       cudaStream_t s) {
  const std::size_t n = static_cast<std::size_t>(R) * heads * (D / 2);
  cuda::launch(rope_kernel, blocks_for(n, 256), 256, 0, s, x, cos_t, sin_t, R, T, heads, D, backward ? -1.0f : 1.0f);
  ZINF_CUDA_LAUNCH_CHECK("rope_apply");
}
void launch_swiglu_forward(float* out, const float* gate, const float* up, std::size_t n, cudaStream_t s) {
  cuda::launch(swiglu_forward_kernel, blocks_for(n, 256), 256, 0, s, out, gate, up, n);
  ZINF_CUDA_LAUNCH_CHECK("swiglu_forward");
}
void launch_swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                            std::size_t n, cudaStream_t s) {
  cuda::launch(swiglu_backward_kernel, blocks_for(n, 256), 256, 0, s, dgate, dup, dout, gate, up, n);
  ZINF_CUDA_LAUNCH_CHECK("swiglu_backward");
}
void launch_gqa_attention_forward(float* out, float* att, const float* q, const float* k, const float* v, int B, int T,
                                  int H, int KV, int D, int W, cudaStream_t s) {
  cuda::launch(gqa_forward_kernel, blocks_for(static_cast<std::size_t>(B) * H * T, 64), 64, 0, s, out, att, q, k, v, B,
               T, H, KV, D, W, attention_scale(D));
  ZINF_CUDA_LAUNCH_CHECK("gqa_attention_forward");
}
void launch_gqa_attention_backward(float* dq, float* dk, float* dv, float* weighted, const float* dout, const float* q,
                                   const float* k, const float* v, const float* att, int B, int T, int H, int KV, int D,
                                   int W, cudaStream_t s) {
  cuda::launch(gqa_backward_queries, blocks_for(static_cast<std::size_t>(B) * H * T, 64), 64, 0, s, dq, weighted, dout,
               q, k, v, att, B, T, H, KV, D, W, attention_scale(D));
  ZINF_CUDA_LAUNCH_CHECK("gqa_attention_backward_queries");
  cuda::launch(gqa_backward_keys, blocks_for(static_cast<std::size_t>(B) * KV * T, 64), 64, 0, s, dk, dv, weighted,
               dout, q, v, att, B, T, H, KV, D, W, attention_scale(D));
  ZINF_CUDA_LAUNCH_CHECK("gqa_attention_backward_keys");
}
void launch_attention_decode(float* out, float* scores, const float* q, const float* k, const float* v, int Q, int pos,
                             int H, int KV, int D, int q_stride, int kv_stride, cudaStream_t s) {
  ZINF_CHECK(KV > 0 && H % KV == 0 && pos >= 0);  // the head mapping h / (H / KV) needs whole groups
  if (Q <= 0) return;
  cuda::launch(attention_decode_kernel, blocks_for(static_cast<std::size_t>(Q) * H, 64), 64, 0, s, out, scores, q, k, v,
               Q, pos, H, KV, D, q_stride, kv_stride, attention_scale(D));
  ZINF_CUDA_LAUNCH_CHECK("attention_decode");
}
void launch_embedding_forward(float* out, const int* tokens, const float* wte, int R, int C, cudaStream_t s) {
  cuda::launch(embedding_forward_kernel, blocks_for(static_cast<std::size_t>(R) * C, 256), 256, 0, s, out, tokens, wte,
               R, C);
  ZINF_CUDA_LAUNCH_CHECK("embedding_forward");
}
void launch_embedding_backward(float* dwte, const float* dout, const int* tokens, int R, int C, cudaStream_t s) {
  cuda::launch(embedding_backward_kernel, blocks_for(C, 128), 128, 0, s, dwte, dout, tokens, R, C);
  ZINF_CUDA_LAUNCH_CHECK("embedding_backward");
}

}  // namespace zinf::cuda::ops
