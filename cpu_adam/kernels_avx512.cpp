// kernels_avx512.cpp — the AVX-512 (F/BW/VL/DQ + FMA + F16C) path; AVX512-BF16's vcvtneps2bf16 is
// used for bf16 output where the CPU has it. Compiled with those flags only (never -march=native).
// 16 fp32 lanes per vector; the tail (< 16 elements) runs the scalar reference.
#include <immintrin.h>

#include <bit>
#include <cmath>

#include "kernels.h"
#include "zinf/cpu_adam/convert.h"

namespace zinf::cpu_adam::detail {
namespace {

template <GradType G>
inline __m512 load_grad16(const void* g, std::size_t i) {
  if constexpr (G == GradType::fp32) {
    return _mm512_loadu_ps(static_cast<const float*>(g) + i);
  } else if constexpr (G == GradType::fp16) {
    return _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const std::uint16_t*>(g) + i)));
  } else {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const std::uint16_t*>(g) + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

// fp32 → bf16 by integer arithmetic: the same rules as fp32_to_bf16_reference.
inline __m256i to_bf16_emulated(__m512 p) {
  const __m512i u = _mm512_castps_si512(p);
  const __m512i a = _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF));
  const __m512i hi = _mm512_srli_epi32(u, 16);
  const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb), 16);
  const __mmask16 is_nan = _mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32(0x7F800000));
  const __mmask16 is_sub = _mm512_cmplt_epu32_mask(a, _mm512_set1_epi32(0x00800000));
  r = _mm512_mask_mov_epi32(r, is_nan, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
  r = _mm512_mask_mov_epi32(r, is_sub, _mm512_and_si512(hi, _mm512_set1_epi32(0x8000)));
  return _mm512_cvtepi32_epi16(r);
}

__attribute__((target("avx512bf16"))) inline __m256i to_bf16_native(__m512 p) {
  return std::bit_cast<__m256i>(_mm512_cvtneps_pbh(p));
}

template <GradType G, int Out>  // Out: 0 none, 1 fp16, 2 bf16 emulated, 3 bf16 native
#if defined(__GNUC__)
__attribute__((target("avx512bf16")))
#endif
void adam_loop(const AdamStep& s, const UpdateChunk& c) {
  const __m512 scale = _mm512_set1_ps(s.grad_scale), b1 = _mm512_set1_ps(s.beta1),
               omb1 = _mm512_set1_ps(s.one_minus_beta1), b2 = _mm512_set1_ps(s.beta2),
               omb2 = _mm512_set1_ps(s.one_minus_beta2), eps = _mm512_set1_ps(s.eps), bc2 = _mm512_set1_ps(s.bc2_rsqrt),
               step = _mm512_set1_ps(s.step_size), decay = _mm512_set1_ps(s.decay);
  const bool l2 = s.apply_decay && !s.decoupled, wdec = s.apply_decay && s.decoupled;
  const std::size_t n16 = c.n & ~std::size_t{15};
  auto* out = static_cast<std::uint16_t*>(c.param16);
  auto* cm = static_cast<float*>(c.m);
  auto* cv = static_cast<float*>(c.v);
  for (std::size_t i = 0; i < n16; i += 16) {
    __m512 g = _mm512_mul_ps(load_grad16<G>(c.grad, i), scale);
    __m512 p = _mm512_loadu_ps(c.master + i);
    if (l2) g = _mm512_fmadd_ps(decay, p, g);
    const __m512 m = _mm512_fmadd_ps(_mm512_loadu_ps(cm + i), b1, _mm512_mul_ps(g, omb1));
    const __m512 v = _mm512_fmadd_ps(_mm512_loadu_ps(cv + i), b2, _mm512_mul_ps(_mm512_mul_ps(g, g), omb2));
    const __m512 denom = _mm512_fmadd_ps(_mm512_sqrt_ps(v), bc2, eps);
    const __m512 u = _mm512_div_ps(m, denom);
    if (wdec) p = _mm512_mul_ps(p, decay);
    p = _mm512_fmadd_ps(step, u, p);
    _mm512_storeu_ps(c.master + i, p);
    _mm512_storeu_ps(cm + i, m);
    _mm512_storeu_ps(cv + i, v);
    if constexpr (Out == 1)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                          _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    else if constexpr (Out == 2)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), to_bf16_emulated(p));
    else if constexpr (Out == 3)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), to_bf16_native(p));
  }
  adam_scalar_range(s, c, n16, c.n);
}

template <GradType G>
void adam_for_grad(const AdamStep& s, const UpdateChunk& c, bool native_bf16) {
  if (!c.param16) return adam_loop<G, 0>(s, c);
  if (c.param16_type == HalfType::fp16) return adam_loop<G, 1>(s, c);
  if (native_bf16) return adam_loop<G, 3>(s, c);
  return adam_loop<G, 2>(s, c);
}

bool native_bf16() {
  static const bool has = cpu_has_avx512_bf16();
  return has;
}

void adam_avx512(const AdamStep& s, const UpdateChunk& c) {
  if (c.states != StateFormat::fp32) return adam_scalar_range(s, c, 0, c.n);
  const bool nb = native_bf16();
  switch (c.grad_type) {
    case GradType::fp32: return adam_for_grad<GradType::fp32>(s, c, nb);
    case GradType::fp16: return adam_for_grad<GradType::fp16>(s, c, nb);
    case GradType::bf16: return adam_for_grad<GradType::bf16>(s, c, nb);
  }
}

template <GradType G, int Out>
void traffic_loop(const UpdateChunk& c) {
  const std::size_t n16 = c.n & ~std::size_t{15};
  auto* out = static_cast<std::uint16_t*>(c.param16);
  auto* cm = static_cast<float*>(c.m);
  auto* cv = static_cast<float*>(c.v);
  for (std::size_t i = 0; i < n16; i += 16) {
    const __m512 g = load_grad16<G>(c.grad, i);
    const __m512 p = _mm512_add_ps(_mm512_loadu_ps(c.master + i), g);
    _mm512_storeu_ps(c.master + i, p);
    _mm512_storeu_ps(cm + i, _mm512_add_ps(_mm512_loadu_ps(cm + i), g));
    _mm512_storeu_ps(cv + i, _mm512_add_ps(_mm512_loadu_ps(cv + i), g));
    if constexpr (Out == 1)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                          _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    else if constexpr (Out == 2)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), to_bf16_emulated(p));
  }
  UpdateChunk tail = c;
  tail.n = c.n - n16;
  tail.grad = static_cast<const char*>(c.grad) + n16 * (G == GradType::fp32 ? 4 : 2);
  tail.master += n16, tail.m = cm + n16, tail.v = cv + n16;
  if (out) tail.param16 = out + n16;
  scalar_kernels().traffic(tail);
}
template <GradType G>
void traffic_for_grad(const UpdateChunk& c) {
  if (!c.param16) return traffic_loop<G, 0>(c);
  return c.param16_type == HalfType::fp16 ? traffic_loop<G, 1>(c) : traffic_loop<G, 2>(c);
}
void traffic_avx512(const UpdateChunk& c) {
  if (c.states != StateFormat::fp32) return scalar_kernels().traffic(c);
  switch (c.grad_type) {
    case GradType::fp32: return traffic_for_grad<GradType::fp32>(c);
    case GradType::fp16: return traffic_for_grad<GradType::fp16>(c);
    case GradType::bf16: return traffic_for_grad<GradType::bf16>(c);
  }
}

template <GradType G>
SumSquares sum_sq(const void* g, std::size_t n) {
  __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();  // lanes 0–7 and 8–15
  const std::size_t n16 = n & ~std::size_t{15};
  for (std::size_t i = 0; i < n16; i += 16) {
    const __m512 x = load_grad16<G>(g, i);
    const __m512d a = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
    const __m512d b = _mm512_cvtps_pd(_mm512_extractf32x8_ps(x, 1));
    lo = _mm512_fmadd_pd(a, a, lo);  // exact square + one rounding = the reference's acc += x·x
    hi = _mm512_fmadd_pd(b, b, hi);
  }
  alignas(64) double acc[16];
  _mm512_store_pd(acc, lo);
  _mm512_store_pd(acc + 8, hi);
  sum_squares_scalar_range(g, G, n16, n, acc);
  const double sum = fold16(acc);
  return {sum, std::isfinite(sum)};
}

SumSquares sum_squares_avx512(const void* g, GradType t, std::size_t n) {
  switch (t) {
    case GradType::fp32: return sum_sq<GradType::fp32>(g, n);
    case GradType::fp16: return sum_sq<GradType::fp16>(g, n);
    case GradType::bf16: return sum_sq<GradType::bf16>(g, n);
  }
  return {};
}

void f32_f16(const float* s, std::uint16_t* d, std::size_t n) {
  const std::size_t n16 = n & ~std::size_t{15};
  for (std::size_t i = 0; i < n16; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i),
                        _mm512_cvtps_ph(_mm512_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (std::size_t i = n16; i < n; ++i) d[i] = fp32_to_fp16_reference(s[i]);
}
void f16_f32(const std::uint16_t* s, float* d, std::size_t n) {
  const std::size_t n16 = n & ~std::size_t{15};
  for (std::size_t i = 0; i < n16; i += 16) _mm512_storeu_ps(d + i, load_grad16<GradType::fp16>(s, i));
  for (std::size_t i = n16; i < n; ++i) d[i] = fp16_to_fp32_reference(s[i]);
}
template <bool Native>
#if defined(__GNUC__)
__attribute__((target("avx512bf16")))
#endif
void f32_bf16_impl(const float* s, std::uint16_t* d, std::size_t n) {
  const std::size_t n16 = n & ~std::size_t{15};
  for (std::size_t i = 0; i < n16; i += 16) {
    const __m512 x = _mm512_loadu_ps(s + i);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), Native ? to_bf16_native(x) : to_bf16_emulated(x));
  }
  for (std::size_t i = n16; i < n; ++i) d[i] = fp32_to_bf16_reference(s[i]);
}
void f32_bf16(const float* s, std::uint16_t* d, std::size_t n) {
  native_bf16() ? f32_bf16_impl<true>(s, d, n) : f32_bf16_impl<false>(s, d, n);
}
void bf16_f32(const std::uint16_t* s, float* d, std::size_t n) {
  const std::size_t n16 = n & ~std::size_t{15};
  for (std::size_t i = 0; i < n16; i += 16) _mm512_storeu_ps(d + i, load_grad16<GradType::bf16>(s, i));
  for (std::size_t i = n16; i < n; ++i) d[i] = bf16_to_fp32_reference(s[i]);
}

}  // namespace

const KernelTable& avx512_kernels() {
  static const KernelTable t{adam_avx512, sum_squares_avx512, f32_f16, f16_f32, f32_bf16, bf16_f32, traffic_avx512};
  return t;
}

}  // namespace zinf::cpu_adam::detail
