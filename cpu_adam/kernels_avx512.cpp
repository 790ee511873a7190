// kernels_avx512.cpp — the AVX-512 (F/BW/VL/DQ + FMA + F16C) path; AVX512-BF16's vcvtneps2bf16 is
// used for bf16 output where the CPU has it. Compiled with those flags only (never -march=native).
// 16 fp32 lanes per vector; the tail (< 16 elements) runs the scalar reference.
#include <immintrin.h>

#include <bit>
#include <cmath>
#include <cstring>

#include "kernels.h"
#include "zinf/cpu_adam/convert.h"
#include "zinf/cpu_adam/spec.h"

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

// The broadcast step scalars and one vector of the specification's Adam step (adam.h), in its order.
struct Consts {
  __m512 scale, b1, omb1, b2, omb2, eps, bc2, step, decay;
  bool l2, wdec;
  explicit Consts(const AdamStep& s)
      : scale(_mm512_set1_ps(s.grad_scale)),
        b1(_mm512_set1_ps(s.beta1)),
        omb1(_mm512_set1_ps(s.one_minus_beta1)),
        b2(_mm512_set1_ps(s.beta2)),
        omb2(_mm512_set1_ps(s.one_minus_beta2)),
        eps(_mm512_set1_ps(s.eps)),
        bc2(_mm512_set1_ps(s.bc2_rsqrt)),
        step(_mm512_set1_ps(s.step_size)),
        decay(_mm512_set1_ps(s.decay)),
        l2(s.apply_decay && !s.decoupled),
        wdec(s.apply_decay && s.decoupled) {}
};

// g: the raw gradient; p, m, v: in and out.
inline void adam16(const Consts& k, __m512 g, __m512& p, __m512& m, __m512& v) {
  g = _mm512_mul_ps(g, k.scale);
  if (k.l2) g = _mm512_fmadd_ps(k.decay, p, g);
  m = _mm512_fmadd_ps(m, k.b1, _mm512_mul_ps(g, k.omb1));
  v = _mm512_fmadd_ps(v, k.b2, _mm512_mul_ps(_mm512_mul_ps(g, g), k.omb2));
  const __m512 denom = _mm512_fmadd_ps(_mm512_sqrt_ps(v), k.bc2, k.eps);
  const __m512 u = _mm512_div_ps(m, denom);
  if (k.wdec) p = _mm512_mul_ps(p, k.decay);
  p = _mm512_fmadd_ps(k.step, u, p);
}

// fp32 → bf16 with AVX512-BF16's instruction (NB: the CPU has it; it follows the specification) or
// by integer emulation.
template <bool NB>
#if defined(__GNUC__)
__attribute__((target("avx512bf16")))
#endif
inline __m256i to_bf16(__m512 x) {
  if constexpr (NB)
    return to_bf16_native(x);
  else
    return to_bf16_emulated(x);
}

template <int Out, bool NB>  // Out: 0 none, 1 fp16, 2 bf16
#if defined(__GNUC__)
__attribute__((target("avx512bf16")))
#endif
inline void store_param16(std::uint16_t* out, std::size_t i, __m512 p) {
  if constexpr (Out == 1)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  else if constexpr (Out == 2)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), to_bf16<NB>(p));
}

// bf16 state bits → fp32 (exact).
inline __m512 load_bf16(const std::uint16_t* p) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}

// fp32 and bf16 states: element-wise, 16 lanes at a time.
template <GradType G, int Out, bool NB, StateFormat S>
#if defined(__GNUC__)
__attribute__((target("avx512bf16")))
#endif
void adam_loop(const AdamStep& s, const UpdateChunk& c) {
  const Consts k(s);
  const std::size_t n16 = c.n & ~std::size_t{15};
  auto* out = static_cast<std::uint16_t*>(c.param16);
  for (std::size_t i = 0; i < n16; i += 16) {
    __m512 p = _mm512_loadu_ps(c.master + i), m, v;
    if constexpr (S == StateFormat::fp32) {
      m = _mm512_loadu_ps(static_cast<float*>(c.m) + i);
      v = _mm512_loadu_ps(static_cast<float*>(c.v) + i);
    } else {
      m = load_bf16(static_cast<std::uint16_t*>(c.m) + i);
      v = load_bf16(static_cast<std::uint16_t*>(c.v) + i);
    }
    adam16(k, load_grad16<G>(c.grad, i), p, m, v);
    _mm512_storeu_ps(c.master + i, p);
    if constexpr (S == StateFormat::fp32) {
      _mm512_storeu_ps(static_cast<float*>(c.m) + i, m);
      _mm512_storeu_ps(static_cast<float*>(c.v) + i, v);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<std::uint16_t*>(c.m) + i), to_bf16<NB>(m));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<std::uint16_t*>(c.v) + i), to_bf16<NB>(v));
    }
    store_param16<Out, NB>(out, i, p);
  }
  adam_scalar_range(s, c, n16, c.n);
}

// ---- q8 states (spec.h): decode, Adam and encode of one 256-element block in one pass ----

template <StateKind K>
constexpr std::uint32_t kTop = K == StateKind::m ? 15u : 31u;

// spec::q8_value of 16 codes. For e ≥ 1 the value's bits are the code's magnitude shifted to the
// exponent and mantissa fields plus a constant; codes with e = 0 (rare) are m3 · 2^(−2−top).
template <StateKind K>
inline __m512 q8_value16(const std::uint8_t* p) {
  const __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m512i mag = K == StateKind::m ? _mm512_and_si512(c, _mm512_set1_epi32(0x7F)) : c;
  __m512i r = _mm512_add_epi32(_mm512_slli_epi32(mag, 20), _mm512_set1_epi32((127 - kTop<K>) << 23));
  const __mmask16 e0 = _mm512_cmplt_epi32_mask(mag, _mm512_set1_epi32(8));
  if (e0) {
    const __m512 sub = _mm512_mul_ps(_mm512_cvtepi32_ps(mag), _mm512_castsi512_ps(_mm512_set1_epi32((125 - kTop<K>) << 23)));
    r = _mm512_mask_mov_epi32(r, e0, _mm512_castps_si512(sub));
  }
  if constexpr (K == StateKind::m)  // r | (c << 24 & sign bit)
    r = _mm512_ternarylogic_epi32(r, _mm512_slli_epi32(c, 24), _mm512_set1_epi32(static_cast<int>(0x80000000u)), 0xF8);
  return _mm512_castsi512_ps(r);
}

// round3(a) >> Shift for a = |x| bits: by 20, the exponent and the 3 rounded mantissa bits; by 23, the
// exponent (the masking of round3 is implied by the shift).
template <int Shift = 20>
inline __m512i round3_top(__m512i a) {
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(a, 20), _mm512_set1_epi32(1));
  return _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(a, _mm512_set1_epi32(0x7FFFF)), lsb), Shift);
}

// spec::q8_exponent of 16 values, except that a non-finite x may give 256 instead of 255 (a NaN's
// mantissa can carry past the exponent); q8_encode_block treats every value ≥ 255 as kQ8Nan.
inline __m512i q8_exponent16(__m512 x) {
  const __m512i a = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7FFFFFFF));
  return round3_top<23>(a);
}

// The codes below the normal range (spec::q8_encode's second branch): x rounded to nearest even onto
// the e = 0 grid, straight from its bits a = |x|.
template <StateKind K>
inline __m512i q8_encode16_small(__m512i a, __m512i E) {
  constexpr int top = static_cast<int>(kTop<K>);
  const __m512i ex = _mm512_srli_epi32(a, 23);
  const __m512i frac = _mm512_and_si512(a, _mm512_set1_epi32(0x7FFFFF));
  const __mmask16 has_ex = _mm512_test_epi32_mask(ex, ex);
  const __m512i mant = _mm512_mask_or_epi32(frac, has_ex, frac, _mm512_set1_epi32(0x800000));
  const __m512i exc = _mm512_max_epu32(ex, _mm512_set1_epi32(1));
  const __m512i sh = _mm512_sub_epi32(_mm512_add_epi32(E, _mm512_set1_epi32(21 - top)), exc);
  const __m512i half = _mm512_sub_epi32(_mm512_sllv_epi32(_mm512_set1_epi32(1), _mm512_sub_epi32(sh, _mm512_set1_epi32(1))),
                                        _mm512_set1_epi32(1));
  const __m512i odd = _mm512_and_si512(_mm512_srlv_epi32(mant, sh), _mm512_set1_epi32(1));
  const __m512i q = _mm512_srlv_epi32(_mm512_add_epi32(_mm512_add_epi32(mant, half), odd), sh);
  return _mm512_maskz_mov_epi32(_mm512_cmplt_epi32_mask(sh, _mm512_set1_epi32(25)), q);
}

// spec::q8_encode of 16 values in a block of exponent E (top < E < 255); c = (E − top) << 3. A normal
// code is round3(x) >> 20 less c: (exp − E + top) << 3 | m3.
template <StateKind K>
inline __m128i q8_encode16(__m512 x, __m512i E, __m512i c) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i a = _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF));
  const __m512i r = round3_top(a);
  const __mmask16 normal = _mm512_cmpgt_epi32_mask(r, _mm512_add_epi32(c, _mm512_set1_epi32(7)));
  __m512i code = _mm512_sub_epi32(r, c);
  if (normal != 0xFFFF) code = _mm512_mask_mov_epi32(q8_encode16_small<K>(a, E), normal, code);  // rare
  if constexpr (K == StateKind::m)  // code | (u >> 24 & 0x80)
    code = _mm512_ternarylogic_epi32(code, _mm512_srli_epi32(u, 24), _mm512_set1_epi32(0x80), 0xF8);
  return _mm512_cvtepi32_epi8(code);
}

// Encodes a block's fp32 values t[0, 256) given the largest of their q8_exponent16: the general
// encoder, for blocks the fast one below does not take.
template <StateKind K>
inline void q8_encode_block(const float* t, std::uint8_t* codes, float* scale, __m512i emax) {
  const std::uint32_t mx = _mm512_reduce_max_epu32(emax);
  const std::uint32_t E = spec::q8_block_exponent(mx < spec::kQ8Nan ? mx : spec::kQ8Nan, K);
  *scale = spec::q8_scale(E);
  if (E == 0 || E == spec::kQ8Nan) {
    std::memset(codes, 0, kQ8Block);
    return;
  }
  const __m512i e = _mm512_set1_epi32(static_cast<int>(E)), c = _mm512_set1_epi32(static_cast<int>((E - kTop<K>) << 3));
  for (std::size_t j = 0; j < kQ8Block; j += 16)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + j), q8_encode16<K>(_mm512_loadu_ps(t + j), e, c));
}

// ---- the fast q8 block paths ----
// The Update and the bulk conversions take these for almost every block; each is bit-identical to
// the general code above (and so to spec.h) on the blocks it accepts, and hands the others to it.
//
// Encode. A block's order key is |x|'s bits for m and x's bits for v (so a negative v, which the
// code stores as its magnitude, sorts above every finite value and goes to the general encoder).
// round3 is monotonic in |x|'s bits, so the block exponent is that of the largest key alone
// (spec::q8_exponent of it), and every element has a normal code (e ≥ 1) exactly when the smallest
// key's round3 exponent reaches E − top + 1: the encoder then needs no per-element exponent, range
// test or second branch. The keys' maximum and minimum are kept per lane while the values are made.

template <StateKind K>
inline __m512i q8_key16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  return K == StateKind::m ? _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)) : u;
}

// 64 codes (four vectors of 32-bit codes, each 0..255) as bytes in element order.
inline void store_codes64(std::uint8_t* dst, __m512i q0, __m512i q1, __m512i q2, __m512i q3) {
  // packus works within 128-bit lanes: lane L of the bytes holds elements 4L..4L+3 of q0, q1, q2, q3.
  const __m512i b = _mm512_packus_epi16(_mm512_packus_epi32(q0, q1), _mm512_packus_epi32(q2, q3));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  _mm512_storeu_si512(dst, _mm512_permutexvar_epi32(order, b));
}

// The normal code of 16 values of a block whose every element has one; bias = 0x7FFFF − ((E − top) << 23).
// round3(a) >> 20 less (E − top) << 3, with the subtraction folded into round3's addition:
// (a + 0x7FFFF + lsb − ((E − top) << 23)) >> 20, never negative for a normal code. For m the sign
// bit rides along (the sum stays below 2^31 before it) and lands at bit 11, moved to bit 7.
template <StateKind K>
inline __m512i q8_code16_normal(__m512 x, __m512i bias) {
  const __m512i u = _mm512_castps_si512(x);
  const __mmask16 odd = _mm512_test_epi32_mask(u, _mm512_set1_epi32(1 << 20));  // round3's lsb
  __m512i y = _mm512_add_epi32(u, bias);
  y = _mm512_srli_epi32(_mm512_mask_add_epi32(y, odd, y, _mm512_set1_epi32(1)), 20);
  if constexpr (K == StateKind::m)  // (y & 0x7F) | (y >> 4 & ~0x7F): bits above 7 of y >> 4 are zero
    y = _mm512_ternarylogic_epi32(y, _mm512_srli_epi32(y, 4), _mm512_set1_epi32(0x7F), 0xE4);
  return y;
}

// The code of 16 values of a block of exponent E (top + 1 < E < 255) where some have no normal code;
// bias = 0x7FFFF − ((E − top) << 23), up = 2^(129 + top − E). With t = |x|'s bits + bias + round3's
// lsb, a normal code is t >> 20 and exists exactly when t ≥ 2^23 (e ≥ 1). Below that the code is
// |x| / 2^(E−129−top) rounded to nearest even: |x| · up is exact wherever the quotient is at least
// 2^−126 and far below ½ otherwise, so one multiply and one conversion in the default rounding give it.
template <StateKind K>
inline __m512i q8_code16_mixed(__m512 x, __m512i bias, __m512 up) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i a = K == StateKind::m ? _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)) : u;
  const __mmask16 odd = _mm512_test_epi32_mask(a, _mm512_set1_epi32(1 << 20));
  __m512i t = _mm512_add_epi32(a, bias);
  t = _mm512_mask_add_epi32(t, odd, t, _mm512_set1_epi32(1));
  const __mmask16 small = _mm512_cmplt_epi32_mask(t, _mm512_set1_epi32(1 << 23));
  const __m512i q = _mm512_cvt_roundps_epi32(_mm512_mul_ps(_mm512_castsi512_ps(a), up),
                                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512i y = _mm512_mask_mov_epi32(_mm512_srli_epi32(t, 20), small, q);
  if constexpr (K == StateKind::m)  // y | (u >> 24 & 0x80)
    y = _mm512_ternarylogic_epi32(y, _mm512_srli_epi32(u, 24), _mm512_set1_epi32(0x80), 0xF8);
  return y;
}

// Encodes t[0, 256) given the largest and the smallest key of the block.
template <StateKind K>
inline void q8_encode_block_keys(const float* t, std::uint8_t* codes, float* scale, std::uint32_t kmax,
                                 std::uint32_t kmin) {
  constexpr std::uint32_t top = kTop<K>;
  if (kmax >= 0x7F800000u) {  // a non-finite value (or, for v, a negative one)
    __m512i e = _mm512_setzero_si512();
    for (std::size_t j = 0; j < kQ8Block; j += 16) e = _mm512_max_epu32(e, q8_exponent16(_mm512_loadu_ps(t + j)));
    return q8_encode_block<K>(t, codes, scale, e);
  }
  const std::uint32_t E = spec::q8_block_exponent(spec::q8_round3(kmax) >> 23, K);
  if (E == 0 || E == spec::kQ8Nan) {
    *scale = spec::q8_scale(E);
    std::memset(codes, 0, kQ8Block);
    return;
  }
  *scale = spec::q8_scale(E);
  const __m512i bias = _mm512_set1_epi32(static_cast<int>(0x7FFFFu - ((E - top) << 23)));
  if ((spec::q8_round3(kmin) >> 23) + top <= E) {  // some element below the normal codes
    if (E == top + 1) return q8_encode_block<K>(t, codes, scale, _mm512_set1_epi32(static_cast<int>(E)));
    const __m512 up = _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(q8_small_inverse_bits(E, top))));
    for (std::size_t j = 0; j < kQ8Block; j += 64)
      store_codes64(codes + j, q8_code16_mixed<K>(_mm512_loadu_ps(t + j), bias, up),
                    q8_code16_mixed<K>(_mm512_loadu_ps(t + j + 16), bias, up),
                    q8_code16_mixed<K>(_mm512_loadu_ps(t + j + 32), bias, up),
                    q8_code16_mixed<K>(_mm512_loadu_ps(t + j + 48), bias, up));
    return;
  }
  for (std::size_t j = 0; j < kQ8Block; j += 64)
    store_codes64(codes + j, q8_code16_normal<K>(_mm512_loadu_ps(t + j), bias),
                  q8_code16_normal<K>(_mm512_loadu_ps(t + j + 16), bias),
                  q8_code16_normal<K>(_mm512_loadu_ps(t + j + 32), bias),
                  q8_code16_normal<K>(_mm512_loadu_ps(t + j + 48), bias));
}

// Decode. With a scale 2^(E−127), top < E < 255 (every scale an encode stores, NaN and zero blocks
// aside), value(c) × scale is exact. For a code with e ≥ 1 it is normal, and its bits are the code's
// magnitude shifted into the exponent and mantissa fields plus (E − top) << 23, and the sign bit for
// m: no multiply. A code with e = 0 (rare) is ±m3 · 2^(E−129−top), one exact multiply of m3. Blocks
// with other scales decode as value(c) × scale.
struct Q8Dec {
  __m512i bias;  // (E − top) << 23
  __m512 sub;    // 2^(E−129−top), normal or not
};

// Whether the block's scale lets it decode by the rule above; if so, its constants.
template <StateKind K>
inline bool q8_decode_plan(float scale, Q8Dec& d) {
  constexpr std::uint32_t top = kTop<K>;
  const std::uint32_t sb = spec::bits_of(scale), E = sb >> 23;
  if ((sb & 0x807FFFFFu) != 0 || E <= top || E >= spec::kQ8Nan) return false;
  d.bias = _mm512_set1_epi32(static_cast<int>((E - top) << 23));
  d.sub = _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(q8_small_step_bits(E, top))));
  return true;
}

// Whether every code of the block has e ≥ 1.
template <StateKind K>
inline bool q8_block_codes_normal(const std::uint8_t* p) {
  const __m512i e_bits = _mm512_set1_epi8(static_cast<char>(K == StateKind::m ? 0x78 : 0xF8));
  const __mmask64 k0 = _mm512_test_epi8_mask(_mm512_loadu_si512(p), e_bits);
  const __mmask64 k1 = _mm512_test_epi8_mask(_mm512_loadu_si512(p + 64), e_bits);
  const __mmask64 k2 = _mm512_test_epi8_mask(_mm512_loadu_si512(p + 128), e_bits);
  const __mmask64 k3 = _mm512_test_epi8_mask(_mm512_loadu_si512(p + 192), e_bits);
  return _cvtmask64_u64(_kand_mask64(_kand_mask64(k0, k1), _kand_mask64(k2, k3))) == ~std::uint64_t{0};
}

// 16 values of a block that decodes by the rule above; Sub: the block may hold codes with e = 0.
template <StateKind K, bool Sub>
inline __m512 q8_decode16(const std::uint8_t* p, const Q8Dec& d) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m512i c = K == StateKind::m ? _mm512_cvtepi8_epi32(b) : _mm512_cvtepu8_epi32(b);
  __m512i r;
  if constexpr (K == StateKind::m)  // sign-extended: (c << 20) keeps the sign at bit 31 once masked
    r = _mm512_and_si512(_mm512_slli_epi32(c, 20), _mm512_set1_epi32(static_cast<int>(0x87F00000u)));
  else
    r = _mm512_slli_epi32(c, 20);
  r = _mm512_add_epi32(r, d.bias);
  if constexpr (Sub) {  // ±m3 · 2^(E−129−top) where e = 0
    const __mmask16 e0 = _mm512_testn_epi32_mask(c, _mm512_set1_epi32(K == StateKind::m ? 0x78 : 0xF8));
    const __m512 mag = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_and_si512(c, _mm512_set1_epi32(7))), d.sub);
    __m512i e = _mm512_castps_si512(mag);
    if constexpr (K == StateKind::m)
      e = _mm512_ternarylogic_epi32(e, c, _mm512_set1_epi32(static_cast<int>(0x80000000u)), 0xF8);
    r = _mm512_mask_mov_epi32(r, e0, e);
  }
  return _mm512_castsi512_ps(r);
}

template <StateKind K>
inline void q8_decode_block(const std::uint8_t* codes, float scale, float* out) {
  Q8Dec d;
  if (q8_decode_plan<K>(scale, d)) {
    for (std::size_t j = 0; j < kQ8Block; j += 16) _mm512_storeu_ps(out + j, q8_decode16<K, true>(codes + j, d));
    return;
  }
  const __m512 sc = _mm512_set1_ps(scale);
  for (std::size_t j = 0; j < kQ8Block; j += 16) _mm512_storeu_ps(out + j, _mm512_mul_ps(q8_value16<K>(codes + j), sc));
}

template <StateKind K>
void q8_enc_loop(const float* src, std::uint8_t* dst, float* scales, std::size_t n) {
  const std::size_t full = n / kQ8Block * kQ8Block;
  for (std::size_t b = 0; b < full; b += kQ8Block) {
    __m512i hi = _mm512_setzero_si512(), lo = _mm512_set1_epi32(-1);
    for (std::size_t j = 0; j < kQ8Block; j += 16) {
      const __m512i key = q8_key16<K>(_mm512_loadu_ps(src + b + j));
      hi = _mm512_max_epu32(hi, key);
      lo = _mm512_min_epu32(lo, key);
    }
    q8_encode_block_keys<K>(src + b, dst + b, scales + b / kQ8Block, _mm512_reduce_max_epu32(hi), _mm512_reduce_min_epu32(lo));
  }
  q8_encode_scalar_range(K, src, dst, scales, full, n);
}
template <StateKind K>
void q8_dec_loop(const std::uint8_t* src, const float* scales, float* dst, std::size_t n) {
  const std::size_t full = n / kQ8Block * kQ8Block;
  for (std::size_t b = 0; b < full; b += kQ8Block) q8_decode_block<K>(src + b, scales[b / kQ8Block], dst + b);
  q8_decode_scalar_range(K, src, scales, dst, full, n);
}
void q8_enc(StateKind k, const float* s, std::uint8_t* d, float* scales, std::size_t n) {
  k == StateKind::m ? q8_enc_loop<StateKind::m>(s, d, scales, n) : q8_enc_loop<StateKind::v>(s, d, scales, n);
}
void q8_dec(StateKind k, const std::uint8_t* s, const float* scales, float* d, std::size_t n) {
  k == StateKind::m ? q8_dec_loop<StateKind::m>(s, scales, d, n) : q8_dec_loop<StateKind::v>(s, scales, d, n);
}

// The step over one block of q8 states, its new m and v into mt and vt, their keys' extremes into the
// four accumulators. Inline: m and v are decoded in the loop (Sub: the block holds codes with e = 0),
// and v's new values encoded there too, as normal codes of v's present block exponent (encode bias
// ev) — right whenever the block keeps that exponent and stays in the normal range, which the caller
// checks afterwards (re-encoding v from vt where not). m is always encoded by the caller from mt: its
// block exponent moves in about a third of the blocks each step in training, too often for the guess
// to pay. Otherwise m and v are read from mt and vt, where the caller has decoded them.
template <GradType G, int Out, bool NB, bool Inline, bool Sub = false>
#if defined(__GNUC__)
__attribute__((target("avx512bf16")))
#endif
inline void q8_block_step(const Consts& k, const UpdateChunk& c, std::size_t b, float* mt, float* vt,
                          const Q8Dec& dm, const Q8Dec& dv, __m512i ev, __m512i& mhi, __m512i& mlo, __m512i& vhi,
                          __m512i& vlo) {
  auto* const mc = static_cast<std::uint8_t*>(c.m);
  auto* const vc = static_cast<std::uint8_t*>(c.v);
  const void* const grad = c.grad;
  float* const master = c.master;
  auto* const out = static_cast<std::uint16_t*>(c.param16);
  for (std::size_t j0 = 0; j0 < kQ8Block; j0 += 64) {
    __m512i vcode[4];
    for (std::size_t q = 0; q < 4; ++q) {
      const std::size_t j = j0 + 16 * q, i = b + j;
      __m512 p = _mm512_loadu_ps(master + i), m, v;
      if constexpr (Inline) {
        m = q8_decode16<StateKind::m, Sub>(mc + i, dm);
        v = q8_decode16<StateKind::v, Sub>(vc + i, dv);
      } else {
        m = _mm512_load_ps(mt + j);
        v = _mm512_load_ps(vt + j);
      }
      adam16(k, load_grad16<G>(grad, i), p, m, v);
      _mm512_storeu_ps(master + i, p);
      store_param16<Out, NB>(out, i, p);
      _mm512_store_ps(mt + j, m);
      _mm512_store_ps(vt + j, v);
      const __m512i mk = q8_key16<StateKind::m>(m), vk = q8_key16<StateKind::v>(v);
      mhi = _mm512_max_epu32(mhi, mk);
      mlo = _mm512_min_epu32(mlo, mk);
      vhi = _mm512_max_epu32(vhi, vk);
      vlo = _mm512_min_epu32(vlo, vk);
      if constexpr (Inline) vcode[q] = q8_code16_normal<StateKind::v>(v, ev);
    }
    if constexpr (Inline) store_codes64(vc + b + j0, vcode[0], vcode[1], vcode[2], vcode[3]);
  }
}

// Whether a block's codes, written by q8_block_step's inline encode for block exponent Ep, are its
// codes: the keys' extremes give the block exponent Ep again and every element a normal code.
template <StateKind K>
inline bool q8_inline_codes_hold(std::uint32_t Ep, std::uint32_t kmax, std::uint32_t kmin) {
  if (kmax >= 0x7F800000u) return false;
  const std::uint32_t E = spec::q8_block_exponent(spec::q8_round3(kmax) >> 23, K);
  return E == Ep && (spec::q8_round3(kmin) >> 23) + kTop<K> > E;
}

// One block at a time. A block whose m and v scales are powers of two in the range an encode stores
// (all but NaN and zero blocks) is decoded, stepped and its v encoded in one loop, on the guess that
// v's exponent stays as it is; the guess is checked from the keys' extremes and v re-encoded from its
// L1-resident copy where it fails; m is encoded from its copy. Other blocks: decode into the buffers,
// the step, then encode from them.
template <GradType G, int Out, bool NB>
#if defined(__GNUC__)
__attribute__((target("avx512bf16")))
#endif
void adam_q8_loop(const AdamStep& s, const UpdateChunk& c) {
  const Consts k(s);
  const std::size_t full = c.n / kQ8Block * kQ8Block;
  auto* mc = static_cast<std::uint8_t*>(c.m);
  auto* vc = static_cast<std::uint8_t*>(c.v);
  alignas(64) float mt[kQ8Block], vt[kQ8Block];
  for (std::size_t b = 0; b < full; b += kQ8Block) {
    const std::size_t blk = b / kQ8Block;
    __m512i mhi = _mm512_setzero_si512(), vhi = mhi, mlo = _mm512_set1_epi32(-1), vlo = mlo;
    Q8Dec dm{}, dv{};
    if (q8_decode_plan<StateKind::m>(c.m_scale[blk], dm) && q8_decode_plan<StateKind::v>(c.v_scale[blk], dv)) {
      const std::uint32_t Ev = spec::bits_of(c.v_scale[blk]) >> 23;
      const __m512i ev = _mm512_set1_epi32(static_cast<int>(0x7FFFFu - ((Ev - kTop<StateKind::v>) << 23)));
      if (q8_block_codes_normal<StateKind::m>(mc + b) && q8_block_codes_normal<StateKind::v>(vc + b))
        q8_block_step<G, Out, NB, true>(k, c, b, mt, vt, dm, dv, ev, mhi, mlo, vhi, vlo);
      else
        q8_block_step<G, Out, NB, true, true>(k, c, b, mt, vt, dm, dv, ev, mhi, mlo, vhi, vlo);
      const std::uint32_t mmax = _mm512_reduce_max_epu32(mhi), mmin = _mm512_reduce_min_epu32(mlo);
      const std::uint32_t vmax = _mm512_reduce_max_epu32(vhi), vmin = _mm512_reduce_min_epu32(vlo);
      q8_encode_block_keys<StateKind::m>(mt, mc + b, c.m_scale + blk, mmax, mmin);
      if (!q8_inline_codes_hold<StateKind::v>(Ev, vmax, vmin))
        q8_encode_block_keys<StateKind::v>(vt, vc + b, c.v_scale + blk, vmax, vmin);
      continue;  // where v's codes hold, so does its scale: 2^(E−127) with the same E
    }
    q8_decode_block<StateKind::m>(mc + b, c.m_scale[blk], mt);
    q8_decode_block<StateKind::v>(vc + b, c.v_scale[blk], vt);
    q8_block_step<G, Out, NB, false>(k, c, b, mt, vt, dm, dv, _mm512_setzero_si512(), mhi, mlo, vhi, vlo);
    q8_encode_block_keys<StateKind::m>(mt, mc + b, c.m_scale + blk, _mm512_reduce_max_epu32(mhi),
                                       _mm512_reduce_min_epu32(mlo));
    q8_encode_block_keys<StateKind::v>(vt, vc + b, c.v_scale + blk, _mm512_reduce_max_epu32(vhi),
                                       _mm512_reduce_min_epu32(vlo));
  }
  adam_scalar_range(s, c, full, c.n);  // a partial last block
}

template <GradType G, int Out, bool NB>
void adam_states(const AdamStep& s, const UpdateChunk& c) {
  switch (c.states) {
    case StateFormat::fp32: return adam_loop<G, Out, NB, StateFormat::fp32>(s, c);
    case StateFormat::bf16: return adam_loop<G, Out, NB, StateFormat::bf16>(s, c);
    case StateFormat::q8: return adam_q8_loop<G, Out, NB>(s, c);
  }
}

template <GradType G, bool NB>
void adam_for_out(const AdamStep& s, const UpdateChunk& c) {
  if (!c.param16) return adam_states<G, 0, NB>(s, c);
  if (c.param16_type == HalfType::fp16) return adam_states<G, 1, NB>(s, c);
  return adam_states<G, 2, NB>(s, c);
}

template <GradType G>
void adam_for_grad(const AdamStep& s, const UpdateChunk& c, bool native_bf16) {
  return native_bf16 ? adam_for_out<G, true>(s, c) : adam_for_out<G, false>(s, c);
}

bool native_bf16() {
  static const bool has = cpu_has_avx512_bf16();
  return has;
}

void adam_avx512(const AdamStep& s, const UpdateChunk& c) {
  const bool nb = native_bf16();
  switch (c.grad_type) {
    case GradType::fp32: return adam_for_grad<GradType::fp32>(s, c, nb);
    case GradType::fp16: return adam_for_grad<GradType::fp16>(s, c, nb);
    case GradType::bf16: return adam_for_grad<GradType::bf16>(s, c, nb);
  }
}

// The Update's loads and stores for the state format S, with adds for math.
template <GradType G, int Out, StateFormat S>
void traffic_loop(const UpdateChunk& c) {
  const std::size_t n16 = c.n & ~std::size_t{15};
  auto* out = static_cast<std::uint16_t*>(c.param16);
  for (std::size_t i = 0; i < n16; i += 16) {
    const __m512 g = load_grad16<G>(c.grad, i);
    const __m512 p = _mm512_add_ps(_mm512_loadu_ps(c.master + i), g);
    _mm512_storeu_ps(c.master + i, p);
    if constexpr (S == StateFormat::fp32) {
      auto* cm = static_cast<float*>(c.m) + i;
      auto* cv = static_cast<float*>(c.v) + i;
      _mm512_storeu_ps(cm, _mm512_add_ps(_mm512_loadu_ps(cm), g));
      _mm512_storeu_ps(cv, _mm512_add_ps(_mm512_loadu_ps(cv), g));
    } else if constexpr (S == StateFormat::bf16) {
      auto* cm = reinterpret_cast<__m256i*>(static_cast<std::uint16_t*>(c.m) + i);
      auto* cv = reinterpret_cast<__m256i*>(static_cast<std::uint16_t*>(c.v) + i);
      const __m256i gb = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(g), 16));
      _mm256_storeu_si256(cm, _mm256_add_epi16(_mm256_loadu_si256(cm), gb));
      _mm256_storeu_si256(cv, _mm256_add_epi16(_mm256_loadu_si256(cv), gb));
    } else {
      auto* cm = reinterpret_cast<__m128i*>(static_cast<std::uint8_t*>(c.m) + i);
      auto* cv = reinterpret_cast<__m128i*>(static_cast<std::uint8_t*>(c.v) + i);
      const __m128i gb = _mm512_cvtepi32_epi8(_mm512_srli_epi32(_mm512_castps_si512(g), 24));
      _mm_storeu_si128(cm, _mm_add_epi8(_mm_loadu_si128(cm), gb));
      _mm_storeu_si128(cv, _mm_add_epi8(_mm_loadu_si128(cv), gb));
      if (i % kQ8Block == 0) {
        c.m_scale[i / kQ8Block] += 1.0f;
        c.v_scale[i / kQ8Block] += 1.0f;
      }
    }
    if constexpr (Out == 1)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                          _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    else if constexpr (Out == 2)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), to_bf16_emulated(p));
  }
  traffic_tail(c, n16);
}
template <GradType G, StateFormat S>
void traffic_for_out(const UpdateChunk& c) {
  if (!c.param16) return traffic_loop<G, 0, S>(c);
  return c.param16_type == HalfType::fp16 ? traffic_loop<G, 1, S>(c) : traffic_loop<G, 2, S>(c);
}
template <GradType G>
void traffic_for_grad(const UpdateChunk& c) {
  switch (c.states) {
    case StateFormat::fp32: return traffic_for_out<G, StateFormat::fp32>(c);
    case StateFormat::bf16: return traffic_for_out<G, StateFormat::bf16>(c);
    case StateFormat::q8: return traffic_for_out<G, StateFormat::q8>(c);
  }
}
void traffic_avx512(const UpdateChunk& c) {
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
  static const KernelTable t{adam_avx512, sum_squares_avx512, f32_f16, f16_f32, f32_bf16, bf16_f32, traffic_avx512, q8_enc, q8_dec};
  return t;
}

}  // namespace zinf::cpu_adam::detail
