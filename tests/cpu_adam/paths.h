// paths.h — the SIMD paths this CPU supports, for tests that check each against the reference.
#pragma once

#include <vector>

#include "zinf/cpu_adam/simd.h"

namespace zinf::cpu_adam {

inline std::vector<SimdLevel> supported_paths() {
  std::vector<SimdLevel> p = {SimdLevel::scalar};
  if (detect_simd() >= SimdLevel::avx2) p.push_back(SimdLevel::avx2);
  if (detect_simd() >= SimdLevel::avx512) p.push_back(SimdLevel::avx512);
  return p;
}

}  // namespace zinf::cpu_adam
