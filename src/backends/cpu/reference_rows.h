// reference_rows.h — one row of the reference LayerNorm, RMSNorm and grouped-query attention, written
// once for the CPU reference ops (ops_gpt.cpp, ops_llama.cpp) and the CUDA reference kernels
// (cuda/ops/layernorm.cu, cuda/ops/llama.cu, one thread per row): both compute a row by the same
// operations in the same order, so the two agree to rounding. Plain C++17, no CUDA types.
#pragma once

#include <math.h>

#include <cstddef>

#include "zinf/host_device.h"

namespace zinf::reference_rows {

// LayerNorm of the C values at x: o = (x − mean)·rstd·w + b, rstd = 1/√(variance + 1e-5).
ZINF_HD inline void layernorm_forward(float* o, float& mean, float& rstd, const float* x, const float* w,
                                      const float* b, int C) {
  float m = 0;
  for (int i = 0; i < C; ++i) m += x[i];
  m /= static_cast<float>(C);
  float v = 0;
  for (int i = 0; i < C; ++i) v += (x[i] - m) * (x[i] - m);
  v /= static_cast<float>(C);
  const float s = 1.0f / sqrtf(v + 1e-5f);
  for (int i = 0; i < C; ++i) o[i] = (x[i] - m) * s * w[i] + b[i];
  mean = m;
  rstd = s;
}

// LayerNorm's input gradient for one row (dy: the output's gradient; m, s: the row's mean and rstd),
// added into dx.
ZINF_HD inline void layernorm_backward(float* dx, const float* dy, const float* x, const float* w, float m, float s,
                                       int C) {
  float dnorm_mean = 0, dnorm_norm_mean = 0;
  for (int i = 0; i < C; ++i) {
    const float dnorm = w[i] * dy[i];
    dnorm_mean += dnorm;
    dnorm_norm_mean += dnorm * (x[i] - m) * s;
  }
  dnorm_mean /= static_cast<float>(C);
  dnorm_norm_mean /= static_cast<float>(C);
  for (int i = 0; i < C; ++i) {
    const float norm = (x[i] - m) * s;
    const float dnorm = w[i] * dy[i];
    dx[i] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
  }
}

// RMSNorm of the C values at x: o = x·s·w with s = (mean x² + eps)^-1/2, which it returns.
ZINF_HD inline float rmsnorm_forward(float* o, const float* x, const float* w, int C, float eps) {
  float ss = 0;
  for (int i = 0; i < C; ++i) ss += x[i] * x[i];
  const float s = 1.0f / sqrtf(ss / static_cast<float>(C) + eps);
  for (int i = 0; i < C; ++i) o[i] = x[i] * s * w[i];
  return s;
}

// RMSNorm's input gradient for one row (s: the row's rstd), added into dx:
//   dx_i = s·w_i·dy_i − s³/C · x_i · Σ_j w_j·dy_j·x_j
ZINF_HD inline void rmsnorm_backward(float* dx, const float* dy, const float* x, const float* w, float s, int C) {
  float dot = 0;
  for (int i = 0; i < C; ++i) dot += w[i] * dy[i] * x[i];
  const float k = s * s * s * dot / static_cast<float>(C);
  for (int i = 0; i < C; ++i) dx[i] += s * w[i] * dy[i] - k * x[i];
}

// Query position t of causal grouped-query attention with a window of W keys (0: all): the scores
// a[0..T) (softmax over the keys in the window, zero elsewhere) and the output o[0..D). qt: the query
// row; k, v: the head's key and value rows at position 0, `kw` elements apart; exp: the exponential
// of the implementation (the CPU's fixed::expf, the GPU's expf).
template <class Exp>
ZINF_HD inline void gqa_forward_row(float* o, float* a, const float* qt, const float* k, const float* v, std::size_t kw,
                                    int t, int T, int D, int W, float scale, Exp exp) {
  const int lo = W > 0 && t - W + 1 > 0 ? t - W + 1 : 0;  // the first key in the window
  for (int s = 0; s < lo; ++s) a[s] = 0;
  float maxv = -INFINITY;
  for (int s = lo; s <= t; ++s) {
    const float* ks = k + static_cast<std::size_t>(s) * kw;
    float dot = 0;
    for (int i = 0; i < D; ++i) dot += qt[i] * ks[i];
    a[s] = dot * scale;
    maxv = fmaxf(maxv, a[s]);
  }
  float sum = 0;
  for (int s = lo; s <= t; ++s) sum += (a[s] = exp(a[s] - maxv));
  const float inv = 1.0f / sum;
  for (int s = lo; s <= t; ++s) a[s] *= inv;
  for (int s = t + 1; s < T; ++s) a[s] = 0;
  for (int i = 0; i < D; ++i) o[i] = 0;
  for (int s = lo; s <= t; ++s) {
    const float* vs = v + static_cast<std::size_t>(s) * kw;
    for (int i = 0; i < D; ++i) o[i] += a[s] * vs[i];
  }
}

}  // namespace zinf::reference_rows
