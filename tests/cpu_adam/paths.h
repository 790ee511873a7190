// paths.h — the SIMD paths this CPU supports, for tests that check each against the reference, and
// the bits of a float or double, for comparing results bit for bit.
#pragma once

#include <bit>
#include <cstdint>
#include <vector>

#include "zinf/cpu_adam/simd.h"

namespace zinf::cpu_adam {

inline std::vector<SimdLevel> supported_paths() {
  std::vector<SimdLevel> p = {SimdLevel::scalar};
  if (detect_simd() >= SimdLevel::avx2) p.push_back(SimdLevel::avx2);
  if (detect_simd() >= SimdLevel::avx512) p.push_back(SimdLevel::avx512);
  return p;
}

inline std::uint32_t bits(float x) { return std::bit_cast<std::uint32_t>(x); }
inline std::uint64_t bits(double x) { return std::bit_cast<std::uint64_t>(x); }

}  // namespace zinf::cpu_adam
