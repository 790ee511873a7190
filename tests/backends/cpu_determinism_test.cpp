// cpu_determinism_test.cpp — the CPU device gives the same bits on every x86-64 machine. What differs
// between machines is emulated here: the cache sizes a tuned GEMM blocks by (Eigen's, set tiny and
// huge), the thread count, the cpu_adam SIMD path, and glibc's choice of FMA or SSE2 variants of its
// math functions (GLIBC_TUNABLES in a child process). The GEMMs must sum each element in k order
// from zero (the reference order, checked bit for bit against a plain loop), exp/log/tanh must come
// from model/fixed_math.h (within one float ulp of libm), and a short training run must end on one
// params_digest under every variation.
#include <gtest/gtest.h>

#include <Eigen/Core>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "app/config/config.h"
#include "app/train/train.h"
#include "cpu/ops_gpt.h"
#include "model/fixed_math.h"
#include "zinf/cpu_adam/simd.h"

namespace zinf {
namespace {

// Cache sizes (L1, L2, L3 in bytes) a machine could report; Eigen blocks its GEMM's k dimension by
// them. The first is what this machine reports.
struct Caches {
  std::ptrdiff_t l1, l2, l3;
};
std::vector<Caches> cache_variants() {
  return {{Eigen::l1CacheSize(), Eigen::l2CacheSize(), Eigen::l3CacheSize()},
          {4 * 1024, 16 * 1024, 64 * 1024},
          {48 * 1024, 2 * 1024 * 1024, 64 * 1024 * 1024},
          {std::ptrdiff_t{1} << 30, std::ptrdiff_t{1} << 31, std::ptrdiff_t{1} << 32}};
}

struct CacheGuard {  // restores this machine's cache sizes after a test
  Caches saved{Eigen::l1CacheSize(), Eigen::l2CacheSize(), Eigen::l3CacheSize()};
  ~CacheGuard() { Eigen::setCpuCacheSizes(saved.l1, saved.l2, saved.l3); }
};

std::vector<float> random_vec(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// The reference order: s = 0; s += a(i,k)·b(k,j) for k = 0, 1, …, one fp32 rounding each.
template <class A, class B>
float dot_in_order(int K, A a, B b) {
  float s = 0;
  for (int k = 0; k < K; ++k) {
    const volatile float prod = a(k) * b(k);  // volatile: no fusion into an FMA here either
    s = s + prod;
  }
  return s;
}

TEST(CpuDeterminism, GemmsSumInKOrderWhateverTheCacheSizes) {
  CacheGuard guard;
  // Odd sizes (edges of every tile), a long k (R = 300 rows in the weight gradient) and the tiny
  // model's widest k (512).
  const int R = 300, IC = 72, OC = 520;
  const auto x = random_vec(static_cast<std::size_t>(R) * IC, 1), w = random_vec(static_cast<std::size_t>(IC) * OC, 2),
             bias = random_vec(OC, 3), dy = random_vec(static_cast<std::size_t>(R) * OC, 4),
             dx0 = random_vec(static_cast<std::size_t>(R) * IC, 5),
             dw0 = random_vec(static_cast<std::size_t>(IC) * OC, 6);
  for (const Caches& c : cache_variants())
    for (int threads : {1, 2}) {
      SCOPED_TRACE("l1 " + std::to_string(c.l1) + " threads " + std::to_string(threads));
      Eigen::setCpuCacheSizes(c.l1, c.l2, c.l3);
      ops::ChunkPool par(threads);
      std::vector<float> out(static_cast<std::size_t>(R) * OC), dx = dx0, dw = dw0, db(OC, 0.0f);
      ops::matmul_forward(par, out.data(), x.data(), w.data(), bias.data(), R, IC, OC);
      ops::matmul_backward(par, dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), R, IC, OC);
      // The three products of a GEMM and its backward, each summed in the reference's order: three loops
      // of the same shape over different operands.
      int bad_out = 0, bad_dx = 0, bad_dw = 0;
      for (int r = 0; r < R; ++r)
        for (int o = 0; o < OC; ++o) {
          const float s = dot_in_order(
              IC, [&](int k) { return x[static_cast<std::size_t>(r) * IC + k]; },
              [&](int k) { return w[static_cast<std::size_t>(k) * OC + o]; });
          bad_out += out[static_cast<std::size_t>(r) * OC + o] != s + bias[o];
        }
      for (int r = 0; r < R; ++r)
        for (int i = 0; i < IC; ++i) {
          const float s = dot_in_order(
              OC, [&](int k) { return dy[static_cast<std::size_t>(r) * OC + k]; },
              [&](int k) { return w[static_cast<std::size_t>(i) * OC + k]; });
          bad_dx += dx[static_cast<std::size_t>(r) * IC + i] != dx0[static_cast<std::size_t>(r) * IC + i] + s;
        }
      for (int i = 0; i < IC; ++i)
        for (int o = 0; o < OC; ++o) {
          const float s = dot_in_order(
              R, [&](int k) { return x[static_cast<std::size_t>(k) * IC + i]; },
              [&](int k) { return dy[static_cast<std::size_t>(k) * OC + o]; });
          bad_dw += dw[static_cast<std::size_t>(i) * OC + o] != dw0[static_cast<std::size_t>(i) * OC + o] + s;
        }
      EXPECT_EQ(bad_out, 0) << "of " << R * OC << " forward outputs differ from the in-order sum";
      EXPECT_EQ(bad_dx, 0) << "of " << R * IC << " input gradients differ from the in-order sum";
      EXPECT_EQ(bad_dw, 0) << "of " << IC * OC << " weight gradients differ from the in-order sum";
    }
}

TEST(CpuDeterminism, LmHeadSumsInKOrderWhateverTheCacheSizes) {
  CacheGuard guard;
  const int R = 130, C = 72, V = 100;
  const auto x = random_vec(static_cast<std::size_t>(R) * C, 7), wte = random_vec(static_cast<std::size_t>(V) * C, 8),
             dwte0 = random_vec(static_cast<std::size_t>(V) * C, 9);
  std::vector<int> targets(R);
  for (int r = 0; r < R; ++r) targets[static_cast<std::size_t>(r)] = (r * 37) % V;
  for (const Caches& c : cache_variants()) {
    SCOPED_TRACE("l1 " + std::to_string(c.l1));
    Eigen::setCpuCacheSizes(c.l1, c.l2, c.l3);
    ops::ChunkPool par(2);
    std::vector<float> probs(static_cast<std::size_t>(R) * V), losses(R), dx(static_cast<std::size_t>(R) * C),
        dwte = dwte0, dlogits(probs.size());
    ops::lm_head_forward(par, probs.data(), losses.data(), x.data(), wte.data(), targets.data(), R, C, V);
    ops::lm_head_backward(par, dx.data(), dwte.data(), dlogits.data(), probs.data(), x.data(), wte.data(),
                          targets.data(), 1.0f / R, R, C, V);
    int bad_logit = 0, bad_dx = 0, bad_dwte = 0;
    for (int r = 0; r < R; ++r) {  // the logits, through the softmax (fixed::expf) they feed
      std::vector<float> l(static_cast<std::size_t>(V));
      float maxv = -INFINITY, sum = 0;
      for (int v = 0; v < V; ++v) {
        l[static_cast<std::size_t>(v)] = dot_in_order(
            C, [&](int k) { return x[static_cast<std::size_t>(r) * C + k]; },
            [&](int k) { return wte[static_cast<std::size_t>(v) * C + k]; });
        maxv = std::max(maxv, l[static_cast<std::size_t>(v)]);
      }
      for (auto& e : l) sum += (e = fixed::expf(e - maxv));
      for (int v = 0; v < V; ++v)
        bad_logit += probs[static_cast<std::size_t>(r) * V + v] != l[static_cast<std::size_t>(v)] * (1.0f / sum);
    }
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < C; ++i) {
        const float s = dot_in_order(
            V, [&](int k) { return dlogits[static_cast<std::size_t>(r) * V + k]; },
            [&](int k) { return wte[static_cast<std::size_t>(k) * C + i]; });
        bad_dx += dx[static_cast<std::size_t>(r) * C + i] != s;
      }
    for (int v = 0; v < V; ++v)
      for (int i = 0; i < C; ++i) {
        const float s = dot_in_order(
            R, [&](int k) { return dlogits[static_cast<std::size_t>(k) * V + v]; },
            [&](int k) { return x[static_cast<std::size_t>(k) * C + i]; });
        bad_dwte += dwte[static_cast<std::size_t>(v) * C + i] != dwte0[static_cast<std::size_t>(v) * C + i] + s;
      }
    EXPECT_EQ(bad_logit, 0);
    EXPECT_EQ(bad_dx, 0);
    EXPECT_EQ(bad_dwte, 0);
  }
}

// ---- fixed_math against libm's double functions (rounded to float): within one float ulp ------------
std::int64_t ulps(float a, float b) {
  if (a == b) return 0;
  if (std::isnan(a) || std::isnan(b) || std::isinf(a) || std::isinf(b)) return 1 << 30;
  std::int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  if (ia < 0) ia = INT32_MIN - ia;  // order negative floats below positive ones
  if (ib < 0) ib = INT32_MIN - ib;
  return std::llabs(static_cast<std::int64_t>(ia) - ib);
}

TEST(FixedMath, WithinOneUlpOfLibm) {
  std::mt19937 rng(5);
  std::int64_t worst_exp = 0, worst_log = 0, worst_tanh = 0;
  for (int i = 0; i < 400000; ++i) {
    const float e = std::uniform_real_distribution<float>(-103.0f, 88.7f)(rng);
    worst_exp = std::max(worst_exp, ulps(fixed::expf(e), static_cast<float>(std::exp(static_cast<double>(e)))));
    const float l =
        std::ldexp(std::uniform_real_distribution<float>(0.5f, 1.0f)(rng), static_cast<int>(rng() % 250) - 140);
    worst_log = std::max(worst_log, ulps(fixed::logf(l), static_cast<float>(std::log(static_cast<double>(l)))));
    const float t =
        std::ldexp(std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng), static_cast<int>(rng() % 24) - 20);
    worst_tanh = std::max(worst_tanh, ulps(fixed::tanhf(t), static_cast<float>(std::tanh(static_cast<double>(t)))));
  }
  EXPECT_LE(worst_exp, 1);
  EXPECT_LE(worst_log, 1);
  EXPECT_LE(worst_tanh, 1);
  // the edges: saturation, zero, infinities, NaN
  EXPECT_EQ(fixed::expf(-200.0f), 0.0f);
  EXPECT_TRUE(std::isinf(fixed::expf(100.0f)));
  EXPECT_EQ(fixed::expf(0.0f), 1.0f);
  EXPECT_TRUE(std::isnan(fixed::expf(NAN)));
  EXPECT_EQ(fixed::logf(1.0f), 0.0f);
  EXPECT_TRUE(std::isinf(fixed::logf(0.0f)) && fixed::logf(0.0f) < 0);
  EXPECT_TRUE(std::isnan(fixed::logf(-1.0f)));
  EXPECT_EQ(fixed::tanhf(20.0f), 1.0f);
  EXPECT_EQ(fixed::tanhf(-20.0f), -1.0f);
  EXPECT_EQ(fixed::tanhf(0.0f), 0.0f);
  EXPECT_TRUE(std::isnan(fixed::tanhf(NAN)));
  for (double d : {1e-300, 1e-310, 0.3, 1.0, 2.5, 1e300})
    EXPECT_NEAR(fixed::log(d), std::log(d), 1e-15 * std::fabs(std::log(d)) + 1e-300) << d;
  for (double d : {-700.0, -20.0, -1e-3, 0.0, 0.5, 30.0, 700.0, 709.5, 709.78})
    EXPECT_NEAR(fixed::exp(d) / std::exp(d), 1.0, 1e-15) << d;
  {  // beyond 2^20·π/2 … up to the rotary tables' longest sequence (2^20 positions) the reduction stays exact
    double s = 0, c = 0;
    for (double x : {1048575.0, 1.5e6}) {
      fixed::sincos(x, s, c);
      EXPECT_NEAR(s, std::sin(x), 1e-9) << x;
      EXPECT_NEAR(c, std::cos(x), 1e-9) << x;
    }
  }
  // the double functions behind the init, the LR schedule and the rotary tables
  double worst_sincos = 0, worst_pow = 0, worst_dlog = 0;
  for (int i = 0; i < 200000; ++i) {
    const double x =
        std::ldexp(std::uniform_real_distribution<double>(-1.0, 1.0)(rng), static_cast<int>(rng() % 40) - 22);
    double s = 0, c = 0;
    fixed::sincos(x, s, c);
    worst_sincos = std::max({worst_sincos, std::fabs(s - std::sin(x)), std::fabs(c - std::cos(x))});
    const double u = (static_cast<double>(rng() >> 11) + 0.5) * 0x1p-21;
    worst_dlog = std::max(worst_dlog, std::fabs(fixed::log(u) - std::log(u)) / std::fabs(std::log(u)));
    const double e = -std::uniform_real_distribution<double>(0.0, 1.0)(rng);
    worst_pow = std::max(worst_pow, std::fabs(fixed::pow_positive(500000.0, e) / std::pow(500000.0, e) - 1.0));
  }
  EXPECT_LT(worst_sincos, 1e-15 * 0x1p18);  // |x| up to 2^18: the reduction's absolute error grows with x
  EXPECT_LT(worst_dlog, 1e-15);
  EXPECT_LT(worst_pow, 1e-14);
}

// ---- the whole CPU device: one digest -------------------------------------------------------------
// d_model 64 and 64 rows per micro-batch: every GEMM dimension reaches the size at which Eigen starts
// blocking (48), so tiny cache sizes change its k-blocking.
const char* kConfig = R"({"model": {"n_layer": 2, "n_head": 2, "d_model": 64, "vocab_size": 256, "seq_len": 32},
  "train": {"steps": 3, "eval_interval": 0, "eval_batches": 1, "seed": 5},
  "device": {"type": "cpu", "memory_budget": "256MiB"},
  "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "steps_per_print": 1000,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}},
  "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}})";

std::string digest(const std::vector<std::string>& overrides) {
  return train(parse_config(kConfig, overrides), TrainHooks{}).params_digest;
}

TEST(CpuDeterminism, OneDigestWhateverTheCachesThreadsAndSimdPath) {
  CacheGuard guard;
  const std::string expected = digest({"device.threads=1"});
  ASSERT_FALSE(expected.empty());
  for (const Caches& c : cache_variants()) {
    Eigen::setCpuCacheSizes(c.l1, c.l2, c.l3);
    for (const char* threads : {"1", "2"})
      EXPECT_EQ(digest({std::string("device.threads=") + threads}), expected)
          << "L1 " << c.l1 << " threads " << threads;
  }
  std::vector<std::string> paths = {"scalar"};
  if (cpu_adam::detect_simd() >= cpu_adam::SimdLevel::avx2) paths.push_back("avx2");
  if (cpu_adam::detect_simd() >= cpu_adam::SimdLevel::avx512) paths.push_back("avx512");
  for (const auto& path : paths) EXPECT_EQ(digest({"device.simd=\"" + path + "\""}), expected) << "cpu_adam " << path;
}

// glibc chooses the FMA, AVX2 or SSE2 variants of its math functions from CPUID at load time;
// GLIBC_TUNABLES masks the CPU features, so a child process sees the libm of an older machine.
std::string run_digest(const std::string& env) {
  const std::string cfg = ::testing::TempDir() + "cpu_determinism.json";
  if (FILE* f = std::fopen(cfg.c_str(), "w")) {
    std::fputs(kConfig, f);
    std::fclose(f);
  }
  const std::string cmd = env + " " + ZINF_BIN + " train --config " + cfg + " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return "";
  std::string out;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  pclose(p);
  const auto at = out.rfind("params_digest=");
  return at == std::string::npos ? out : out.substr(at + 14, 16);
}

TEST(CpuDeterminism, OneDigestWhateverLibmVariantGlibcPicks) {
  const std::string base = run_digest("");
  ASSERT_EQ(base.size(), 16u) << base;
  EXPECT_EQ(run_digest("GLIBC_TUNABLES=glibc.cpu.hwcaps=-AVX2,-FMA,-AVX512F"), base) << "libm without FMA and AVX2";
  EXPECT_EQ(run_digest("GLIBC_TUNABLES=glibc.cpu.hwcaps=-AVX512F,-AVX512DQ"), base) << "libm without AVX-512";
}

}  // namespace
}  // namespace zinf
