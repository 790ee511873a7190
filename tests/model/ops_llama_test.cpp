// ops_llama_test.cpp — the Llama family's reference ops and whole model against double-precision
// references that live here: forward within 1e-4 relative; backward against central finite
// differences of the reference (J = Σ out·g for a random g, or the loss) within 2e-3 relative (+1e-4
// absolute); Llama 3's RoPE frequency scaling at its published settings; the same bits for one and
// two threads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "cpu/cpu_ops.h"
#include "cpu/ops_llama.h"
#include "grad_check.h"
#include "model/host_math.h"
#include "model/llama.h"
#include "common/random_floats.h"
#include "zinf/error.h"
#include "zinf/backends/cpu.h"
#include "zinf/device.h"

namespace zinf {
namespace {

using namespace test;

VD ref_rmsnorm(const VD& x, const VD& w, int R, int C, double eps) {
  VD o(x.size());
  for (int r = 0; r < R; ++r) {
    double ss = 0;
    for (int i = 0; i < C; ++i) ss += x[static_cast<std::size_t>(r) * C + i] * x[static_cast<std::size_t>(r) * C + i];
    const double s = 1 / std::sqrt(ss / C + eps);
    for (int i = 0; i < C; ++i)
      o[static_cast<std::size_t>(r) * C + i] =
          x[static_cast<std::size_t>(r) * C + i] * s * w[static_cast<std::size_t>(i)];
  }
  return o;
}
// Hugging Face's rotate_half convention: (x_i, x_{i+D/2}) rotated by position × inv_freq[i].
VD ref_rope(const VD& x, int R, int T, int heads, int D, const std::vector<double>& f) {
  VD o(x.size());
  const int half = D / 2;
  for (int r = 0; r < R; ++r)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < half; ++i) {
        const std::size_t b = (static_cast<std::size_t>(r) * heads + h) * D;
        const double a = (r % T) * f[static_cast<std::size_t>(i)];
        o[b + i] = x[b + i] * std::cos(a) - x[b + i + half] * std::sin(a);
        o[b + i + half] = x[b + i + half] * std::cos(a) + x[b + i] * std::sin(a);
      }
  return o;
}
VD ref_swiglu(const VD& g, const VD& u) {
  VD o(g.size());
  for (std::size_t i = 0; i < g.size(); ++i) o[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
  return o;
}
// Brute force over the full mask: key s is seen from t iff s <= t and (W = 0 or t - s < W), the
// others' weights exactly 0.
VD ref_gqa(const VD& q, const VD& k, const VD& v, int B, int T, int H, int KV, int D, int W = 0) {
  VD o(static_cast<std::size_t>(B) * T * H * D, 0.0);
  const int group = H / KV;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int t = 0; t < T; ++t) {
        const int j = h / group;
        auto qa = [&](int i) {
          return q[(static_cast<std::size_t>(b) * T + t) * H * D + static_cast<std::size_t>(h) * D + i];
        };
        auto ka = [&](int s, int i) {
          return k[(static_cast<std::size_t>(b) * T + s) * KV * D + static_cast<std::size_t>(j) * D + i];
        };
        auto va = [&](int s, int i) {
          return v[(static_cast<std::size_t>(b) * T + s) * KV * D + static_cast<std::size_t>(j) * D + i];
        };
        auto seen = [&](int s) { return s <= t && (W == 0 || t - s < W); };
        VD a(static_cast<std::size_t>(T), 0.0);
        double mx = -1e300, sum = 0;
        for (int s = 0; s < T; ++s) {
          if (!seen(s)) continue;
          double d = 0;
          for (int i = 0; i < D; ++i) d += qa(i) * ka(s, i);
          mx = std::max(mx, a[static_cast<std::size_t>(s)] = d / std::sqrt(static_cast<double>(D)));
        }
        for (int s = 0; s < T; ++s)
          sum += (a[static_cast<std::size_t>(s)] = seen(s) ? std::exp(a[static_cast<std::size_t>(s)] - mx) : 0.0);
        for (int s = 0; s < T; ++s)
          for (int i = 0; i < D; ++i)
            o[(static_cast<std::size_t>(b) * T + t) * H * D + static_cast<std::size_t>(h) * D + i] +=
                a[static_cast<std::size_t>(s)] / sum * va(s, i);
      }
  return o;
}

ops::ChunkPool& par(int threads = 2) {
  static ops::ChunkPool one(1), two(2);
  return threads == 1 ? one : two;
}

TEST(OpsLlama, RmsNorm) {
  const int R = 67, C = 13;  // crosses the 64-row chunk
  VF x = randf(static_cast<std::size_t>(R) * C, 1), w = randf(C, 2), g = randf(x.size(), 3), out(x.size()), rstd(R);
  ops::rmsnorm_forward(par(), out.data(), rstd.data(), x.data(), w.data(), R, C, 1e-5f);
  VD xd = to_d(x), wd = to_d(w);
  expect_close("rmsnorm out", out, ref_rmsnorm(xd, wd, R, C, 1e-5));
  VF dx(x.size(), 0), dw(C, 0);
  ops::rmsnorm_backward(par(), dx.data(), dw.data(), g.data(), x.data(), w.data(), rstd.data(), R, C);
  auto J = [&] { return dot(ref_rmsnorm(xd, wd, R, C, 1e-5), g); };
  check_grad("rmsnorm dx", dx, xd, J);
  check_grad("rmsnorm dw", dw, wd, J);
}

TEST(OpsLlama, RopeRotatesPairsAndItsBackwardIsTheInverseRotation) {
  const int B = 2, T = 9, heads = 3, D = 8, R = B * T;
  const auto f = ops::rope_inv_freq(D, 10000.0);
  std::vector<float> co, si;
  ops::rope_tables(f, T, co, si);
  VF x = randf(static_cast<std::size_t>(R) * heads * D, 4), g = randf(x.size(), 5), y = x;
  ops::rope_apply(par(), y.data(), co.data(), si.data(), R, T, heads, D, false);
  VD xd = to_d(x);
  expect_close("rope out", y, ref_rope(xd, R, T, heads, D, f));
  VF dx = g;
  ops::rope_apply(par(), dx.data(), co.data(), si.data(), R, T, heads, D, true);
  check_grad("rope dx", dx, xd, [&] { return dot(ref_rope(xd, R, T, heads, D, f), g); });
}

// The other rotary types of transformers' rope_type, against their definitions.
ops::RopeScaling rope_of(const char* type) {
  ops::RopeScaling r;
  r.type = type;
  return r;
}

TEST(OpsLlama, RopeFrequenciesOfLinearYarnAndLongrope) {
  const int D = 32;
  const double theta = 10000;
  const auto plain = ops::rope_inv_freq(D, theta, rope_of("default"));
  EXPECT_EQ(plain, ops::rope_inv_freq(D, theta));  // llama3 with factor 1 is no scaling too
  ops::RopeScaling lin = rope_of("linear");
  lin.factor = 4;
  const auto l = ops::rope_inv_freq(D, theta, lin);
  for (std::size_t i = 0; i < plain.size(); ++i) EXPECT_DOUBLE_EQ(l[i], plain[i] / 4) << i;
  EXPECT_EQ(ops::rope_attention_factor(lin), 1.0);
  // YaRN: the dimensions before the ramp keep their frequency, those after it are divided by factor.
  ops::RopeScaling y = rope_of("yarn");
  y.factor = 8, y.original_max_position_embeddings = 256;
  const auto f = ops::rope_inv_freq(D, theta, y);
  const double low = std::floor(D * std::log(256 / (32 * 2 * M_PI)) / (2 * std::log(theta)));
  const double high = std::ceil(D * std::log(256 / (1 * 2 * M_PI)) / (2 * std::log(theta)));
  ASSERT_LT(low + 1, high);
  for (std::size_t i = 0; i < f.size(); ++i) {
    if (static_cast<double>(i) <= low) {
      EXPECT_DOUBLE_EQ(f[i], plain[i]) << i;
    } else if (static_cast<double>(i) >= high) {
      EXPECT_DOUBLE_EQ(f[i], plain[i] / 8) << i;
    } else {
      EXPECT_LT(f[i], plain[i]) << i;
      EXPECT_GT(f[i], plain[i] / 8) << i;
    }
  }
  EXPECT_NEAR(ops::rope_attention_factor(y), 0.1 * std::log(8.0) + 1, 1e-15);
  y.mscale = 1, y.mscale_all_dim = 0.5;
  EXPECT_NEAR(ops::rope_attention_factor(y), (0.1 * std::log(8.0) + 1) / (0.05 * std::log(8.0) + 1), 1e-15);
  y.attention_factor = 1.25;
  EXPECT_EQ(ops::rope_attention_factor(y), 1.25);
  // longrope: short factors up to the original context, long ones past it.
  ops::RopeScaling r = rope_of("longrope");
  r.factor = 4, r.original_max_position_embeddings = 64;
  for (int i = 0; i < D / 2; ++i) r.short_factor.push_back(1 + i), r.long_factor.push_back(10 + i);
  const auto s = ops::rope_inv_freq(D, theta, r, 64), g = ops::rope_inv_freq(D, theta, r, 65);
  for (std::size_t i = 0; i < plain.size(); ++i) {
    EXPECT_DOUBLE_EQ(s[i], plain[i] / (1.0 + static_cast<double>(i))) << i;
    EXPECT_DOUBLE_EQ(g[i], plain[i] / (10.0 + static_cast<double>(i))) << i;
  }
  EXPECT_NEAR(ops::rope_attention_factor(r), std::sqrt(1 + std::log(4.0) / std::log(64.0)), 1e-15);
  // The factor multiplies both tables.
  std::vector<float> c1, s1, c2, s2;
  ops::rope_tables(plain, 5, c1, s1);
  ops::rope_tables(plain, 5, c2, s2, 1.5);
  for (std::size_t i = 0; i < c1.size(); ++i) {
    EXPECT_NEAR(c2[i], 1.5f * c1[i], 1e-6) << i;
    EXPECT_NEAR(s2[i], 1.5f * s1[i], 1e-6) << i;
  }
  // dynamic: the default frequencies up to max_position_embeddings; a longer table is refused.
  ops::RopeScaling dyn = rope_of("dynamic");
  dyn.factor = 2, dyn.max_position_embeddings = 64;
  EXPECT_EQ(ops::rope_inv_freq(D, theta, dyn, 64), plain);
  EXPECT_THROW(ops::rope_inv_freq(D, theta, dyn, 65), ConfigError);
}

TEST(OpsLlama, RopeFrequenciesFollowLlama3Scaling) {
  const int D = 128;
  const auto plain = ops::rope_inv_freq(D, 500000.0);
  EXPECT_DOUBLE_EQ(plain[0], 1.0);
  EXPECT_NEAR(plain[1], std::pow(500000.0, -2.0 / D), 1e-15);
  ops::RopeScaling s;  // Llama 3.1's published rope_scaling
  s.factor = 8, s.low_freq_factor = 1, s.high_freq_factor = 4, s.original_max_position_embeddings = 8192;
  const auto scaled = ops::rope_inv_freq(D, 500000.0, s);
  int kept = 0, slowed = 0, between = 0;
  for (std::size_t i = 0; i < plain.size(); ++i) {
    const double wavelen = 2 * M_PI / plain[i];
    if (wavelen < 8192.0 / 4) {
      EXPECT_EQ(scaled[i], plain[i]) << i;
      ++kept;
    } else if (wavelen > 8192.0 / 1) {
      EXPECT_DOUBLE_EQ(scaled[i], plain[i] / 8) << i;
      ++slowed;
    } else {
      EXPECT_GT(scaled[i], plain[i] / 8) << i;
      EXPECT_LT(scaled[i], plain[i]) << i;
      ++between;
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(slowed, 0);
  EXPECT_GT(between, 0);
}

TEST(OpsLlama, SwiGlu) {
  VF gt = randf(3000, 6, 3.0f), up = randf(3000, 7), g = randf(3000, 8), out(3000), dg(3000), du(3000);
  ops::swiglu_forward(par(), out.data(), gt.data(), up.data(), out.size());
  VD gd = to_d(gt), ud = to_d(up);
  expect_close("swiglu out", out, ref_swiglu(gd, ud));
  ops::swiglu_backward(par(), dg.data(), du.data(), g.data(), gt.data(), up.data(), out.size());
  auto J = [&] { return dot(ref_swiglu(gd, ud), g); };
  check_grad("swiglu dgate", dg, gd, J);
  check_grad("swiglu dup", du, ud, J);
}

TEST(OpsLlama, GroupedQueryAttention) {
  // multi-query, grouped, and plain multi-head; no window, windows shorter than the sequence, one of
  // a single key (each row attends itself only)
  for (int KV : {1, 2, 4})
    for (int W : {0, 3, 1}) {
      SCOPED_TRACE("kv heads " + std::to_string(KV) + ", window " + std::to_string(W));
      const int B = 2, T = 6, H = 4, D = 4, R = B * T;
      VF q = randf(static_cast<std::size_t>(R) * H * D, 9), k = randf(static_cast<std::size_t>(R) * KV * D, 10),
         v = randf(static_cast<std::size_t>(R) * KV * D, 11), g = randf(q.size(), 12);
      VF out(q.size()), att(static_cast<std::size_t>(B) * H * T * T);
      ops::gqa_attention_forward(par(), out.data(), att.data(), q.data(), k.data(), v.data(), B, T, H, KV, D, W);
      VD qd = to_d(q), kd = to_d(k), vd = to_d(v);
      expect_close("gqa out", out, ref_gqa(qd, kd, vd, B, T, H, KV, D, W));
      VF dq(q.size()), dk(k.size()), dv(v.size());
      ops::gqa_attention_backward(par(), dq.data(), dk.data(), dv.data(), g.data(), q.data(), k.data(), v.data(),
                                  att.data(), out.data(), B, T, H, KV, D, W);
      auto J = [&] { return dot(ref_gqa(qd, kd, vd, B, T, H, KV, D, W), g); };
      check_grad("gqa dq", dq, qd, J);
      check_grad("gqa dk", dk, kd, J);
      check_grad("gqa dv", dv, vd, J);
    }
}

TEST(OpsLlama, ResultsDoNotDependOnTheThreadCount) {
  const int B = 3, T = 40, H = 6, KV = 2, D = 8, R = B * T, C = H * D;
  VF x = randf(static_cast<std::size_t>(R) * C, 13), w = randf(C, 14), q = randf(static_cast<std::size_t>(R) * C, 15),
     k = randf(static_cast<std::size_t>(R) * KV * D, 16), v = randf(k.size(), 17), g = randf(q.size(), 18);
  auto run = [&](int threads) {
    VF out(x.size()), rstd(R), dx(x.size(), 0), dw(C, 0), o(q.size()), att(static_cast<std::size_t>(B) * H * T * T),
        dq(q.size()), dk(k.size()), dv(v.size());
    ops::rmsnorm_forward(par(threads), out.data(), rstd.data(), x.data(), w.data(), R, C, 1e-6f);
    ops::rmsnorm_backward(par(threads), dx.data(), dw.data(), g.data(), x.data(), w.data(), rstd.data(), R, C);
    ops::gqa_attention_forward(par(threads), o.data(), att.data(), q.data(), k.data(), v.data(), B, T, H, KV, D, 0);
    ops::gqa_attention_backward(par(threads), dq.data(), dk.data(), dv.data(), g.data(), q.data(), k.data(), v.data(),
                                att.data(), o.data(), B, T, H, KV, D, 0);
    // and with a window
    VF ow(q.size()), dqw(q.size()), dkw(k.size()), dvw(v.size());
    ops::gqa_attention_forward(par(threads), ow.data(), att.data(), q.data(), k.data(), v.data(), B, T, H, KV, D, 7);
    ops::gqa_attention_backward(par(threads), dqw.data(), dkw.data(), dvw.data(), g.data(), q.data(), k.data(),
                                v.data(), att.data(), ow.data(), B, T, H, KV, D, 7);
    VF all;
    for (const VF* p : {&out, &dx, &dw, &o, &dq, &dk, &dv, &ow, &dqw, &dkw, &dvw})
      all.insert(all.end(), p->begin(), p->end());
    return all;
  };
  const VF one = run(1), two = run(2);
  ASSERT_EQ(one.size(), two.size());
  EXPECT_EQ(std::memcmp(one.data(), two.data(), one.size() * 4), 0);
}

// The whole Llama model in double, on the same unit layout as the model (llama.h).
double ref_llama_loss(const std::vector<VD>& u, const ModelShape& s, int B, const std::vector<int>& tok,
                      const std::vector<int>& tg) {
  const int C = s.d_model, V = s.vocab_size, T = s.seq_len, R = B * T, L = s.n_layer, H = s.n_head, KV = s.kv_heads(),
            D = s.head_dim(), F = s.d_ff, KVD = KV * D;
  ops::RopeScaling sc;
  sc.factor = s.rope_factor, sc.low_freq_factor = s.rope_low_freq_factor, sc.high_freq_factor = s.rope_high_freq_factor;
  sc.original_max_position_embeddings = s.rope_original_max;
  const auto f = ops::rope_inv_freq(D, s.rope_theta, sc);
  VD x(static_cast<std::size_t>(R) * C);
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < C; ++i)
      x[static_cast<std::size_t>(r) * C + i] = u[0][static_cast<std::size_t>(tok[static_cast<std::size_t>(r)]) * C + i];
  for (int l = 0; l < L; ++l) {
    UnitReader unit(u[static_cast<std::size_t>(l) + 1]);
    const std::size_t c = static_cast<std::size_t>(C), kvd = static_cast<std::size_t>(KVD),
                      ff = static_cast<std::size_t>(F);
    VD an_w = unit.take(c), wq = unit.take(c * c), bq = s.qkv_bias ? unit.take(c) : VD{}, wk = unit.take(c * kvd),
       bk = s.qkv_bias ? unit.take(kvd) : VD{}, wv = unit.take(c * kvd), bv = s.qkv_bias ? unit.take(kvd) : VD{},
       wo = unit.take(c * c), fn_w = unit.take(c), wg = unit.take(c * ff), wu = unit.take(c * ff),
       wd = unit.take(ff * c);
    const VD an = ref_rmsnorm(x, an_w, R, C, s.norm_eps);
    const VD q = ref_rope(ref_matmul(an, wq, bq, R, C, C), R, T, H, D, f);
    const VD k = ref_rope(ref_matmul(an, wk, bk, R, C, KVD), R, T, KV, D, f);
    const VD v = ref_matmul(an, wv, bv, R, C, KVD);
    const VD a = ref_matmul(ref_gqa(q, k, v, B, T, H, KV, D), wo, {}, R, C, C);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += a[i];
    const VD fn = ref_rmsnorm(x, fn_w, R, C, s.norm_eps);
    const VD m =
        ref_matmul(ref_swiglu(ref_matmul(fn, wg, {}, R, C, F), ref_matmul(fn, wu, {}, R, C, F)), wd, {}, R, F, C);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += m[i];
  }
  const VD& fin = u[static_cast<std::size_t>(L) + 1];
  const VD lnf = ref_rmsnorm(x, VD(fin.begin(), fin.begin() + C), R, C, s.norm_eps);
  const VD head = s.tie_embeddings ? u[0] : VD(fin.begin() + C, fin.end());
  return ref_lm_loss(lnf, head, tg, R, C, V);
}

TEST(OpsLlama, WholeModelAgainstDoubleReference) {
  struct Case {
    const char* name;
    bool tied, bias, ckpt;
    double rope_factor;
  };
  for (const Case& k :
       {Case{"tied", true, false, false, 1}, Case{"untied, q/k/v biases, checkpointing", false, true, true, 1},
        Case{"Llama 3 rope scaling", true, false, false, 4}}) {
    SCOPED_TRACE(k.name);
    ModelShape s{2, 4, 16, 11, 5};
    s.family = ModelFamily::llama;
    s.n_kv_head = 2, s.d_ff = 12, s.tie_embeddings = k.tied, s.qkv_bias = k.bias, s.norm_eps = 1e-5;
    s.rope_factor = k.rope_factor, s.rope_original_max = 4,
    s.rope_theta = 100;  // short wavelengths, so scaling matters here
    const int B = 2, R = B * s.seq_len;
    auto dev = make_cpu_device(64 << 20);
    CpuOps backend(par());
    LlamaModel model(s, B, k.ckpt, *dev, backend);
    std::vector<int> tok(static_cast<std::size_t>(R)), tg(static_cast<std::size_t>(R));
    for (int r = 0; r < R; ++r)
      tok[static_cast<std::size_t>(r)] = (r * 7 + 3) % 11, tg[static_cast<std::size_t>(r)] = (r * 5 + 1) % 11;
    check_whole_model(model, s, B, 200, 0.4f, tok, tg,
                      [&](const std::vector<VD>& ud) { return ref_llama_loss(ud, s, B, tok, tg); });
  }
}

}  // namespace
}  // namespace zinf
