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
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma"))
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

// ---- kernel dispatch --------------------------------------------------------------------------------
#include "kernels.h"
#include "zinf/cpu_adam/convert.h"

namespace zinf::cpu_adam {
namespace {

const detail::KernelTable& table(SimdLevel requested) { return detail::kernels_for(requested); }

}  // namespace

const detail::KernelTable& detail::kernels_for(SimdLevel requested) {
  const SimdLevel det = detect_simd();
  const SimdLevel l = static_cast<int>(requested) < static_cast<int>(det) ? requested : det;
  switch (l) {
    case SimdLevel::avx512: return detail::avx512_kernels();
    case SimdLevel::avx2: return detail::avx2_kernels();
    case SimdLevel::scalar: break;
  }
  return detail::scalar_kernels();
}

void adam_update(const AdamStep& s, const UpdateChunk& c, SimdLevel level) { table(level).adam(s, c); }
void adam_update(const AdamStep& s, const UpdateChunk& c) { table(active_simd()).adam(s, c); }
void adam_memory_traffic(const UpdateChunk& c, SimdLevel level) { table(level).traffic(c); }

SumSquares sum_squares(const void* g, GradType t, std::size_t n, SimdLevel level) {
  return table(level).sum_squares(g, t, n);
}
SumSquares sum_squares(const void* g, GradType t, std::size_t n) { return table(active_simd()).sum_squares(g, t, n); }

void fp32_to_fp16(const float* s, std::uint16_t* d, std::size_t n, SimdLevel l) { table(l).fp32_to_fp16(s, d, n); }
void fp16_to_fp32(const std::uint16_t* s, float* d, std::size_t n, SimdLevel l) { table(l).fp16_to_fp32(s, d, n); }
void fp32_to_bf16(const float* s, std::uint16_t* d, std::size_t n, SimdLevel l) { table(l).fp32_to_bf16(s, d, n); }
void bf16_to_fp32(const std::uint16_t* s, float* d, std::size_t n, SimdLevel l) { table(l).bf16_to_fp32(s, d, n); }
void fp32_to_fp16(const float* s, std::uint16_t* d, std::size_t n) { fp32_to_fp16(s, d, n, active_simd()); }
void fp16_to_fp32(const std::uint16_t* s, float* d, std::size_t n) { fp16_to_fp32(s, d, n, active_simd()); }
void fp32_to_bf16(const float* s, std::uint16_t* d, std::size_t n) { fp32_to_bf16(s, d, n, active_simd()); }
void bf16_to_fp32(const std::uint16_t* s, float* d, std::size_t n) { bf16_to_fp32(s, d, n, active_simd()); }

}  // namespace zinf::cpu_adam
