// dispatch.cpp — CPUID-based selection of the SIMD path (zinf/cpu_adam/simd.h).
#include <atomic>
#include <cstdlib>
#include <string>

#include "zinf/cpu_adam/simd.h"
#include "zinf/error.h"

namespace zinf::cpu_adam {
namespace {

SimdLevel detect_once() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("fma"))
    return SimdLevel::avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
    return SimdLevel::avx2;
  return SimdLevel::scalar;
}

SimdLevel initial_cap() {
  const char* env = std::getenv("ZINF_SIMD");
  if (!env || !*env) return SimdLevel::avx512;
  return parse_simd_level(env);
}

std::atomic<int>& cap_storage() {
  static std::atomic<int> cap{static_cast<int>(initial_cap())};
  return cap;
}

}  // namespace

std::string_view to_string(SimdLevel s) {
  switch (s) {
    case SimdLevel::scalar: return "scalar";
    case SimdLevel::avx2: return "avx2";
    case SimdLevel::avx512: return "avx512";
  }
  return "?";
}

SimdLevel parse_simd_level(std::string_view name) {
  if (name == "scalar") return SimdLevel::scalar;
  if (name == "avx2") return SimdLevel::avx2;
  if (name == "avx512") return SimdLevel::avx512;
  if (name == "auto") return detect_simd();
  throw ConfigError("SIMD level '" + std::string(name) + "' is not one of auto, avx512, avx2, scalar");
}

SimdLevel detect_simd() {
  static const SimdLevel level = detect_once();
  return level;
}

bool cpu_has_avx512_bf16() {
  // GCC 12's __builtin_cpu_supports knows "avx512bf16".
  __builtin_cpu_init();
  return detect_simd() == SimdLevel::avx512 && __builtin_cpu_supports("avx512bf16");
}

SimdLevel active_simd() {
  int cap = cap_storage().load(std::memory_order_relaxed);
  int det = static_cast<int>(detect_simd());
  return static_cast<SimdLevel>(cap < det ? cap : det);
}

void set_simd_cap(SimdLevel level) { cap_storage().store(static_cast<int>(level), std::memory_order_relaxed); }

}  // namespace zinf::cpu_adam
