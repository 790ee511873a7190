// zinf/cpu_adam/spec.h — the element-wise specification of the conversions and of one Adam step,
// written once for the host (the scalar reference) and for CUDA kernels (compiled by nvcc with
// --fmad=false and IEEE division and square root), so every implementation computes the same bits.
// Plain C++; no CUDA types.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "zinf/cpu_adam/adam.h"
#include "zinf/host_device.h"

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

// fp32 → bf16: round to nearest even; NaN kept (sign and top payload bits, quiet bit set); fp32
// subnormals flushed to ±0, as AVX512-BF16's vcvtneps2bf16 does. This, with fp32_to_fp16 above, is
// the one 16-bit rounding of every path: cpu_adam's Update and bulk conversions (scalar, AVX2,
// AVX-512 with or without that instruction), the device Update (cuda/engine_kernels.cu), the CPU
// twin's ops, and the CUDA fast kernels' stores and P/dS tiles (cuda/round16.cuh: the hardware's
// round-to-nearest-even, which keeps subnormals, with these functions' answer for subnormals and
// NaNs). tests/cpu_adam/bf16_rule_test.cpp checks them: bf16 over all 2^32 fp32 inputs.
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

// ---- Compressed optimizer states (adam.h StateFormat) ---------------------------------------------
// bf16 states use fp32_to_bf16 / bf16_to_fp32 above. q8 states, per block of kQ8Block elements:
//
//  round3(x)   x rounded to nearest even at 3 mantissa bits (integer arithmetic on the bits; the sign
//              is kept; the largest finite values round to ±inf).
//  exponent    the block's E is the largest biased exponent of round3(x) over the block. A non-finite
//              x, or an x whose round3 overflows, makes the block a NaN block: scale NaN, codes 0.
//              A block with E ≤ top (every |x| below 2^(top−126), tiny enough to be zero for Adam)
//              is a zero block: scale +0, codes 0. Otherwise scale = 2^(E−127) (bits E<<23).
//  top         15 for m, 31 for v: the code's largest exponent field, which the block's E maps to.
//  code        m: sign<<7 | e4<<3 | m3, v: e5<<3 | m3 (v is never negative; its sign is dropped).
//              e = exp(round3(x)) − E + top ≥ 1: the 3 mantissa bits of round3(x).
//              Below that (e would be < 1) the value is rounded to nearest even straight from x onto
//              the grid of e = 0 codes, 2^(E−127−top−2) apart (one rounding, never two); the result
//              q ≤ 8, where q = 8 is the smallest e = 1 code.
//  decode      value(c) × scale, one fp32 multiply, value(c) = ±2^(e−top)·(1+m3/8) for e ≥ 1,
//              ±2^(1−top)·m3/8 for e = 0. Every product is exact (scales above 2^(top−127) keep it
//              in fp32's normal range), so for any stored block encode(decode(block)) stores the same
//              block again.

inline constexpr std::uint32_t kQ8Nan = 255u;  // the block exponent of a NaN block

ZINF_HD inline std::uint32_t q8_top(StateKind k) { return k == StateKind::m ? 15u : 31u; }

ZINF_HD inline std::uint32_t q8_round3(std::uint32_t u) { return (u + 0x7FFFFu + ((u >> 20) & 1u)) & 0xFFF00000u; }

// The biased exponent of round3(x); kQ8Nan when x is not finite or round3(x) overflows.
ZINF_HD inline std::uint32_t q8_exponent(float x) {
  const std::uint32_t a = bits_of(x) & 0x7FFFFFFFu;
  if (a >= 0x7F800000u) return kQ8Nan;
  return q8_round3(a) >> 23;  // 255 exactly when it overflows
}

// The block exponent E from the largest q8_exponent of the block: kQ8Nan, 0 (a zero block) or > top.
ZINF_HD inline std::uint32_t q8_block_exponent(std::uint32_t max_exponent, StateKind k) {
  return max_exponent == kQ8Nan ? kQ8Nan : (max_exponent <= q8_top(k) ? 0u : max_exponent);
}

ZINF_HD inline float q8_scale(std::uint32_t E) { return float_of(E == kQ8Nan ? 0x7FC00000u : E << 23); }

// One element's code in a block of exponent E (from q8_block_exponent).
ZINF_HD inline std::uint8_t q8_encode(float x, std::uint32_t E, StateKind k) {
  if (E == 0u || E == kQ8Nan) return 0;
  const std::uint32_t u = bits_of(x), a = u & 0x7FFFFFFFu, top = q8_top(k);
  const std::uint32_t sign = k == StateKind::m ? (u >> 24) & 0x80u : 0u;
  const std::uint32_t r = q8_round3(a), er = r >> 23;
  if (er + top > E) return static_cast<std::uint8_t>(sign | ((er + top - E) << 3) | ((r >> 20) & 7u));
  // Here exp(x) ≤ er ≤ E − top, so the shift s is at least 21 and q at most 8.
  const std::uint32_t ex = a >> 23;
  const std::uint32_t mant = ex ? (a & 0x7FFFFFu) | 0x800000u : a & 0x7FFFFFu;
  const std::uint32_t s = E - (ex ? ex : 1u) - top + 21u;
  const std::uint32_t q = s >= 25u ? 0u : (mant + (1u << (s - 1u)) - 1u + ((mant >> s) & 1u)) >> s;
  return static_cast<std::uint8_t>(sign | q);
}

// value(c): the code's value relative to the scale (exact in fp32).
ZINF_HD inline float q8_value(std::uint8_t c, StateKind k) {
  const std::uint32_t top = q8_top(k);
  const std::uint32_t e = k == StateKind::m ? (c >> 3) & 15u : static_cast<std::uint32_t>(c) >> 3, m3 = c & 7u;
  const std::uint32_t sign = k == StateKind::m ? (static_cast<std::uint32_t>(c) & 0x80u) << 24 : 0u;
  if (e) return float_of(sign | ((e + 127u - top) << 23) | (m3 << 20));
  const float mag = static_cast<float>(m3) * float_of((125u - top) << 23);  // m3 · 2^(−2−top), exact
  return float_of(sign | bits_of(mag));
}

ZINF_HD inline float q8_decode(std::uint8_t c, float scale, StateKind k) { return q8_value(c, k) * scale; }

// A whole block of n ≤ kQ8Block values: writes the codes, returns the scale.
ZINF_HD inline float q8_encode_block(const float* x, std::uint8_t* codes, std::size_t n, StateKind k) {
  std::uint32_t mx = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t e = q8_exponent(x[i]);
    mx = e > mx ? e : mx;
  }
  const std::uint32_t E = q8_block_exponent(mx, k);
  for (std::size_t i = 0; i < n; ++i) codes[i] = q8_encode(x[i], E, k);
  return q8_scale(E);
}

}  // namespace zinf::cpu_adam::spec
