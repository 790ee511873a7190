// attention_tiled_test.cpp — the CPU twin of the flash-attention kernels (cpu/ops_attention_tiled.h)
// against the plain reference attention of both families (ops_gpt.h's packed qkv, ops_llama.h's
// grouped-query heads): the same function within fp32 rounding when the tiles are not rounded,
// within the stated bf16 bound when they are; lse against log Σ exp done plainly in double; the same
// bits on one thread and two.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <random>
#include <vector>

#include "cpu/ops_attention_tiled.h"
#include "cpu/ops_gpt.h"
#include "cpu/ops_llama.h"
#include "zinf/error.h"

namespace zinf::ops {
namespace {

std::vector<float> random_vec(std::size_t n, unsigned seed, float amp) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(-amp, amp);
  std::vector<float> x(n);
  for (float& e : x) e = u(g);
  return x;
}

// fp32 tiles against the plain reference: |x − ref| ≤ kRel·(max|ref| + |ref|). The two differ only by
// the order of the softmax's sums and the online rescaling (a few float ulps of the largest term).
constexpr float kRel = 1e-5f;

void expect_close(const std::vector<float>& x, const std::vector<float>& ref, float rel, const char* what) {
  ASSERT_EQ(x.size(), ref.size());
  float amax = 0;
  for (float r : ref) amax = std::max(amax, std::fabs(r));
  std::size_t bad = 0;
  float worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float err = std::fabs(x[i] - ref[i]);
    worst = std::max(worst, err / (amax + std::fabs(ref[i])));
    if (!(err <= rel * (amax + std::fabs(ref[i])))) ++bad;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << x.size() << " elements off; worst relative error " << worst;
}

// GPT: packed qkv [B, T, 3C] through the tiled pair and through the plain pair.
struct GptCase {
  int B, T, H, D;
  int C() const { return H * D; }
  AttnShapeCpu shape() const { return {B, T, H, H, D, 3L * C(), 3L * C(), 3L * C(), C()}; }
};

struct GptResult {
  std::vector<float> out, lse, dqkv;
};

GptResult run_tiled_gpt(const GptCase& g, const TiledAttention& tl, const std::vector<float>& qkv,
                        const std::vector<float>& dout, int threads) {
  ChunkPool pool(threads);
  const std::size_t R = static_cast<std::size_t>(g.B) * g.T;
  GptResult r{std::vector<float>(R * g.C()), std::vector<float>(static_cast<std::size_t>(g.B) * g.H * g.T),
              std::vector<float>(R * 3 * g.C())};
  const int C = g.C();
  tiled_attention_forward(pool, r.out.data(), r.lse.data(), qkv.data(), qkv.data() + C, qkv.data() + 2 * C, g.shape(),
                          tl);
  tiled_attention_backward(pool, r.dqkv.data(), r.dqkv.data() + C, r.dqkv.data() + 2 * C, dout.data(), qkv.data(),
                           qkv.data() + C, qkv.data() + 2 * C, r.out.data(), r.lse.data(), g.shape(), tl);
  return r;
}

struct Plain {
  std::vector<float> out, att, dqkv;
};

Plain run_plain_gpt(const GptCase& g, const std::vector<float>& qkv, const std::vector<float>& dout) {
  ChunkPool pool(1);
  const std::size_t R = static_cast<std::size_t>(g.B) * g.T;
  Plain r{std::vector<float>(R * g.C()), std::vector<float>(static_cast<std::size_t>(g.B) * g.H * g.T * g.T),
          std::vector<float>(R * 3 * g.C())};
  attention_forward(pool, r.out.data(), r.att.data(), qkv.data(), g.B, g.T, g.C(), g.H);
  attention_backward(pool, r.dqkv.data(), dout.data(), qkv.data(), r.att.data(), r.out.data(), g.B, g.T, g.C(), g.H);
  return r;
}

void check_gpt_fp32(const GptCase& g, const TiledAttention& tl) {
  SCOPED_TRACE(::testing::Message() << "B=" << g.B << " T=" << g.T << " H=" << g.H << " D=" << g.D << " tiles "
                                    << tl.block_q << "x" << tl.block_k);
  const std::size_t R = static_cast<std::size_t>(g.B) * g.T;
  const auto qkv = random_vec(R * 3 * g.C(), 7, 2.0f);
  const auto dout = random_vec(R * g.C(), 8, 1.0f);
  const GptResult t = run_tiled_gpt(g, tl, qkv, dout, 1);
  const Plain p = run_plain_gpt(g, qkv, dout);
  expect_close(t.out, p.out, kRel, "out");
  expect_close(t.dqkv, p.dqkv, kRel, "dqkv");
  // lse against log Σ_s≤t exp(scaled score), in double from the inputs.
  const double scale = 1.0 / std::sqrt(static_cast<double>(g.D));
  const int C = g.C();
  for (int b = 0; b < g.B; ++b)
    for (int h = 0; h < g.H; ++h)
      for (int tq = 0; tq < g.T; ++tq) {
        const float* q = qkv.data() + (static_cast<std::size_t>(b) * g.T + tq) * 3 * C + h * g.D;
        std::vector<double> sc;
        for (int s = 0; s <= tq; ++s) {
          const float* k = qkv.data() + (static_cast<std::size_t>(b) * g.T + s) * 3 * C + C + h * g.D;
          double d = 0;
          for (int i = 0; i < g.D; ++i) d += static_cast<double>(q[i]) * k[i];
          sc.push_back(d * scale);
        }
        const double mx = *std::max_element(sc.begin(), sc.end());
        double sum = 0;
        for (double x : sc) sum += std::exp(x - mx);
        const double want = mx + std::log(sum);
        const float got = t.lse[(static_cast<std::size_t>(b) * g.H + h) * g.T + tq];
        ASSERT_NEAR(got, want, 1e-5 * (1 + std::fabs(want))) << "lse at b=" << b << " h=" << h << " t=" << tq;
      }
}

TEST(AttentionTiled, GptMatchesPlainReferenceFp32Tiles) {
  // T not a multiple of any block; the kernel's own tilings for D = 64 (fp32 and 16-bit sizes) and
  // odd blocks that cut the causal diagonal everywhere.
  for (const TiledAttention tl :
       {cuda_tiling(64, DType::fp32), TiledAttention{64, 64, DType::fp32}, TiledAttention{64, 32, DType::fp32},
        TiledAttention{7, 5, DType::fp32}, TiledAttention{5, 7, DType::fp32}})
    check_gpt_fp32({2, 37, 2, 64}, tl);
  check_gpt_fp32({1, 100, 1, 16}, TiledAttention{32, 32, DType::fp32});
  check_gpt_fp32({3, 19, 3, 8}, TiledAttention{64, 64, DType::fp32});  // one block holds the whole sequence
}

TEST(AttentionTiled, SinglePosition) {
  check_gpt_fp32({2, 1, 2, 64}, cuda_tiling(64, DType::fp32));
  check_gpt_fp32({2, 1, 2, 64}, TiledAttention{64, 64, DType::fp32});
}

TEST(AttentionTiled, GqaMatchesPlainReference) {
  const int B = 2, T = 45, H = 8, KV = 2, D = 16;
  const std::size_t R = static_cast<std::size_t>(B) * T;
  const auto q = random_vec(R * H * D, 1, 2.0f), k = random_vec(R * KV * D, 2, 2.0f), v = random_vec(R * KV * D, 3, 1);
  const auto dout = random_vec(R * H * D, 4, 1.0f);
  // no window, and sliding windows: one key, shorter than a tile (whole key blocks outside a query
  // block's windows are skipped, rows see no key of some blocks), longer than a tile, as long as T
  for (const int W : {0, 1, 7, 20, T})
    for (const TiledAttention tl :
         {cuda_tiling(D, DType::fp32), TiledAttention{16, 16, DType::fp32}, TiledAttention{6, 11, DType::fp32}}) {
      SCOPED_TRACE(::testing::Message() << "tiles " << tl.block_q << "x" << tl.block_k << ", window " << W);
      const AttnShapeCpu a{B, T, H, KV, D, H * D, KV * D, KV * D, H * D, W};
      ChunkPool pool(1);
      std::vector<float> out(R * H * D), lse(static_cast<std::size_t>(B) * H * T), dq(R * H * D), dk(R * KV * D),
          dv(R * KV * D);
      tiled_attention_forward(pool, out.data(), lse.data(), q.data(), k.data(), v.data(), a, tl);
      tiled_attention_backward(pool, dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(),
                               out.data(), lse.data(), a, tl);
      std::vector<float> rout(R * H * D), att(static_cast<std::size_t>(B) * H * T * T), rdq(R * H * D), rdk(R * KV * D),
          rdv(R * KV * D);
      gqa_attention_forward(pool, rout.data(), att.data(), q.data(), k.data(), v.data(), B, T, H, KV, D, W);
      gqa_attention_backward(pool, rdq.data(), rdk.data(), rdv.data(), dout.data(), q.data(), k.data(), v.data(),
                             att.data(), rout.data(), B, T, H, KV, D, W);
      expect_close(out, rout, kRel, "out");
      expect_close(dq, rdq, kRel, "dq");
      expect_close(dk, rdk, kRel, "dk");
      expect_close(dv, rdv, kRel, "dv");
    }
}

TEST(AttentionTiled, TwoThreadsGiveTheBitsOfOne) {
  const GptCase g{3, 70, 4, 16};
  const std::size_t R = static_cast<std::size_t>(g.B) * g.T;
  const auto qkv = random_vec(R * 3 * g.C(), 11, 2.0f);
  const auto dout = random_vec(R * g.C(), 12, 1.0f);
  for (const TiledAttention tl : {TiledAttention{32, 32, DType::fp32}, TiledAttention{64, 64, DType::bf16}}) {
    const GptResult one = run_tiled_gpt(g, tl, qkv, dout, 1), two = run_tiled_gpt(g, tl, qkv, dout, 2);
    EXPECT_EQ(one.out, two.out);
    EXPECT_EQ(one.lse, two.lse);
    EXPECT_EQ(one.dqkv, two.dqkv);
  }
}

// bf16 P and dS tiles. Rounding to nearest even moves each element by at most 2^-8 of itself (8 significant bits), so:
//   out[t,d]: |Σ_s (P̃−P)·v[s,d]| ≤ 2^-8·Σ_s P·|v[s,d]|
//   dv[s,d]:  ≤ 2^-8·Σ_t P·|dout[t,d]|
//   dk[s,d]:  ≤ scale·Σ_t e[t,s]·|q[t,d]|           dq[t,d]: ≤ scale·Σ_s e[t,s]·|k[s,d]|
// where e[t,s] = 2^-8·|dS| + (1 + 2^-8)·P·eD[t] bounds the error of the rounded dS: the backward's
// D_t = dout_t·out_t reads the forward's own (rounded) out, off by eD[t] ≤ Σ_d |dout[t,d]|·(out's
// bound). P and dS = P·(dP − D_t) come from the plain reference; plus the fp32 tolerance above.
TEST(AttentionTiled, Bf16RoundingStaysWithinItsBound) {
  const GptCase g{2, 53, 2, 64};
  const int C = g.C(), D = g.D, T = g.T;
  const std::size_t R = static_cast<std::size_t>(g.B) * T;
  const auto qkv = random_vec(R * 3 * C, 21, 2.0f);
  const auto dout = random_vec(R * C, 22, 1.0f);
  const TiledAttention tl = cuda_tiling(D, DType::bf16);
  ASSERT_EQ(tl.round_p, DType::bf16);
  const GptResult t = run_tiled_gpt(g, tl, qkv, dout, 1);
  const GptResult t32 = run_tiled_gpt(g, {tl.block_q, tl.block_k, DType::fp32}, qkv, dout, 1);
  const Plain p = run_plain_gpt(g, qkv, dout);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D)), u = std::ldexp(1.0, -8);
  float amax_out = 0, amax_d = 0;
  for (float x : p.out) amax_out = std::max(amax_out, std::fabs(x));
  for (float x : p.dqkv) amax_d = std::max(amax_d, std::fabs(x));
  auto at = [&](int part, int b, int tt, int h, int d) {
    return (static_cast<std::size_t>(b) * T + tt) * 3 * C + part * C + h * D + d;
  };
  std::size_t bad_out = 0, bad_dq = 0, bad_dk = 0, bad_dv = 0;
  for (int b = 0; b < g.B; ++b)
    for (int h = 0; h < g.H; ++h) {
      const float* att = p.att.data() + (static_cast<std::size_t>(b) * g.H + h) * T * T;
      // dS[t][s] in double from the reference probabilities
      std::vector<double> ds(static_cast<std::size_t>(T) * T, 0.0);
      for (int tt = 0; tt < T; ++tt) {
        const float* dy = dout.data() + (static_cast<std::size_t>(b) * T + tt) * C + h * D;
        const float* o = p.out.data() + (static_cast<std::size_t>(b) * T + tt) * C + h * D;
        double delta = 0;
        for (int d = 0; d < D; ++d) delta += static_cast<double>(dy[d]) * o[d];
        for (int s = 0; s <= tt; ++s) {
          double dp = 0;
          for (int d = 0; d < D; ++d) dp += static_cast<double>(dy[d]) * qkv[at(2, b, s, h, d)];
          ds[static_cast<std::size_t>(tt) * T + s] = att[tt * T + s] * (dp - delta);
        }
      }
      // out's bound per element, and eD[t]
      std::vector<double> bo(static_cast<std::size_t>(T) * D, 0.0), ed(static_cast<std::size_t>(T), 0.0);
      for (int tt = 0; tt < T; ++tt)
        for (int d = 0; d < D; ++d) {
          for (int s = 0; s <= tt; ++s)
            bo[static_cast<std::size_t>(tt) * D + d] += att[tt * T + s] * std::fabs(qkv[at(2, b, s, h, d)]);
          bo[static_cast<std::size_t>(tt) * D + d] *= u;
          ed[static_cast<std::size_t>(tt)] += std::fabs(dout[(static_cast<std::size_t>(b) * T + tt) * C + h * D + d]) *
                                              (bo[static_cast<std::size_t>(tt) * D + d] + kRel * 2 * amax_out);
        }
      auto e = [&](int tt, int s) {
        return u * std::fabs(ds[static_cast<std::size_t>(tt) * T + s]) +
               (1 + u) * att[tt * T + s] * ed[static_cast<std::size_t>(tt)];
      };
      for (int tt = 0; tt < T; ++tt)
        for (int d = 0; d < D; ++d) {
          double bdq = 0;
          for (int s = 0; s <= tt; ++s) bdq += e(tt, s) * std::fabs(qkv[at(1, b, s, h, d)]);
          const std::size_t oi = (static_cast<std::size_t>(b) * T + tt) * C + h * D + d;
          if (!(std::fabs(t.out[oi] - p.out[oi]) <= bo[static_cast<std::size_t>(tt) * D + d] + kRel * 2 * amax_out))
            ++bad_out;
          const std::size_t qi = at(0, b, tt, h, d);
          if (!(std::fabs(t.dqkv[qi] - p.dqkv[qi]) <= scale * bdq + kRel * 2 * amax_d)) ++bad_dq;
        }
      for (int s = 0; s < T; ++s)
        for (int d = 0; d < D; ++d) {
          double bdv = 0, bdk = 0;
          for (int tt = s; tt < T; ++tt) {
            bdv += att[tt * T + s] * std::fabs(dout[(static_cast<std::size_t>(b) * T + tt) * C + h * D + d]);
            bdk += e(tt, s) * std::fabs(qkv[at(0, b, tt, h, d)]);
          }
          const std::size_t ki = at(1, b, s, h, d), vi = at(2, b, s, h, d);
          if (!(std::fabs(t.dqkv[ki] - p.dqkv[ki]) <= scale * bdk + kRel * 2 * amax_d)) ++bad_dk;
          if (!(std::fabs(t.dqkv[vi] - p.dqkv[vi]) <= u * bdv + kRel * 2 * amax_d)) ++bad_dv;
        }
    }
  EXPECT_EQ(bad_out, 0u);
  EXPECT_EQ(bad_dq, 0u);
  EXPECT_EQ(bad_dk, 0u);
  EXPECT_EQ(bad_dv, 0u);
  // The rounding did happen (the bound is not met trivially by fp32 tiles).
  EXPECT_NE(t.out, t32.out);
  EXPECT_NE(t.dqkv, t32.dqkv);
  EXPECT_EQ(t.lse, t32.lse);  // lse comes from the unrounded P
}

TEST(AttentionTiled, KernelTilingAndLimits) {
  EXPECT_EQ(cuda_tiling(64, DType::bf16).block_q, 64);
  EXPECT_EQ(cuda_tiling(64, DType::bf16).block_k, 64);
  EXPECT_EQ(cuda_tiling(128, DType::fp16).block_k, 32);
  EXPECT_EQ(cuda_tiling(128, DType::fp16).round_p, DType::fp16);
  EXPECT_EQ(cuda_tiling(64, DType::fp32).round_p, DType::fp32);
  EXPECT_EQ(cuda_tiling(24, DType::bf16).block_q, 32);  // not a multiple of 16: the plain-FMA tiles
  EXPECT_THROW(cuda_tiling(256, DType::bf16), Error);
  // Zero-size shapes touch nothing.
  ChunkPool pool(1);
  const AttnShapeCpu empty{0, 5, 2, 2, 64, 384, 384, 384, 128};
  tiled_attention_forward(pool, nullptr, nullptr, nullptr, nullptr, nullptr, empty, cuda_tiling(64, DType::fp32));
  tiled_attention_backward(pool, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                           AttnShapeCpu{2, 0, 2, 2, 64, 384, 384, 384, 128}, cuda_tiling(64, DType::fp32));
}

}  // namespace
}  // namespace zinf::ops
