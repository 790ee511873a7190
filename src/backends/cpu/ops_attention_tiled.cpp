// ops_attention_tiled.cpp — the CPU twin of the flash-attention kernels (see the header). Each loop
// below names the kernel step it mirrors; the order of every sum is fixed (rows, keys and channels
// ascending), so one thread or many give the same bits.
#include "cpu/ops_attention_tiled.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "model/fixed_math.h"
#include "zinf/cpu_adam/spec.h"
#include "zinf/error.h"

namespace zinf::ops {

namespace {

// The value a P or dS element has after the kernel rounds its tile to `t`: cpu_adam/spec.h's
// conversion, the one rule of every 16-bit rounding (the kernel's from_f, cuda/round16.cuh): to
// nearest even, fp32 subnormals to ±0 for bf16.
float round_to(float x, DType t) {
  namespace spec = cpu_adam::spec;
  switch (t) {
    case DType::bf16: return spec::bf16_to_fp32(spec::fp32_to_bf16(x));
    case DType::fp16: return spec::fp16_to_fp32(spec::fp32_to_fp16(x));
    case DType::fp32: break;
  }
  return x;
}

int blocks(int n, int b) { return (n + b - 1) / b; }

// The first key query t attends: 0, or with a window W the key W − 1 positions back.
int first_key(int t, int W) { return W > 0 ? std::max(0, t - W + 1) : 0; }
// The last query (exclusive bound) that attends key s: every later one, or with a window s + W.
int query_end(int s, int T, int W) { return W > 0 ? std::min(T, s + W) : T; }

float dot(const float* x, const float* y, int n) {
  float s = 0;
  for (int i = 0; i < n; ++i) s += x[i] * y[i];
  return s;
}

// Row pointers of one (batch, head) of the shape.
struct Rows {
  const AttnShapeCpu& a;
  std::size_t row(int b, int t) const { return static_cast<std::size_t>(b) * a.T + t; }
  std::size_t q(int b, int t, int h) const { return row(b, t) * a.q_stride + static_cast<std::size_t>(h) * a.D; }
  std::size_t k(int b, int t, int j) const { return row(b, t) * a.k_stride + static_cast<std::size_t>(j) * a.D; }
  std::size_t v(int b, int t, int j) const { return row(b, t) * a.v_stride + static_cast<std::size_t>(j) * a.D; }
  std::size_t o(int b, int t, int h) const { return row(b, t) * a.o_stride + static_cast<std::size_t>(h) * a.D; }
  std::size_t bht(int b, int h, int t) const { return (static_cast<std::size_t>(b) * a.H + h) * a.T + t; }
};

void check_shape(const AttnShapeCpu& a, const TiledAttention& tl) {
  ZINF_CHECK(a.B >= 0 && a.T >= 0 && a.H > 0 && a.KV > 0 && a.H % a.KV == 0 && a.D > 0 && a.W >= 0);
  ZINF_CHECK(tl.block_q > 0 && tl.block_k > 0);
}

}  // namespace

TiledAttention cuda_tiling(int D, DType S) {
  if (D < 1 || D > kMaxFlashHeadDim)
    throw Error("flash attention: head width " + std::to_string(D) + " is not supported (at most " +
                    std::to_string(kMaxFlashHeadDim) + ")",
                "use device.kernels = \"reference\" for this model");
  // Tensor-core tiles (16-bit, D a multiple of 16): 64 query rows per block; heads wider than 64 take
  // 32 keys per block so that the backward kernels' tiles fit in the shared memory of an sm_80 SM.
  // Everything else (fp32, odd head widths) runs the plain-FMA tiles, 32 by 32.
  if (S != DType::fp32 && D % 16 == 0) return {64, D <= 64 ? 64 : 32, S};
  return {32, 32, S};
}

void tiled_attention_forward(ChunkPool& p, float* out, float* lse, const float* q, const float* k, const float* v,
                             const AttnShapeCpu& a, const TiledAttention& tl) {
  check_shape(a, tl);
  if (a.B == 0 || a.T == 0) return;
  const int BQ = tl.block_q, BK = tl.block_k, D = a.D, group = a.H / a.KV, nq = blocks(a.T, BQ);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const Rows at{a};
  // One chunk = one CTA of the forward kernel: (b, h, query block).
  p.chunks(static_cast<std::size_t>(a.B) * a.H * nq, [&](std::size_t c) {
    const int qb = static_cast<int>(c % nq), h = static_cast<int>(c / nq % a.H), b = static_cast<int>(c / nq / a.H);
    const int j = h / group, t0 = qb * BQ, t1 = std::min(a.T, t0 + BQ);
    std::vector<float> acc(static_cast<std::size_t>(BQ) * D, 0.0f), m(BQ, -INFINITY), l(BQ, 0.0f), s(BK);
    const int kb_end = blocks(t1, BK);  // key blocks up to the block holding the last row's own key
    for (int kb = first_key(t0, a.W) / BK; kb < kb_end; ++kb) {  // from the block of the first row's first key
      const int s0 = kb * BK;
      for (int t = t0; t < t1; ++t) {
        // keys max(s0, first) ≤ s ≤ t of this block
        const int i = t - t0, s1 = std::min(t + 1, s0 + BK), sb = std::max(s0, first_key(t, a.W));
        if (s1 <= sb) continue;  // no key of the block in this row's window: P = 0, nothing changes
        const float* qt = q + at.q(b, t, h);
        float mx = m[i];
        for (int sk = sb; sk < s1; ++sk) {
          s[sk - s0] = dot(qt, k + at.k(b, sk, j), D) * scale;
          mx = std::max(mx, s[sk - s0]);
        }
        const float alpha = fixed::expf(m[i] - mx);  // 0 on the first block (m = −inf)
        float sum = 0;
        for (int sk = sb; sk < s1; ++sk) sum += (s[sk - s0] = fixed::expf(s[sk - s0] - mx));
        l[i] = l[i] * alpha + sum;
        m[i] = mx;
        float* ai = acc.data() + static_cast<std::size_t>(i) * D;
        for (int d = 0; d < D; ++d) ai[d] *= alpha;
        for (int sk = sb; sk < s1; ++sk) {  // acc += round(P)·V
          const float pr = round_to(s[sk - s0], tl.round_p);
          const float* vs = v + at.v(b, sk, j);
          for (int d = 0; d < D; ++d) ai[d] += pr * vs[d];
        }
      }
    }
    for (int t = t0; t < t1; ++t) {
      const int i = t - t0;
      const float inv = 1.0f / l[i];
      float* o = out + at.o(b, t, h);
      for (int d = 0; d < D; ++d) o[d] = acc[static_cast<std::size_t>(i) * D + d] * inv;
      lse[at.bht(b, h, t)] = m[i] + fixed::logf(l[i]);
    }
  });
}

void tiled_attention_backward(ChunkPool& p, float* dq, float* dk, float* dv, const float* dout, const float* q,
                              const float* k, const float* v, const float* out, const float* lse, const AttnShapeCpu& a,
                              const TiledAttention& tl) {
  check_shape(a, tl);
  if (a.B == 0 || a.T == 0) return;
  const int BQ = tl.block_q, BK = tl.block_k, D = a.D, T = a.T, group = a.H / a.KV;
  const int nq = blocks(T, BQ), nk = blocks(T, BK);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const Rows at{a};

  // D_i = Σ_d dout·out per row (the kernel's small first pass into scratch).
  std::vector<float> delta(static_cast<std::size_t>(a.B) * a.H * T);
  p.chunks(static_cast<std::size_t>(a.B) * a.H, [&](std::size_t c) {
    const int h = static_cast<int>(c % a.H), b = static_cast<int>(c / a.H);
    for (int t = 0; t < T; ++t) delta[at.bht(b, h, t)] = dot(dout + at.o(b, t, h), out + at.o(b, t, h), D);
  });

  // P and dS of one (query row, key), as the kernels recompute them from lse.
  auto p_ds = [&](int b, int h, int j, int t, int sk, float& pr, float& ds) {
    const float st = dot(q + at.q(b, t, h), k + at.k(b, sk, j), D) * scale;
    pr = fixed::expf(st - lse[at.bht(b, h, t)]);
    const float dp = dot(dout + at.o(b, t, h), v + at.v(b, sk, j), D);
    ds = pr * (dp - delta[at.bht(b, h, t)]);
  };

  // dK, dV: one chunk = one CTA (b, kv head, key block); the group's query heads in order, and for
  // each the query blocks from the first one that sees this key block, in order.
  p.chunks(static_cast<std::size_t>(a.B) * a.KV * nk, [&](std::size_t c) {
    const int kb = static_cast<int>(c % nk), j = static_cast<int>(c / nk % a.KV), b = static_cast<int>(c / nk / a.KV);
    const int s0 = kb * BK, s1 = std::min(T, s0 + BK);
    std::vector<float> dka(static_cast<std::size_t>(BK) * D, 0.0f), dva(static_cast<std::size_t>(BK) * D, 0.0f);
    for (int h = j * group; h < (j + 1) * group; ++h)
      for (int qb = s0 / BQ; qb < blocks(query_end(s1 - 1, T, a.W), BQ); ++qb)  // to the last row that sees the block
        for (int t = qb * BQ; t < std::min(T, qb * BQ + BQ); ++t) {
          const float* dot_t = dout + at.o(b, t, h);
          const float* qt = q + at.q(b, t, h);
          for (int sk = std::max(s0, first_key(t, a.W)); sk < std::min(s1, t + 1); ++sk) {
            float pr, ds;
            p_ds(b, h, j, t, sk, pr, ds);
            const float pq = round_to(pr, tl.round_p), dsq = round_to(ds, tl.round_p);
            float* dvs = dva.data() + static_cast<std::size_t>(sk - s0) * D;
            float* dks = dka.data() + static_cast<std::size_t>(sk - s0) * D;
            for (int d = 0; d < D; ++d) dvs[d] += pq * dot_t[d];
            for (int d = 0; d < D; ++d) dks[d] += dsq * qt[d];
          }
        }
    for (int sk = s0; sk < s1; ++sk) {
      float* dks = dk + at.k(b, sk, j);
      float* dvs = dv + at.v(b, sk, j);
      for (int d = 0; d < D; ++d) {
        dks[d] = dka[static_cast<std::size_t>(sk - s0) * D + d] * scale;
        dvs[d] = dva[static_cast<std::size_t>(sk - s0) * D + d];
      }
    }
  });

  // dQ: one chunk = one CTA (b, h, query block), key blocks in order up to the causal limit.
  p.chunks(static_cast<std::size_t>(a.B) * a.H * nq, [&](std::size_t c) {
    const int qb = static_cast<int>(c % nq), h = static_cast<int>(c / nq % a.H), b = static_cast<int>(c / nq / a.H);
    const int j = h / group, t0 = qb * BQ, t1 = std::min(T, t0 + BQ);
    std::vector<float> dqa(static_cast<std::size_t>(BQ) * D, 0.0f);
    for (int kb = first_key(t0, a.W) / BK; kb < blocks(t1, BK); ++kb)
      for (int t = t0; t < t1; ++t) {
        float* dqt = dqa.data() + static_cast<std::size_t>(t - t0) * D;
        for (int sk = std::max(kb * BK, first_key(t, a.W)); sk < std::min(kb * BK + BK, t + 1); ++sk) {
          float pr, ds;
          p_ds(b, h, j, t, sk, pr, ds);
          const float dsq = round_to(ds, tl.round_p);
          const float* ks = k + at.k(b, sk, j);
          for (int d = 0; d < D; ++d) dqt[d] += dsq * ks[d];
        }
      }
    for (int t = t0; t < t1; ++t) {
      float* o = dq + at.q(b, t, h);
      for (int d = 0; d < D; ++d) o[d] = dqa[static_cast<std::size_t>(t - t0) * D + d] * scale;
    }
  });
}

}  // namespace zinf::ops
