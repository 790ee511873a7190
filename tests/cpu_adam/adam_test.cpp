// adam_test.cpp — the fused Update on every SIMD path this CPU has, against the scalar reference,
// bit for bit; the reference against a double-precision textbook Adam; thread-count independence.
#include <gtest/gtest.h>

#include "paths.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "zinf/cpu_adam/adam.h"
#include "zinf/cpu_adam/convert.h"
#include "zinf/cpu_adam/host_threads.h"

namespace zinf::cpu_adam {
namespace {

// llm.c-style check: counts mismatches, prints the first few, max abs/rel difference. NaN == NaN.
template <class T>
int count_mismatches(const char* what, const T* a, const T* b, std::size_t n) {
  int bad = 0;
  double max_abs = 0, max_rel = 0;
  for (std::size_t i = 0; i < n; ++i) {
    bool same;
    if constexpr (std::is_same_v<T, float>)
      same = bits(a[i]) == bits(b[i]) || (std::isnan(a[i]) && std::isnan(b[i]));
    else
      same = a[i] == b[i] ||
             (((a[i] & 0x7C00) == 0x7C00 && (a[i] & 0x3FF)) && ((b[i] & 0x7C00) == 0x7C00 && (b[i] & 0x3FF)));
    if (!same) {
      if (bad < 5) ADD_FAILURE() << what << "[" << i << "]: " << +a[i] << " vs " << +b[i];
      if constexpr (std::is_same_v<T, float>) {
        max_abs = std::max(max_abs, static_cast<double>(std::fabs(a[i] - b[i])));
        max_rel = std::max(max_rel, static_cast<double>(std::fabs(a[i] - b[i]) / std::max(1e-30f, std::fabs(b[i]))));
      }
      ++bad;
    }
  }
  if (bad) ADD_FAILURE() << what << ": " << bad << " mismatches, max abs " << max_abs << ", max rel " << max_rel;
  return bad;
}

struct State {
  std::vector<float> master, m, v, grad32;
  std::vector<std::uint16_t> grad16, out;
};

State make_state(std::size_t n, GradType gt, std::uint32_t seed, bool specials) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(0.0f, 1e-3f);
  State s;
  s.master.resize(n + 1);
  s.m.resize(n + 1);
  s.v.resize(n + 1);
  s.grad32.resize(n + 1);
  s.grad16.resize(n + 1);
  s.out.assign(n + 1, 0xABCD);
  for (std::size_t i = 0; i < n + 1; ++i) {
    s.master[i] = nd(rng) * 0.02f;
    s.m[i] = nd(rng) * 1e-3f;
    s.v[i] = ud(rng) * 1e-3f;
    float g = nd(rng) * (i % 7 == 0 ? 100.0f : 0.01f);
    if (specials && i % 97 == 5) g = (i % 2) ? INFINITY : NAN;
    s.grad32[i] = g;
  }
  if (gt == GradType::fp16) fp32_to_fp16(s.grad32.data(), s.grad16.data(), n + 1, SimdLevel::scalar);
  if (gt == GradType::bf16) fp32_to_bf16(s.grad32.data(), s.grad16.data(), n + 1, SimdLevel::scalar);
  return s;
}

UpdateChunk chunk_of(State& s, std::size_t n, GradType gt, bool out, HalfType ht, std::size_t off) {
  UpdateChunk c;
  c.n = n;
  c.grad_type = gt;
  c.grad = gt == GradType::fp32 ? static_cast<const void*>(s.grad32.data() + off) : s.grad16.data() + off;
  c.master = s.master.data() + off;
  c.m = s.m.data() + off;
  c.v = s.v.data() + off;
  c.param16 = out ? s.out.data() + off : nullptr;
  c.param16_type = ht;
  return c;
}

struct HyperCase {
  const char* name;
  AdamHyper h;
  std::int64_t step;
  float grad_scale;
};

std::vector<HyperCase> hyper_cases() {
  AdamHyper adamw{.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.1f, .decoupled = true};
  AdamHyper nowd = adamw;
  nowd.weight_decay = 0;
  AdamHyper l2 = adamw;
  l2.decoupled = false;
  l2.weight_decay = 0.05f;
  AdamHyper nobc = adamw;
  nobc.bias_correction = false;
  return {{"adamw_step1", adamw, 1, 1.0f},
          {"adamw_step10", adamw, 10, 1.0f / 1024},
          {"adamw_step1e6", adamw, 1000000, 0.5f},
          {"wd0", nowd, 3, 1.0f},
          {"l2", l2, 5, 1.0f / 65536},
          {"no_bias_correction", nobc, 2, 1.0f}};
}

TEST(AdamUpdate, EveryPathMatchesTheReferenceBitForBit) {
  const std::size_t sizes[] = {0, 1, 15, 16, 17, 31, 1023, 4099};
  for (SimdLevel path : supported_paths()) {
    for (std::size_t n : sizes) {
      for (GradType gt : {GradType::fp32, GradType::fp16, GradType::bf16}) {
        for (int out = 0; out < 3; ++out) {
          for (const auto& hc : hyper_cases()) {
            for (std::size_t off : {std::size_t{0}, std::size_t{1}}) {  // 1: every pointer misaligned
              SCOPED_TRACE(::testing::Message() << to_string(path) << " n=" << n << " grad=" << static_cast<int>(gt)
                                                << " out=" << out << " " << hc.name << " off=" << off);
              const HalfType ht = out == 2 ? HalfType::bf16 : HalfType::fp16;
              State a = make_state(n, gt, static_cast<std::uint32_t>(n * 31 + off), false), b = a;
              const AdamStep st = make_adam_step(hc.h, hc.step, hc.grad_scale);
              adam_update_reference(st, chunk_of(a, n, gt, out > 0, ht, off));
              adam_update(st, chunk_of(b, n, gt, out > 0, ht, off), path);
              ASSERT_EQ(count_mismatches("master", b.master.data(), a.master.data(), n + 1), 0);
              ASSERT_EQ(count_mismatches("m", b.m.data(), a.m.data(), n + 1), 0);
              ASSERT_EQ(count_mismatches("v", b.v.data(), a.v.data(), n + 1), 0);
              ASSERT_EQ(count_mismatches("param16", b.out.data(), a.out.data(), n + 1), 0);
              if (n > 0) {  // the update did something
                EXPECT_NE(b.master[off],
                          make_state(n, gt, static_cast<std::uint32_t>(n * 31 + off), false).master[off]);
              }
            }
          }
        }
      }
    }
  }
}

TEST(AdamUpdate, LargeOddSizeMatchesOnEveryPath) {
  const std::size_t n = (std::size_t{1} << 18) + 37;
  const AdamStep st = make_adam_step(AdamHyper{.lr = 3e-4f, .weight_decay = 0.01f}, 7, 1.0f / 4096);
  State ref = make_state(n, GradType::fp16, 99, false);
  State base = ref;
  adam_update_reference(st, chunk_of(ref, n, GradType::fp16, true, HalfType::bf16, 0));
  for (SimdLevel path : supported_paths()) {
    SCOPED_TRACE(to_string(path));
    State s = base;
    adam_update(st, chunk_of(s, n, GradType::fp16, true, HalfType::bf16, 0), path);
    EXPECT_EQ(count_mismatches("master", s.master.data(), ref.master.data(), n), 0);
    EXPECT_EQ(count_mismatches("param16", s.out.data(), ref.out.data(), n), 0);
  }
}

TEST(AdamUpdate, NonFiniteGradientsAgreeAcrossPaths) {
  // A step with Inf/NaN gradients is skipped by the loss scaler, but the kernel must still be
  // deterministic: the same elements become NaN/Inf on every path.
  const std::size_t n = 1000;
  const AdamStep st = make_adam_step(AdamHyper{}, 1);
  State ref = make_state(n, GradType::fp32, 5, true);
  State base = ref;
  adam_update_reference(st, chunk_of(ref, n, GradType::fp32, true, HalfType::fp16, 0));
  for (SimdLevel path : supported_paths()) {
    State s = base;
    adam_update(st, chunk_of(s, n, GradType::fp32, true, HalfType::fp16, 0), path);
    EXPECT_EQ(count_mismatches("master", s.master.data(), ref.master.data(), n), 0) << to_string(path);
  }
  int nonfinite = 0;
  for (std::size_t i = 0; i < n; ++i) nonfinite += !std::isfinite(ref.master[i]);
  EXPECT_GT(nonfinite, 0);
}

TEST(AdamUpdate, ReferenceTracksTextbookAdamInDouble) {
  // 200 steps of AdamW on 512 parameters of order 1; the fp32 reference stays within 1e-5 absolute
  // (about 200 steps x a few fp32 ulps) of the same algorithm in double (PyTorch's formulation: eps
  // outside the bias correction, decoupled decay before the step).
  const std::size_t n = 512;
  const AdamHyper h{.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = 0.1f, .decoupled = true};
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> p(n), m(n, 0), v(n, 0), g(n);
  std::vector<double> pd(n), md(n, 0), vd(n, 0);
  for (std::size_t i = 0; i < n; ++i) pd[i] = p[i] = nd(rng);
  for (int t = 1; t <= 200; ++t) {
    for (std::size_t i = 0; i < n; ++i) g[i] = nd(rng) * 0.1f + 0.01f * p[i];
    UpdateChunk c;
    c.n = n;
    c.grad = g.data();
    c.grad_type = GradType::fp32;
    c.master = p.data();
    c.m = m.data();
    c.v = v.data();
    adam_update_reference(make_adam_step(h, t), c);
    for (std::size_t i = 0; i < n; ++i) {
      const double gd = g[i];
      md[i] = 0.9 * md[i] + 0.1 * gd;
      vd[i] = 0.99 * vd[i] + 0.01 * gd * gd;
      const double mhat = md[i] / (1 - std::pow(0.9, t)), vhat = vd[i] / (1 - std::pow(0.99, t));
      pd[i] *= 1 - 1e-2 * 0.1;
      pd[i] -= 1e-2 * mhat / (std::sqrt(vhat) + 1e-8);
    }
  }
  double max_abs = 0, max_p = 0;
  for (std::size_t i = 0; i < n; ++i) {
    max_abs = std::max(max_abs, std::fabs(p[i] - pd[i]));
    max_p = std::max(max_p, std::fabs(pd[i]));
  }
  EXPECT_LT(max_abs, 1e-5) << "max |p| " << max_p;
  EXPECT_GT(max_p, 0.5);
}

TEST(AdamUpdate, AdamStepScalarsFollowDeepSpeed) {
  AdamHyper h{.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .weight_decay = 0.1f, .decoupled = true};
  AdamStep s = make_adam_step(h, 1);
  EXPECT_FLOAT_EQ(s.step_size, static_cast<float>(-1e-3 / (1 - 0.9f)));
  EXPECT_FLOAT_EQ(s.bc2_rsqrt, static_cast<float>(1 / std::sqrt(1 - static_cast<double>(0.999f))));
  EXPECT_FLOAT_EQ(s.decay, static_cast<float>(1 - 1e-3 * static_cast<double>(0.1f)));
  h.bias_correction = false;
  s = make_adam_step(h, 5);
  EXPECT_FLOAT_EQ(s.step_size, -1e-3f);
  EXPECT_FLOAT_EQ(s.bc2_rsqrt, 1.0f);
  h.decoupled = false;
  EXPECT_FLOAT_EQ(make_adam_step(h, 1).decay, 0.1f);
}

// The bias corrections are computed with + and × only (the same bits on every CPU, unlike libm's
// pow): they must still track beta^t closely over a long run, up to the point where they reach 1.
TEST(AdamUpdate, BiasCorrectionsTrackLongDoublePowerOverLongRuns) {
  const AdamHyper h{.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f};
  for (std::int64_t t : {1, 2, 3, 7, 10, 100, 1000, 4097, 65536, 1000000, 123456789}) {
    const AdamStep s = make_adam_step(h, t);
    const long double bc1 = 1.0L - std::pow(static_cast<long double>(h.beta1), static_cast<long double>(t));
    const long double bc2 = 1.0L - std::pow(static_cast<long double>(h.beta2), static_cast<long double>(t));
    const float want_step = static_cast<float>(-1e-3L / bc1);
    const float want_rsqrt = static_cast<float>(1.0L / std::sqrt(bc2));
    EXPECT_LE(std::abs(static_cast<long>(bits(s.step_size)) - static_cast<long>(bits(want_step))), 1) << "step " << t;
    EXPECT_LE(std::abs(static_cast<long>(bits(s.bc2_rsqrt)) - static_cast<long>(bits(want_rsqrt))), 1) << "step " << t;
  }
}

TEST(AdamUpdate, ThreadCountDoesNotChangeResults) {
  const std::size_t n = (std::size_t{1} << 19) + 3;
  const AdamStep st = make_adam_step(AdamHyper{.weight_decay = 0.01f}, 4, 0.25f);
  State base = make_state(n, GradType::fp16, 11, false);
  State one = base, two = base, three = base;
  HostThreads p1(1), p2(2), p3(3);
  adam_update(p1, st, chunk_of(one, n, GradType::fp16, true, HalfType::fp16, 0));
  adam_update(p2, st, chunk_of(two, n, GradType::fp16, true, HalfType::fp16, 0));
  adam_update(p3, st, chunk_of(three, n, GradType::fp16, true, HalfType::fp16, 0));
  EXPECT_EQ(count_mismatches("master 1v2", one.master.data(), two.master.data(), n), 0);
  EXPECT_EQ(count_mismatches("master 1v3", one.master.data(), three.master.data(), n), 0);
  EXPECT_EQ(count_mismatches("out 1v3", one.out.data(), three.out.data(), n), 0);
  EXPECT_EQ(p2.threads(), 2);
}

TEST(HostThreads, ExceptionsReachTheCaller) {
  HostThreads pool(2);
  EXPECT_THROW(pool.parallel_for(1 << 20, 1024,
                                 [](std::size_t b, std::size_t) {
                                   if (b > 0) throw std::runtime_error("worker failed");
                                 }),
               std::runtime_error);
  HostThreads pinned(2, /*pin=*/true);
  std::atomic<std::size_t> covered{0};
  pinned.parallel_for(100000, 1, [&](std::size_t b, std::size_t e) { covered += e - b; });
  EXPECT_EQ(covered.load(), 100000u);
  EXPECT_GE(physical_cores(), 1);
}

}  // namespace
}  // namespace zinf::cpu_adam
