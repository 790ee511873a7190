// ops_llama.cpp — the Llama family's reference ops (ops_llama.h).
#include "cpu/ops_llama.h"
#include "cpu/reference_rows.h"

#include <algorithm>
#include <cmath>

#include "model/fixed_math.h"
#include "zinf/error.h"

namespace zinf::ops {
namespace {
std::size_t nchunks(std::size_t n, std::size_t c) { return (n + c - 1) / c; }
constexpr std::size_t kElemChunk = 1 << 14;
struct FixedExp {
  float operator()(float x) const { return fixed::expf(x); }
};
}  // namespace

// The norms' rows are cpu/reference_rows.h's, which the kernels in src/backends/cuda/ops/llama.cu run
// too; the other kernels there follow the reference's order of operations, so that the two agree to
// rounding.
void rmsnorm_forward(ChunkPool& p, float* out, float* rstd, const float* inp, const float* w, int R, int C, float eps) {
  p.chunks(nchunks(static_cast<std::size_t>(R), kRowChunk), [&](std::size_t c) {
    const int r0 = static_cast<int>(c) * kRowChunk, r1 = std::min(R, r0 + kRowChunk);
    for (int r = r0; r < r1; ++r) {
      const std::size_t at = static_cast<std::size_t>(r) * C;
      rstd[r] = reference_rows::rmsnorm_forward(out + at, inp + at, w, C, eps);
    }
  });
}

void rmsnorm_backward(ChunkPool& p, float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                      const float* rstd, int R, int C) {
  p.chunks(nchunks(static_cast<std::size_t>(R), kRowChunk), [&](std::size_t c) {
    const int r0 = static_cast<int>(c) * kRowChunk, r1 = std::min(R, r0 + kRowChunk);
    for (int r = r0; r < r1; ++r) {
      const std::size_t at = static_cast<std::size_t>(r) * C;
      reference_rows::rmsnorm_backward(dinp + at, dout + at, inp + at, w, rstd[r], C);
    }
  });
  p.chunks(nchunks(static_cast<std::size_t>(C), kColChunk), [&](std::size_t c) {
    const int i0 = static_cast<int>(c) * kColChunk, i1 = std::min(C, i0 + kColChunk);
    for (int r = 0; r < R; ++r) {
      const float* x = inp + static_cast<std::size_t>(r) * C;
      const float* dy = dout + static_cast<std::size_t>(r) * C;
      for (int i = i0; i < i1; ++i) dw[i] += x[i] * rstd[r] * dy[i];
    }
  });
}

void rope_apply(ChunkPool& p, float* x, const float* cos_t, const float* sin_t, int R, int T, int heads, int D,
                bool backward) {
  const int half = D / 2;
  const float sign = backward ? -1.0f : 1.0f;
  p.chunks(nchunks(static_cast<std::size_t>(R), kRowChunk), [&](std::size_t c) {
    const int r0 = static_cast<int>(c) * kRowChunk, r1 = std::min(R, r0 + kRowChunk);
    for (int r = r0; r < r1; ++r) {
      const std::size_t t = static_cast<std::size_t>(r % T);
      for (int h = 0; h < heads; ++h) {
        float* v = x + (static_cast<std::size_t>(r) * heads + h) * D;
        for (int i = 0; i < half; ++i) {
          const float co = cos_t[t * half + i], si = sign * sin_t[t * half + i];
          const float a = v[i], b = v[i + half];
          v[i] = a * co - b * si;
          v[i + half] = b * co + a * si;
        }
      }
    }
  });
}

void swiglu_forward(ChunkPool& p, float* out, const float* gate, const float* up, std::size_t n) {
  p.chunks(nchunks(n, kElemChunk), [&](std::size_t c) {
    const std::size_t i0 = c * kElemChunk, i1 = std::min(n, i0 + kElemChunk);
    for (std::size_t i = i0; i < i1; ++i) {
      const float g = gate[i], sig = 1.0f / (1.0f + fixed::expf(-g));
      out[i] = g * sig * up[i];
    }
  });
}

void swiglu_backward(ChunkPool& p, float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                     std::size_t n) {
  p.chunks(nchunks(n, kElemChunk), [&](std::size_t c) {
    const std::size_t i0 = c * kElemChunk, i1 = std::min(n, i0 + kElemChunk);
    for (std::size_t i = i0; i < i1; ++i) {
      const float g = gate[i], sig = 1.0f / (1.0f + fixed::expf(-g)), silu = g * sig;
      dup[i] = dout[i] * silu;
      dgate[i] = dout[i] * up[i] * (sig + silu * (1.0f - sig));  // silu' = σ + g·σ·(1 − σ)
    }
  });
}

void gqa_attention_forward(ChunkPool& p, float* out, float* att, const float* q, const float* k, const float* v, int B,
                           int T, int H, int KV, int D, int W) {
  ZINF_CHECK(KV > 0 && H % KV == 0 && W >= 0);
  const int group = H / KV;
  const std::size_t qw = static_cast<std::size_t>(H) * D, kw = static_cast<std::size_t>(KV) * D;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  p.chunks(static_cast<std::size_t>(B) * H, [&](std::size_t bh) {
    const int b = static_cast<int>(bh) / H, h = static_cast<int>(bh) % H, j = h / group;
    const std::size_t kv0 = static_cast<std::size_t>(b) * T * kw + static_cast<std::size_t>(j) * D;
    for (int t = 0; t < T; ++t) {
      const std::size_t row = (static_cast<std::size_t>(b) * T + t) * qw + static_cast<std::size_t>(h) * D;
      reference_rows::gqa_forward_row(out + row, att + ((static_cast<std::size_t>(b) * H + h) * T + t) * T, q + row,
                                      k + kv0, v + kv0, kw, t, T, D, W, scale, FixedExp{});
    }
  });
}

void attention_decode(ChunkPool& p, float* out, const float* q, const float* k, const float* v, int Q, int pos, int H,
                      int KV, int D, int q_stride, int kv_stride) {
  ZINF_CHECK(KV > 0 && H % KV == 0 && Q >= 0 && pos >= 0);
  const int group = H / KV, L = pos + Q;
  const std::size_t qs = static_cast<std::size_t>(q_stride), ks = static_cast<std::size_t>(kv_stride);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  // One task per (query row, head); each owns its output row slice and its scores.
  p.chunks(static_cast<std::size_t>(Q) * H, [&](std::size_t th) {
    const int t = static_cast<int>(th) / H, h = static_cast<int>(th) % H, j = h / group, n = pos + t + 1;
    std::vector<float> a(static_cast<std::size_t>(L));
    const float* qt = q + static_cast<std::size_t>(t) * qs + static_cast<std::size_t>(h) * D;
    float maxv = -INFINITY;
    for (int s = 0; s < n; ++s) {
      const float* kr = k + static_cast<std::size_t>(s) * ks + static_cast<std::size_t>(j) * D;
      float dot = 0;
      for (int i = 0; i < D; ++i) dot += qt[i] * kr[i];
      a[static_cast<std::size_t>(s)] = dot * scale;
      maxv = std::max(maxv, a[static_cast<std::size_t>(s)]);
    }
    float sum = 0;
    for (int s = 0; s < n; ++s)
      sum += (a[static_cast<std::size_t>(s)] = fixed::expf(a[static_cast<std::size_t>(s)] - maxv));
    const float inv = 1.0f / sum;
    for (int s = 0; s < n; ++s) a[static_cast<std::size_t>(s)] *= inv;
    float* o = out + static_cast<std::size_t>(t) * H * D + static_cast<std::size_t>(h) * D;
    for (int i = 0; i < D; ++i) o[i] = 0;
    for (int s = 0; s < n; ++s) {
      const float* vr = v + static_cast<std::size_t>(s) * ks + static_cast<std::size_t>(j) * D;
      for (int i = 0; i < D; ++i) o[i] += a[static_cast<std::size_t>(s)] * vr[i];
    }
  });
}

void gqa_attention_backward(ChunkPool& p, float* dq, float* dk, float* dv, const float* dout, const float* q,
                            const float* k, const float* v, const float* att,
                            const float* /*out: not needed, see ops_llama.h*/, int B, int T, int H, int KV, int D,
                            int W) {
  ZINF_CHECK(KV > 0 && H % KV == 0 && W >= 0);
  const int group = H / KV;
  const std::size_t qw = static_cast<std::size_t>(H) * D, kw = static_cast<std::size_t>(KV) * D;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  // One task per (batch, key/value head): it owns dk and dv of that head and dq of its query heads,
  // and adds the query heads in order, so the sums do not depend on the thread count.
  p.chunks(static_cast<std::size_t>(B) * KV, [&](std::size_t bj) {
    const int b = static_cast<int>(bj) / KV, j = static_cast<int>(bj) % KV;
    for (int t = 0; t < T; ++t) {
      float* dkt = dk + (static_cast<std::size_t>(b) * T + t) * kw + static_cast<std::size_t>(j) * D;
      float* dvt = dv + (static_cast<std::size_t>(b) * T + t) * kw + static_cast<std::size_t>(j) * D;
      for (int i = 0; i < D; ++i) dkt[i] = dvt[i] = 0;
    }
    std::vector<float> datt(static_cast<std::size_t>(T));
    for (int h = j * group; h < (j + 1) * group; ++h)
      for (int t = 0; t < T; ++t) {
        const std::size_t row = static_cast<std::size_t>(b) * T + t;
        const float* a = att + ((static_cast<std::size_t>(b) * H + h) * T + t) * T;
        const float* dot = dout + row * qw + static_cast<std::size_t>(h) * D;
        const float* qt = q + row * qw + static_cast<std::size_t>(h) * D;
        float* dqt = dq + row * qw + static_cast<std::size_t>(h) * D;
        // keys lo..t: those in the window
        const int lo = W > 0 ? std::max(0, t - W + 1) : 0;
        float weighted = 0;  // Σ_s a_s · datt_s
        for (int s = lo; s <= t; ++s) {
          const std::size_t srow = static_cast<std::size_t>(b) * T + s;
          const float* vs = v + srow * kw + static_cast<std::size_t>(j) * D;
          float* dvs = dv + srow * kw + static_cast<std::size_t>(j) * D;
          float d = 0;
          for (int i = 0; i < D; ++i) {
            d += dot[i] * vs[i];
            dvs[i] += a[s] * dot[i];
          }
          datt[static_cast<std::size_t>(s)] = d;
          weighted += a[s] * d;
        }
        for (int i = 0; i < D; ++i) dqt[i] = 0;
        for (int s = lo; s <= t; ++s) {
          const float dpre = a[s] * (datt[static_cast<std::size_t>(s)] - weighted) * scale;  // softmax, then the scale
          const std::size_t srow = static_cast<std::size_t>(b) * T + s;
          const float* ks = k + srow * kw + static_cast<std::size_t>(j) * D;
          float* dks = dk + srow * kw + static_cast<std::size_t>(j) * D;
          for (int i = 0; i < D; ++i) {
            dqt[i] += dpre * ks[i];
            dks[i] += dpre * qt[i];
          }
        }
      }
  });
}

void embedding_forward(ChunkPool& p, float* out, const int* tokens, const float* wte, int R, int C) {
  p.chunks(nchunks(static_cast<std::size_t>(R), kRowChunk), [&](std::size_t c) {
    const int r0 = static_cast<int>(c) * kRowChunk, r1 = std::min(R, r0 + kRowChunk);
    for (int r = r0; r < r1; ++r)
      std::copy_n(wte + static_cast<std::size_t>(tokens[r]) * C, C, out + static_cast<std::size_t>(r) * C);
  });
}

void embedding_backward(ChunkPool& p, float* dwte, const float* dout, const int* tokens, int R, int C) {
  p.chunks(nchunks(static_cast<std::size_t>(C), kColChunk), [&](std::size_t c) {
    const int i0 = static_cast<int>(c) * kColChunk, i1 = std::min(C, i0 + kColChunk);
    for (int r = 0; r < R; ++r) {
      float* d = dwte + static_cast<std::size_t>(tokens[r]) * C;
      const float* g = dout + static_cast<std::size_t>(r) * C;
      for (int i = i0; i < i1; ++i) d[i] += g[i];
    }
  });
}

}  // namespace zinf::ops
