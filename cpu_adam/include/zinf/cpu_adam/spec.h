// zinf/cpu_adam/spec.h — the element-wise specification of the conversions and of one Adam step,
// written once for the host (the scalar reference) and for CUDA kernels (compiled by nvcc with
// --fmad=false and IEEE division and square root), so every implementation computes the same bits.
// Plain C++; no CUDA types.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "zinf/cpu_adam/adam.h"

#if defined(__CUDACC__)
#define ZINF_HD __host__ __device__
#else
#define ZINF_HD
#endif

namespace zinf::cpu_adam::spec {

ZINF_HD inline std::uint32_t bits_of(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
#endif
}
ZINF_HD inline float float_of(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, 4);
  return x;
#endif
}

// fp32 → fp16, round to nearest even; overflow to inf; NaN kept (quiet bit set, top payload kept).
ZINF_HD inline std::uint16_t fp32_to_fp16(float x) {
  const std::uint32_t u = bits_of(x);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
  if (a >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);
  if (a < 0x38800000u) {
    if (a <= 0x33000000u) return sign;
    const std::uint32_t mant = (a & 0x7FFFFFu) | 0x800000u;
    const std::uint32_t shift = 126u - (a >> 23);
    std::uint32_t q = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<std::uint16_t>(sign | q);
  }
  std::uint32_t h = (a - 0x38000000u) >> 13;
  const std::uint32_t rem = a & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<std::uint16_t>(sign | h);
}

ZINF_HD inline float fp16_to_fp32(std::uint16_t h) {
  const std::uint32_t sign = (static_cast<std::uint32_t>(h) & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
  if (e == 0x1F) return float_of(sign | 0x7F800000u | (mant << 13) | (mant ? 0x400000u : 0u));
  if (e != 0) return float_of(sign | ((e + 112u) << 23) | (mant << 13));
  if (mant == 0) return float_of(sign);
  const float v = static_cast<float>(mant) * 0x1p-24f;  // exact
  return float_of(sign | bits_of(v));
}

// fp32 → bf16: round to nearest even; NaN kept (quiet); fp32 subnormals flushed to ±0 (as
// AVX512-BF16's vcvtneps2bf16 does, so every path agrees).
ZINF_HD inline std::uint16_t fp32_to_bf16(float x) {
  const std::uint32_t u = bits_of(x);
  const std::uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  if (a < 0x00800000u) return static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  return static_cast<std::uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

ZINF_HD inline float bf16_to_fp32(std::uint16_t b) { return float_of(static_cast<std::uint32_t>(b) << 16); }

// The norm's fold of 16 interleaved accumulators: j += j+8, j += j+4, j += j+2, j += j+1.
ZINF_HD inline double fold16(double acc[16]) {
  for (int w = 8; w >= 1; w /= 2)
    for (int j = 0; j < w; ++j) acc[j] += acc[j + w];
  return acc[0];
}

// One parameter's Adam/AdamW step (adam.h states the formula); g is the raw gradient.
ZINF_HD inline void adam_element(const AdamStep& s, float g, float& p, float& m, float& v) {
  g = g * s.grad_scale;
  if (s.apply_decay && !s.decoupled) g = fmaf(s.decay, p, g);
  m = fmaf(m, s.beta1, g * s.one_minus_beta1);
  v = fmaf(v, s.beta2, (g * g) * s.one_minus_beta2);
  const float denom = fmaf(sqrtf(v), s.bc2_rsqrt, s.eps);
  const float u = m / denom;
  if (s.apply_decay && s.decoupled) p = p * s.decay;
  p = fmaf(s.step_size, u, p);
}

}  // namespace zinf::cpu_adam::spec
