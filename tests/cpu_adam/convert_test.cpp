// convert_test.cpp — fp16/bf16 conversions: all 65,536 16-bit patterns, a dense sweep of fp32 edge
// cases (subnormals, ties, overflow, inf, NaN), every path against the reference, and the reference
// against the CPU's own conversion instructions where it has them.
#include <gtest/gtest.h>

#include <immintrin.h>
#include "paths.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "zinf/cpu_adam/convert.h"

namespace zinf::cpu_adam {
namespace {

float f_of(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
std::uint32_t u_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// The CPU's own conversions, compiled for F16C only here and called only where detect_simd() found it.
__attribute__((target("f16c"))) float hw_fp16_to_fp32(std::uint32_t h) {
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(h))));
}
__attribute__((target("f16c"))) std::uint16_t hw_fp32_to_fp16(float x) {
  return static_cast<std::uint16_t>(
      _mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), 0));
}

// fp32 values that stress every rounding branch of both conversions.
std::vector<float> edge_cases() {
  std::vector<std::uint32_t> mants = {0,        1,        2,        0x0FFF,   0x1000,   0x1001,   0x1FFF,   0x2000,
                                      0x3000,   0x7FFF,   0x8000,   0x8001,   0x17FFF,  0x18000,  0x400000, 0x7FE000,
                                      0x7FEFFF, 0x7FF000, 0x7FF001, 0x7FFFFF, 0x00FFFF, 0x010000, 0x018000, 0x7F8000};
  std::vector<float> v;
  for (std::uint32_t e = 0; e < 256; ++e)
    for (std::uint32_t m : mants)
      for (std::uint32_t s : {0u, 0x80000000u}) v.push_back(f_of(s | (e << 23) | m));
  std::mt19937 rng(42);
  for (int i = 0; i < 200000; ++i) v.push_back(f_of(static_cast<std::uint32_t>(rng())));
  return v;
}

TEST(Convert, KnownFp16Values) {
  EXPECT_EQ(fp32_to_fp16_reference(1.0f), 0x3C00);
  EXPECT_EQ(fp32_to_fp16_reference(-2.0f), 0xC000);
  EXPECT_EQ(fp32_to_fp16_reference(65504.0f), 0x7BFF);
  EXPECT_EQ(fp32_to_fp16_reference(65519.99f), 0x7BFF);
  EXPECT_EQ(fp32_to_fp16_reference(65520.0f), 0x7C00);  // ties to even → inf
  EXPECT_EQ(fp32_to_fp16_reference(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(fp32_to_fp16_reference(std::ldexp(1.0f, -25)), 0x0000);  // tie → even (0)
  EXPECT_EQ(fp32_to_fp16_reference(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(fp32_to_fp16_reference(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 units: tie → even (2)
  EXPECT_EQ(fp32_to_fp16_reference(-0.0f), 0x8000);
  EXPECT_EQ(fp32_to_fp16_reference(INFINITY), 0x7C00);
  EXPECT_EQ(fp32_to_fp16_reference(f_of(0x7F800001)), 0x7E00);              // sNaN → quiet NaN
  EXPECT_EQ(fp32_to_fp16_reference(1.0f + std::ldexp(1.0f, -11)), 0x3C00);  // tie → even
  EXPECT_EQ(fp32_to_fp16_reference(1.0f + std::ldexp(3.0f, -11)), 0x3C02);  // tie → even (up)
}

TEST(Convert, KnownBf16Values) {
  EXPECT_EQ(fp32_to_bf16_reference(1.0f), 0x3F80);
  EXPECT_EQ(fp32_to_bf16_reference(f_of(0x3F808000)), 0x3F80);  // tie → even
  EXPECT_EQ(fp32_to_bf16_reference(f_of(0x3F818000)), 0x3F82);  // tie → even (up)
  EXPECT_EQ(fp32_to_bf16_reference(f_of(0x7F7FFFFF)), 0x7F80);  // overflow → inf
  EXPECT_EQ(fp32_to_bf16_reference(f_of(0x7F800001)), 0x7FC0);  // NaN stays NaN
  EXPECT_EQ(fp32_to_bf16_reference(f_of(0x80012345)), 0x8000);  // subnormal → -0
  EXPECT_EQ(bf16_to_fp32_reference(0x3F80), 1.0f);
}

TEST(Convert, AllFp16PatternsRoundTrip) {
  std::vector<std::uint16_t> h(65536), back(65536);
  for (std::uint32_t i = 0; i < 65536; ++i) h[i] = static_cast<std::uint16_t>(i);
  std::vector<float> ref(65536);
  for (std::uint32_t i = 0; i < 65536; ++i) ref[i] = fp16_to_fp32_reference(h[i]);
  for (SimdLevel p : supported_paths()) {
    SCOPED_TRACE(to_string(p));
    std::vector<float> f(65536);
    fp16_to_fp32(h.data(), f.data(), 65536, p);
    for (std::uint32_t i = 0; i < 65536; ++i) ASSERT_EQ(u_of(f[i]), u_of(ref[i])) << "h=" << i;
    fp32_to_fp16(f.data(), back.data(), 65536, p);
    for (std::uint32_t i = 0; i < 65536; ++i) {
      const bool nan = (i & 0x7C00) == 0x7C00 && (i & 0x3FF);
      ASSERT_EQ(back[i], nan ? (i | 0x200) : i) << "h=" << i;  // NaNs come back quiet
    }
  }
  if (detect_simd() >= SimdLevel::avx2) {  // the reference equals the CPU's vcvtph2ps
    for (std::uint32_t i = 0; i < 65536; ++i) ASSERT_EQ(u_of(hw_fp16_to_fp32(i)), u_of(ref[i])) << "h=" << i;
  }
}

TEST(Convert, AllBf16PatternsRoundTrip) {
  for (SimdLevel p : supported_paths()) {
    std::vector<std::uint16_t> h(65536), back(65536);
    for (std::uint32_t i = 0; i < 65536; ++i) h[i] = static_cast<std::uint16_t>(i);
    std::vector<float> f(65536);
    bf16_to_fp32(h.data(), f.data(), 65536, p);
    fp32_to_bf16(f.data(), back.data(), 65536, p);
    for (std::uint32_t i = 0; i < 65536; ++i) {
      ASSERT_EQ(u_of(f[i]), i << 16);
      std::uint32_t expect = i;
      if ((i & 0x7F80) == 0x7F80 && (i & 0x7F))
        expect = i | 0x40;  // NaN made quiet
      else if ((i & 0x7F80) == 0)
        expect = i & 0x8000;  // subnormal flushed
      ASSERT_EQ(back[i], expect) << to_string(p) << " b=" << i;
    }
  }
}

TEST(Convert, EdgeSweepEveryPathMatchesReference) {
  const std::vector<float> v = edge_cases();
  const std::size_t n = v.size();
  std::vector<std::uint16_t> ref16(n), refb(n);
  for (std::size_t i = 0; i < n; ++i) ref16[i] = fp32_to_fp16_reference(v[i]), refb[i] = fp32_to_bf16_reference(v[i]);
  for (SimdLevel p : supported_paths()) {
    SCOPED_TRACE(to_string(p));
    std::vector<std::uint16_t> o16(n), ob(n);
    fp32_to_fp16(v.data(), o16.data(), n, p);
    fp32_to_bf16(v.data(), ob.data(), n, p);
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_EQ(o16[i], ref16[i]) << std::hex << "x=0x" << u_of(v[i]);
      ASSERT_EQ(ob[i], refb[i]) << std::hex << "x=0x" << u_of(v[i]);
    }
  }
  if (detect_simd() >= SimdLevel::avx2) {  // the reference equals the CPU's vcvtps2ph (RNE)
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(hw_fp32_to_fp16(v[i]), ref16[i]) << std::hex << "x=0x" << u_of(v[i]);
  }
  if (cpu_has_avx512_bf16()) GTEST_LOG_(INFO) << "avx512 path used the native AVX512-BF16 conversion for bf16";
}

TEST(Convert, FloatToHalfIsNearest) {
  // Independent of the bit tricks: the fp16 result is the nearest representable value (ties even).
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> d(-70000.0f, 70000.0f);
  for (int i = 0; i < 100000; ++i) {
    const float x = d(rng) * (i % 3 == 0 ? 1e-6f : 1.0f);
    const std::uint16_t h = fp32_to_fp16_reference(x);
    const double y = fp16_to_fp32_reference(h);
    if (std::isinf(y)) {
      ASSERT_GE(std::fabs(x), 65520.0f);
      continue;
    }
    const double up = fp16_to_fp32_reference(static_cast<std::uint16_t>(h + 1));
    const double down = (h & 0x7FFF) ? fp16_to_fp32_reference(static_cast<std::uint16_t>(h - 1)) : -y;
    ASSERT_LE(std::fabs(x - y), std::fabs(x - up) + 0.0) << x;
    ASSERT_LE(std::fabs(x - y), std::fabs(x - down) + 0.0) << x;
  }
}

}  // namespace
}  // namespace zinf::cpu_adam
