// norm_test.cpp — the gradient sum-of-squares pre-pass: identical on every path and every thread
// count, close to a long-double sum, and it reports NaN/Inf wherever they sit.
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

struct Grads {
  std::vector<float> f32;
  std::vector<std::uint16_t> f16, b16;
};
Grads grads(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  Grads g;
  g.f32.resize(n);
  for (auto& x : g.f32) x = nd(rng);
  g.f16.resize(n);
  g.b16.resize(n);
  fp32_to_fp16(g.f32.data(), g.f16.data(), n);
  fp32_to_bf16(g.f32.data(), g.b16.data(), n);
  return g;
}
const void* ptr(const Grads& g, GradType t) {
  return t == GradType::fp32   ? static_cast<const void*>(g.f32.data())
         : t == GradType::fp16 ? g.f16.data()
                               : g.b16.data();
}

TEST(SumSquares, EveryPathMatchesTheReferenceBitForBit) {
  for (std::size_t n : {0, 1, 15, 16, 17, 33, 1000, 65537}) {
    Grads g = grads(n, static_cast<std::uint32_t>(n));
    for (GradType t : {GradType::fp32, GradType::fp16, GradType::bf16}) {
      const SumSquares ref = sum_squares_reference(ptr(g, t), t, n);
      EXPECT_TRUE(ref.finite);
      for (SimdLevel p : supported_paths()) {
        const SumSquares s = sum_squares(ptr(g, t), t, n, p);
        EXPECT_EQ(bits(s.sum), bits(ref.sum)) << to_string(p) << " n=" << n << " t=" << static_cast<int>(t);
      }
    }
  }
}

TEST(SumSquares, CloseToLongDoubleSum) {
  const std::size_t n = 300001;
  Grads g = grads(n, 9);
  long double exact = 0;
  for (float x : g.f32) exact += static_cast<long double>(x) * x;
  const double s = sum_squares(g.f32.data(), GradType::fp32, n).sum;
  EXPECT_NEAR(s / static_cast<double>(exact), 1.0, 1e-12);
}

TEST(SumSquares, NonFiniteIsReportedAnywhere) {
  const std::size_t n = 1000;
  for (std::size_t pos : {std::size_t{0}, std::size_t{7}, std::size_t{500}, n - 1}) {
    for (float bad : {NAN, INFINITY, -INFINITY}) {
      Grads g = grads(n, 1);
      g.f32[pos] = bad;
      fp32_to_fp16(g.f32.data(), g.f16.data(), n);
      for (SimdLevel p : supported_paths()) {
        EXPECT_FALSE(sum_squares(g.f32.data(), GradType::fp32, n, p).finite) << pos;
        EXPECT_FALSE(sum_squares(g.f16.data(), GradType::fp16, n, p).finite) << pos;
      }
    }
  }
  // fp16 overflow (a finite fp32 grad beyond 65504) becomes inf in fp16, and is caught.
  Grads g = grads(100, 2);
  g.f32[3] = 1e6f;
  fp32_to_fp16(g.f32.data(), g.f16.data(), 100);
  EXPECT_FALSE(sum_squares(g.f16.data(), GradType::fp16, 100).finite);
}

TEST(SumSquares, ThreadCountDoesNotChangeTheNorm) {
  const std::size_t n = 5 * kNormBlock + 12345;
  Grads g = grads(n, 77);
  const SumSquares serial = sum_squares_blocked(g.f16.data(), GradType::fp16, n);
  for (int threads : {1, 2, 3, 4}) {
    HostThreads pool(threads);
    const SumSquares s = sum_squares(pool, g.f16.data(), GradType::fp16, n);
    EXPECT_EQ(bits(s.sum), bits(serial.sum)) << threads << " threads";
    EXPECT_TRUE(s.finite);
  }
}

}  // namespace
}  // namespace zinf::cpu_adam
