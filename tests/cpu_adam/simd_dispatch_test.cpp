// simd_dispatch_test.cpp — runtime SIMD selection and its cap.
#include <gtest/gtest.h>

#include "zinf/cpu_adam/simd.h"
#include "zinf/error.h"

namespace zinf::cpu_adam {
namespace {

TEST(SimdDispatch, CapLowersButNeverRaises) {
  const SimdLevel det = detect_simd();
  set_simd_cap(SimdLevel::scalar);
  EXPECT_EQ(active_simd(), SimdLevel::scalar);
  set_simd_cap(SimdLevel::avx512);
  EXPECT_EQ(active_simd(), det);  // clamped to what the CPU has
  if (det >= SimdLevel::avx2) {
    set_simd_cap(SimdLevel::avx2);
    EXPECT_EQ(active_simd(), SimdLevel::avx2);
  }
  set_simd_cap(SimdLevel::avx512);
}

TEST(SimdDispatch, NamesParseBothWays) {
  for (auto l : {SimdLevel::scalar, SimdLevel::avx2, SimdLevel::avx512}) EXPECT_EQ(parse_simd_level(to_string(l)), l);
  EXPECT_EQ(parse_simd_level("auto"), detect_simd());
  EXPECT_THROW(parse_simd_level("sse9"), ConfigError);
}

TEST(SimdDispatch, DetectionMatchesCpuid) {
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  if (avx512) {
    EXPECT_EQ(detect_simd(), SimdLevel::avx512);
  }
  if (!__builtin_cpu_supports("avx2")) {
    EXPECT_EQ(detect_simd(), SimdLevel::scalar);
  }
}

}  // namespace
}  // namespace zinf::cpu_adam
