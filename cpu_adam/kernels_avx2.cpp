// kernels_avx2.cpp — the AVX2 + FMA + F16C path (8 fp32 lanes); bf16 output by integer emulation.
// Compiled with exactly those flags. The tail (< 8 elements) runs the scalar reference.
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "kernels.h"
#include "zinf/cpu_adam/convert.h"
#include "zinf/cpu_adam/spec.h"

namespace zinf::cpu_adam::detail {
namespace {

template <GradType G>
inline __m256 load_grad8(const void* g, std::size_t i) {
  if constexpr (G == GradType::fp32) {
    return _mm256_loadu_ps(static_cast<const float*>(g) + i);
  } else if constexpr (G == GradType::fp16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const std::uint16_t*>(g) + i)));
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const std::uint16_t*>(g) + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

// fp32 → bf16, the rules of fp32_to_bf16_reference, in 32-bit integer lanes.
inline __m128i to_bf16(__m256 p) {
  const __m256i u = _mm256_castps_si256(p);
  const __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF));
  const __m256i hi = _mm256_srli_epi32(u, 16);
  const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb), 16);
  // a > 0x7F800000 (NaN) and a < 0x00800000 (subnormal): a is non-negative, so signed compares work.
  const __m256i is_nan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7F800000));
  const __m256i is_sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(0x00800000), a);
  r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), is_nan);
  r = _mm256_blendv_epi8(r, _mm256_and_si256(hi, _mm256_set1_epi32(0x8000)), is_sub);
  // pack the eight 16-bit values (all ≤ 0xFFFF, so unsigned saturation is exact), then fix lane order
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0xD8);
  return _mm256_castsi256_si128(packed);
}

// The broadcast step scalars and one vector of the specification's Adam step (adam.h), in its order.
struct Consts {
  __m256 scale, b1, omb1, b2, omb2, eps, bc2, step, decay;
  bool l2, wdec;
  explicit Consts(const AdamStep& s)
      : scale(_mm256_set1_ps(s.grad_scale)),
        b1(_mm256_set1_ps(s.beta1)),
        omb1(_mm256_set1_ps(s.one_minus_beta1)),
        b2(_mm256_set1_ps(s.beta2)),
        omb2(_mm256_set1_ps(s.one_minus_beta2)),
        eps(_mm256_set1_ps(s.eps)),
        bc2(_mm256_set1_ps(s.bc2_rsqrt)),
        step(_mm256_set1_ps(s.step_size)),
        decay(_mm256_set1_ps(s.decay)),
        l2(s.apply_decay && !s.decoupled),
        wdec(s.apply_decay && s.decoupled) {}
};

inline void adam8(const Consts& k, __m256 g, __m256& p, __m256& m, __m256& v) {
  g = _mm256_mul_ps(g, k.scale);
  if (k.l2) g = _mm256_fmadd_ps(k.decay, p, g);
  m = _mm256_fmadd_ps(m, k.b1, _mm256_mul_ps(g, k.omb1));
  v = _mm256_fmadd_ps(v, k.b2, _mm256_mul_ps(_mm256_mul_ps(g, g), k.omb2));
  const __m256 denom = _mm256_fmadd_ps(_mm256_sqrt_ps(v), k.bc2, k.eps);
  const __m256 u = _mm256_div_ps(m, denom);
  if (k.wdec) p = _mm256_mul_ps(p, k.decay);
  p = _mm256_fmadd_ps(k.step, u, p);
}

template <int Out>  // 0 none, 1 fp16, 2 bf16
inline void store_param16(std::uint16_t* out, std::size_t i, __m256 p) {
  if constexpr (Out == 1)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  else if constexpr (Out == 2)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), to_bf16(p));
}

inline __m256 load_bf16(const std::uint16_t* p) {
  return _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}

// fp32 and bf16 states: element-wise, 8 lanes at a time.
template <GradType G, int Out, StateFormat S>
void adam_loop(const AdamStep& s, const UpdateChunk& c) {
  const Consts k(s);
  const std::size_t n8 = c.n & ~std::size_t{7};
  auto* out = static_cast<std::uint16_t*>(c.param16);
  for (std::size_t i = 0; i < n8; i += 8) {
    __m256 p = _mm256_loadu_ps(c.master + i), m, v;
    if constexpr (S == StateFormat::fp32) {
      m = _mm256_loadu_ps(static_cast<float*>(c.m) + i);
      v = _mm256_loadu_ps(static_cast<float*>(c.v) + i);
    } else {
      m = load_bf16(static_cast<std::uint16_t*>(c.m) + i);
      v = load_bf16(static_cast<std::uint16_t*>(c.v) + i);
    }
    adam8(k, load_grad8<G>(c.grad, i), p, m, v);
    _mm256_storeu_ps(c.master + i, p);
    if constexpr (S == StateFormat::fp32) {
      _mm256_storeu_ps(static_cast<float*>(c.m) + i, m);
      _mm256_storeu_ps(static_cast<float*>(c.v) + i, v);
    } else {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<std::uint16_t*>(c.m) + i), to_bf16(m));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<std::uint16_t*>(c.v) + i), to_bf16(v));
    }
    store_param16<Out>(out, i, p);
  }
  adam_scalar_range(s, c, n8, c.n);
}

// ---- q8 states (spec.h): decode, Adam and encode of one 256-element block in one pass ----

template <StateKind K>
constexpr int kTop = K == StateKind::m ? 15 : 31;

inline __m256i set1(std::uint32_t x) { return _mm256_set1_epi32(static_cast<int>(x)); }

// spec::q8_value of 8 codes. For e ≥ 1 the value's bits are the code's magnitude shifted to the
// exponent and mantissa fields plus a constant; codes with e = 0 (rare) are m3 · 2^(−2−top).
template <StateKind K>
inline __m256 q8_value8(const std::uint8_t* p) {
  const __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  const __m256i mag = K == StateKind::m ? _mm256_and_si256(c, set1(0x7F)) : c;
  __m256i r = _mm256_add_epi32(_mm256_slli_epi32(mag, 20), set1(static_cast<std::uint32_t>(127 - kTop<K>) << 23));
  const __m256i e0 = _mm256_cmpgt_epi32(set1(8), mag);
  if (_mm256_movemask_ps(_mm256_castsi256_ps(e0))) {
    const __m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(mag),
                                     _mm256_castsi256_ps(set1(static_cast<std::uint32_t>(125 - kTop<K>) << 23)));
    r = _mm256_blendv_epi8(r, _mm256_castps_si256(sub), e0);
  }
  if constexpr (K == StateKind::m) r = _mm256_or_si256(r, _mm256_and_si256(_mm256_slli_epi32(c, 24), set1(0x80000000u)));
  return _mm256_castsi256_ps(r);
}

// round3(a) >> Shift for a = |x| bits: by 20, the exponent and the 3 rounded mantissa bits; by 23, the
// exponent (the masking of round3 is implied by the shift).
template <int Shift = 20>
inline __m256i round3_top(__m256i a) {
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(a, 20), set1(1));
  return _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(a, set1(0x7FFFF)), lsb), Shift);
}

// spec::q8_exponent of 8 values, except that a non-finite x may give 256 instead of 255 (a NaN's
// mantissa can carry past the exponent); q8_encode_block treats every value ≥ 255 as kQ8Nan.
inline __m256i q8_exponent8(__m256 x) {
  return round3_top<23>(_mm256_and_si256(_mm256_castps_si256(x), set1(0x7FFFFFFF)));
}

// The codes below the normal range (spec::q8_encode's second branch): x rounded to nearest even onto
// the e = 0 grid, straight from its bits a = |x|.
template <StateKind K>
inline __m256i q8_encode8_small(__m256i a, __m256i E) {
  constexpr int top = kTop<K>;
  const __m256i ex = _mm256_srli_epi32(a, 23);
  const __m256i frac = _mm256_and_si256(a, set1(0x7FFFFF));
  const __m256i no_ex = _mm256_cmpeq_epi32(ex, _mm256_setzero_si256());
  const __m256i mant = _mm256_blendv_epi8(_mm256_or_si256(frac, set1(0x800000)), frac, no_ex);
  const __m256i exc = _mm256_max_epu32(ex, set1(1));
  const __m256i sh = _mm256_sub_epi32(_mm256_add_epi32(E, set1(21 - top)), exc);
  const __m256i half = _mm256_sub_epi32(_mm256_sllv_epi32(set1(1), _mm256_sub_epi32(sh, set1(1))), set1(1));
  const __m256i odd = _mm256_and_si256(_mm256_srlv_epi32(mant, sh), set1(1));
  const __m256i q = _mm256_srlv_epi32(_mm256_add_epi32(_mm256_add_epi32(mant, half), odd), sh);
  return _mm256_and_si256(q, _mm256_cmpgt_epi32(set1(25), sh));
}

// spec::q8_encode of 8 values in a block of exponent E (top < E < 255), as 8 bytes; c = (E − top) << 3.
// A normal code is round3(x) >> 20 less c: (exp − E + top) << 3 | m3.
template <StateKind K>
inline __m128i q8_encode8(__m256 x, __m256i E, __m256i c) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i a = _mm256_and_si256(u, set1(0x7FFFFFFF));
  const __m256i r = round3_top(a);
  const __m256i normal = _mm256_cmpgt_epi32(r, _mm256_add_epi32(c, set1(7)));
  __m256i code = _mm256_sub_epi32(r, c);
  if (_mm256_movemask_ps(_mm256_castsi256_ps(normal)) != 0xFF)  // rare
    code = _mm256_blendv_epi8(q8_encode8_small<K>(a, E), code, normal);
  if constexpr (K == StateKind::m) code = _mm256_or_si256(code, _mm256_and_si256(_mm256_srli_epi32(u, 24), set1(0x80)));
  // the low byte of each 32-bit lane, in order
  const __m256i bytes = _mm256_shuffle_epi8(
      code, _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1, -1, -1, -1,
                             -1, -1, -1, -1, -1, -1, -1, -1));
  return _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1)));
}

inline std::uint32_t reduce_max(__m256i x) {
  alignas(32) std::uint32_t lane[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lane), x);
  std::uint32_t mx = 0;
  for (std::uint32_t e : lane) mx = e > mx ? e : mx;
  return mx;
}
inline std::uint32_t reduce_min(__m256i x) {
  alignas(32) std::uint32_t lane[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lane), x);
  std::uint32_t mn = lane[0];
  for (std::uint32_t e : lane) mn = e < mn ? e : mn;
  return mn;
}

// Encodes a block's fp32 values t[0, 256) given the largest of their q8_exponent8: the general
// encoder, for blocks the fast one below does not take.
template <StateKind K>
inline void q8_encode_block(const float* t, std::uint8_t* codes, float* scale, __m256i emax) {
  const std::uint32_t mx = reduce_max(emax);
  const std::uint32_t E = spec::q8_block_exponent(mx < spec::kQ8Nan ? mx : spec::kQ8Nan, K);
  *scale = spec::q8_scale(E);
  if (E == 0 || E == spec::kQ8Nan) {
    std::memset(codes, 0, kQ8Block);
    return;
  }
  const __m256i e = set1(E), c = set1((E - static_cast<std::uint32_t>(kTop<K>)) << 3);
  for (std::size_t j = 0; j < kQ8Block; j += 8)
    _mm_storel_epi64(reinterpret_cast<__m128i*>(codes + j), q8_encode8<K>(_mm256_loadu_ps(t + j), e, c));
}

// ---- the fast q8 block paths: the AVX-512 file's scheme (see there) on 8 lanes ----

// A block's order key: |x|'s bits for m, x's bits for v.
template <StateKind K>
inline __m256i q8_key8(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  return K == StateKind::m ? _mm256_and_si256(u, set1(0x7FFFFFFF)) : u;
}

// 32 codes (four vectors of 32-bit codes, each 0..255) as bytes in element order.
inline void store_codes32(std::uint8_t* dst, __m256i q0, __m256i q1, __m256i q2, __m256i q3) {
  // packus works within 128-bit lanes: lane L of the bytes holds elements 4L..4L+3 of q0, q1, q2, q3.
  const __m256i b = _mm256_packus_epi16(_mm256_packus_epi32(q0, q1), _mm256_packus_epi32(q2, q3));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst),
                      _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

// The normal code of 8 values of a block whose every element has one; bias = 0x7FFFF − ((E − top) << 23).
template <StateKind K>
inline __m256i q8_code8_normal(__m256 x, __m256i bias) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 20), set1(1));
  __m256i y = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, bias), lsb), 20);
  if constexpr (K == StateKind::m)  // the sign, at bit 11, to bit 7
    y = _mm256_or_si256(_mm256_and_si256(y, set1(0x7F)), _mm256_and_si256(_mm256_srli_epi32(y, 4), set1(0x80)));
  return y;
}

// The code of 8 values of a block of exponent E (top + 1 < E < 255) where some have no normal code:
// the AVX-512 file's q8_code16_mixed (see there), the rounding to an integer done by round_ps in
// nearest-even mode so that it does not depend on MXCSR.
template <StateKind K>
inline __m256i q8_code8_mixed(__m256 x, __m256i bias, __m256 up) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i a = K == StateKind::m ? _mm256_and_si256(u, set1(0x7FFFFFFF)) : u;
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(a, 20), set1(1));
  const __m256i t = _mm256_add_epi32(_mm256_add_epi32(a, bias), lsb);
  const __m256i small = _mm256_cmpgt_epi32(set1(1u << 23), t);
  const __m256 q = _mm256_round_ps(_mm256_mul_ps(_mm256_castsi256_ps(a), up), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256i y = _mm256_blendv_epi8(_mm256_srli_epi32(t, 20), _mm256_cvttps_epi32(q), small);
  if constexpr (K == StateKind::m) y = _mm256_or_si256(y, _mm256_and_si256(_mm256_srli_epi32(u, 24), set1(0x80)));
  return y;
}

// Encodes t[0, 256) given the largest and the smallest key of the block.
template <StateKind K>
inline void q8_encode_block_keys(const float* t, std::uint8_t* codes, float* scale, std::uint32_t kmax,
                                 std::uint32_t kmin) {
  constexpr std::uint32_t top = static_cast<std::uint32_t>(kTop<K>);
  if (kmax >= 0x7F800000u) {  // a non-finite value (or, for v, a negative one)
    __m256i e = _mm256_setzero_si256();
    for (std::size_t j = 0; j < kQ8Block; j += 8) e = _mm256_max_epu32(e, q8_exponent8(_mm256_loadu_ps(t + j)));
    return q8_encode_block<K>(t, codes, scale, e);
  }
  const std::uint32_t E = spec::q8_block_exponent(spec::q8_round3(kmax) >> 23, K);
  if (E == 0 || E == spec::kQ8Nan) {
    *scale = spec::q8_scale(E);
    std::memset(codes, 0, kQ8Block);
    return;
  }
  *scale = spec::q8_scale(E);
  const __m256i bias = set1(0x7FFFFu - ((E - top) << 23));
  if ((spec::q8_round3(kmin) >> 23) + top <= E) {  // some element below the normal codes
    if (E == top + 1) return q8_encode_block<K>(t, codes, scale, set1(E));
    const __m256 up = _mm256_castsi256_ps(set1(q8_small_inverse_bits(E, top)));
    for (std::size_t j = 0; j < kQ8Block; j += 32)
      store_codes32(codes + j, q8_code8_mixed<K>(_mm256_loadu_ps(t + j), bias, up),
                    q8_code8_mixed<K>(_mm256_loadu_ps(t + j + 8), bias, up),
                    q8_code8_mixed<K>(_mm256_loadu_ps(t + j + 16), bias, up),
                    q8_code8_mixed<K>(_mm256_loadu_ps(t + j + 24), bias, up));
    return;
  }
  for (std::size_t j = 0; j < kQ8Block; j += 32)
    store_codes32(codes + j, q8_code8_normal<K>(_mm256_loadu_ps(t + j), bias),
                  q8_code8_normal<K>(_mm256_loadu_ps(t + j + 8), bias),
                  q8_code8_normal<K>(_mm256_loadu_ps(t + j + 16), bias),
                  q8_code8_normal<K>(_mm256_loadu_ps(t + j + 24), bias));
}

// Whether every code of the block has e ≥ 1.
template <StateKind K>
inline bool q8_block_codes_normal(const std::uint8_t* p) {
  const __m256i e_bits = _mm256_set1_epi8(static_cast<char>(K == StateKind::m ? 0x78 : 0xF8));
  __m256i lo = e_bits;
  for (std::size_t j = 0; j < kQ8Block; j += 32)
    lo = _mm256_min_epu8(lo, _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + j)), e_bits));
  return _mm256_movemask_epi8(_mm256_cmpeq_epi8(lo, _mm256_setzero_si256())) == 0;
}

// 8 values of a block whose scale is 2^(E−127), top < E < 255 (the AVX-512 file's q8_decode16):
// bias = (E − top) << 23, sub = 2^(E−129−top); Sub: the block may hold codes with e = 0.
template <StateKind K, bool Sub>
inline __m256 q8_decode8(const std::uint8_t* p, __m256i bias, __m256 sub) {
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  const __m256i c = K == StateKind::m ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b);
  __m256i r;
  if constexpr (K == StateKind::m)  // sign-extended: (c << 20) keeps the sign at bit 31 once masked
    r = _mm256_and_si256(_mm256_slli_epi32(c, 20), set1(0x87F00000u));
  else
    r = _mm256_slli_epi32(c, 20);
  r = _mm256_add_epi32(r, bias);
  if constexpr (Sub) {  // ±m3 · 2^(E−129−top) where e = 0
    const __m256i e0 = _mm256_cmpeq_epi32(_mm256_and_si256(c, set1(K == StateKind::m ? 0x78 : 0xF8)), _mm256_setzero_si256());
    __m256i e = _mm256_castps_si256(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_and_si256(c, set1(7))), sub));
    if constexpr (K == StateKind::m) e = _mm256_or_si256(e, _mm256_and_si256(c, set1(0x80000000u)));
    r = _mm256_blendv_epi8(r, e, e0);
  }
  return _mm256_castsi256_ps(r);
}

template <StateKind K, bool Sub>
inline void q8_decode_block_pow2(const std::uint8_t* codes, __m256i bias, __m256 sub, float* out) {
  for (std::size_t j = 0; j < kQ8Block; j += 8) _mm256_storeu_ps(out + j, q8_decode8<K, Sub>(codes + j, bias, sub));
}

template <StateKind K>
inline void q8_decode_block(const std::uint8_t* codes, float scale, float* out) {
  constexpr std::uint32_t top = static_cast<std::uint32_t>(kTop<K>);
  const std::uint32_t sb = spec::bits_of(scale), E = sb >> 23;
  if ((sb & 0x807FFFFFu) == 0 && E > top && E < spec::kQ8Nan) {
    const __m256i bias = set1((E - top) << 23);
    const __m256 sub = _mm256_castsi256_ps(set1(q8_small_step_bits(E, top)));
    if (q8_block_codes_normal<K>(codes))
      q8_decode_block_pow2<K, false>(codes, bias, sub, out);
    else
      q8_decode_block_pow2<K, true>(codes, bias, sub, out);
    return;
  }
  const __m256 sc = _mm256_set1_ps(scale);
  for (std::size_t j = 0; j < kQ8Block; j += 8) _mm256_storeu_ps(out + j, _mm256_mul_ps(q8_value8<K>(codes + j), sc));
}

template <StateKind K>
void q8_enc_loop(const float* src, std::uint8_t* dst, float* scales, std::size_t n) {
  const std::size_t full = n / kQ8Block * kQ8Block;
  for (std::size_t b = 0; b < full; b += kQ8Block) {
    __m256i hi = _mm256_setzero_si256(), lo = set1(0xFFFFFFFFu);
    for (std::size_t j = 0; j < kQ8Block; j += 8) {
      const __m256i key = q8_key8<K>(_mm256_loadu_ps(src + b + j));
      hi = _mm256_max_epu32(hi, key);
      lo = _mm256_min_epu32(lo, key);
    }
    q8_encode_block_keys<K>(src + b, dst + b, scales + b / kQ8Block, reduce_max(hi), reduce_min(lo));
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

// One block at a time: decode m and v into L1-resident buffers, the fp32 step over the block (its
// new m and v back into the buffers, their keys' extremes kept per lane), then encode both.
template <GradType G, int Out>
void adam_q8_loop(const AdamStep& s, const UpdateChunk& c) {
  const Consts k(s);
  const std::size_t full = c.n / kQ8Block * kQ8Block;
  auto* out = static_cast<std::uint16_t*>(c.param16);
  auto* mc = static_cast<std::uint8_t*>(c.m);
  auto* vc = static_cast<std::uint8_t*>(c.v);
  alignas(32) float mt[kQ8Block], vt[kQ8Block];
  for (std::size_t b = 0; b < full; b += kQ8Block) {
    const std::size_t blk = b / kQ8Block;
    q8_decode_block<StateKind::m>(mc + b, c.m_scale[blk], mt);
    q8_decode_block<StateKind::v>(vc + b, c.v_scale[blk], vt);
    __m256i mhi = _mm256_setzero_si256(), vhi = mhi, mlo = set1(0xFFFFFFFFu), vlo = mlo;
    for (std::size_t j = 0; j < kQ8Block; j += 8) {
      const std::size_t i = b + j;
      __m256 p = _mm256_loadu_ps(c.master + i), m = _mm256_load_ps(mt + j), v = _mm256_load_ps(vt + j);
      adam8(k, load_grad8<G>(c.grad, i), p, m, v);
      _mm256_storeu_ps(c.master + i, p);
      store_param16<Out>(out, i, p);
      _mm256_store_ps(mt + j, m);
      _mm256_store_ps(vt + j, v);
      const __m256i mk = q8_key8<StateKind::m>(m), vk = q8_key8<StateKind::v>(v);
      mhi = _mm256_max_epu32(mhi, mk);
      mlo = _mm256_min_epu32(mlo, mk);
      vhi = _mm256_max_epu32(vhi, vk);
      vlo = _mm256_min_epu32(vlo, vk);
    }
    q8_encode_block_keys<StateKind::m>(mt, mc + b, c.m_scale + blk, reduce_max(mhi), reduce_min(mlo));
    q8_encode_block_keys<StateKind::v>(vt, vc + b, c.v_scale + blk, reduce_max(vhi), reduce_min(vlo));
  }
  adam_scalar_range(s, c, full, c.n);  // a partial last block
}

template <GradType G, int Out>
void adam_states(const AdamStep& s, const UpdateChunk& c) {
  switch (c.states) {
    case StateFormat::fp32: return adam_loop<G, Out, StateFormat::fp32>(s, c);
    case StateFormat::bf16: return adam_loop<G, Out, StateFormat::bf16>(s, c);
    case StateFormat::q8: return adam_q8_loop<G, Out>(s, c);
  }
}

template <GradType G>
void adam_for_grad(const AdamStep& s, const UpdateChunk& c) {
  if (!c.param16) return adam_states<G, 0>(s, c);
  if (c.param16_type == HalfType::fp16) return adam_states<G, 1>(s, c);
  return adam_states<G, 2>(s, c);
}

void adam_avx2(const AdamStep& s, const UpdateChunk& c) {
  switch (c.grad_type) {
    case GradType::fp32: return adam_for_grad<GradType::fp32>(s, c);
    case GradType::fp16: return adam_for_grad<GradType::fp16>(s, c);
    case GradType::bf16: return adam_for_grad<GradType::bf16>(s, c);
  }
}

// The same loops as kernels_avx512.cpp at half the vector width: each file compiles with its own
// target flags and names its instructions, so the order of operations that the bit-identity tests
// pin down stays visible in each.
template <GradType G, int Out, StateFormat S>
void traffic_loop(const UpdateChunk& c) {
  const std::size_t n8 = c.n & ~std::size_t{7};
  auto* out = static_cast<std::uint16_t*>(c.param16);
  for (std::size_t i = 0; i < n8; i += 8) {
    const __m256 g = load_grad8<G>(c.grad, i);
    const __m256 p = _mm256_add_ps(_mm256_loadu_ps(c.master + i), g);
    _mm256_storeu_ps(c.master + i, p);
    if constexpr (S == StateFormat::fp32) {
      auto* cm = static_cast<float*>(c.m) + i;
      auto* cv = static_cast<float*>(c.v) + i;
      _mm256_storeu_ps(cm, _mm256_add_ps(_mm256_loadu_ps(cm), g));
      _mm256_storeu_ps(cv, _mm256_add_ps(_mm256_loadu_ps(cv), g));
    } else if constexpr (S == StateFormat::bf16) {
      auto* cm = reinterpret_cast<__m128i*>(static_cast<std::uint16_t*>(c.m) + i);
      auto* cv = reinterpret_cast<__m128i*>(static_cast<std::uint16_t*>(c.v) + i);
      const __m128i gh = _mm256_castsi256_si128(_mm256_permute4x64_epi64(
          _mm256_packus_epi32(_mm256_srli_epi32(_mm256_castps_si256(g), 16), _mm256_setzero_si256()), 0xD8));
      _mm_storeu_si128(cm, _mm_add_epi16(_mm_loadu_si128(cm), gh));
      _mm_storeu_si128(cv, _mm_add_epi16(_mm_loadu_si128(cv), gh));
    } else {
      auto* cm = reinterpret_cast<__m128i*>(static_cast<std::uint8_t*>(c.m) + i);
      auto* cv = reinterpret_cast<__m128i*>(static_cast<std::uint8_t*>(c.v) + i);
      const __m256i top = _mm256_srli_epi32(_mm256_castps_si256(g), 24);
      const __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(top), _mm256_extracti128_si256(top, 1));
      const __m128i gb = _mm_packus_epi16(w, w);
      _mm_storel_epi64(cm, _mm_add_epi8(_mm_loadl_epi64(cm), gb));
      _mm_storel_epi64(cv, _mm_add_epi8(_mm_loadl_epi64(cv), gb));
      if (i % kQ8Block == 0) {
        c.m_scale[i / kQ8Block] += 1.0f;
        c.v_scale[i / kQ8Block] += 1.0f;
      }
    }
    if constexpr (Out == 1)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                       _mm256_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    else if constexpr (Out == 2)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), to_bf16(p));
  }
  traffic_tail(c, n8);
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
void traffic_avx2(const UpdateChunk& c) {
  switch (c.grad_type) {
    case GradType::fp32: return traffic_for_grad<GradType::fp32>(c);
    case GradType::fp16: return traffic_for_grad<GradType::fp16>(c);
    case GradType::bf16: return traffic_for_grad<GradType::bf16>(c);
  }
}

template <GradType G>
SumSquares sum_sq(const void* g, std::size_t n) {
  __m256d acc4[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
  const std::size_t n16 = n & ~std::size_t{15};
  for (std::size_t i = 0; i < n16; i += 16) {
    const __m256 x0 = load_grad8<G>(g, i), x1 = load_grad8<G>(g, i + 8);
    const __m256d d[4] = {_mm256_cvtps_pd(_mm256_castps256_ps128(x0)), _mm256_cvtps_pd(_mm256_extractf128_ps(x0, 1)),
                          _mm256_cvtps_pd(_mm256_castps256_ps128(x1)), _mm256_cvtps_pd(_mm256_extractf128_ps(x1, 1))};
    for (int k = 0; k < 4; ++k) acc4[k] = _mm256_fmadd_pd(d[k], d[k], acc4[k]);
  }
  alignas(32) double acc[16];
  for (int k = 0; k < 4; ++k) _mm256_store_pd(acc + 4 * k, acc4[k]);
  sum_squares_scalar_range(g, G, n16, n, acc);
  const double sum = fold16(acc);
  return {sum, std::isfinite(sum)};
}

SumSquares sum_squares_avx2(const void* g, GradType t, std::size_t n) {
  switch (t) {
    case GradType::fp32: return sum_sq<GradType::fp32>(g, n);
    case GradType::fp16: return sum_sq<GradType::fp16>(g, n);
    case GradType::bf16: return sum_sq<GradType::bf16>(g, n);
  }
  return {};
}

void f32_f16(const float* s, std::uint16_t* d, std::size_t n) {
  const std::size_t n8 = n & ~std::size_t{7};
  for (std::size_t i = 0; i < n8; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (std::size_t i = n8; i < n; ++i) d[i] = fp32_to_fp16_reference(s[i]);
}
void f16_f32(const std::uint16_t* s, float* d, std::size_t n) {
  const std::size_t n8 = n & ~std::size_t{7};
  for (std::size_t i = 0; i < n8; i += 8) _mm256_storeu_ps(d + i, load_grad8<GradType::fp16>(s, i));
  for (std::size_t i = n8; i < n; ++i) d[i] = fp16_to_fp32_reference(s[i]);
}
void f32_bf16(const float* s, std::uint16_t* d, std::size_t n) {
  const std::size_t n8 = n & ~std::size_t{7};
  for (std::size_t i = 0; i < n8; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), to_bf16(_mm256_loadu_ps(s + i)));
  for (std::size_t i = n8; i < n; ++i) d[i] = fp32_to_bf16_reference(s[i]);
}
void bf16_f32(const std::uint16_t* s, float* d, std::size_t n) {
  const std::size_t n8 = n & ~std::size_t{7};
  for (std::size_t i = 0; i < n8; i += 8) _mm256_storeu_ps(d + i, load_grad8<GradType::bf16>(s, i));
  for (std::size_t i = n8; i < n; ++i) d[i] = bf16_to_fp32_reference(s[i]);
}

}  // namespace

const KernelTable& avx2_kernels() {
  static const KernelTable t{adam_avx2, sum_squares_avx2, f32_f16, f16_f32, f32_bf16, bf16_f32, traffic_avx2, q8_enc, q8_dec};
  return t;
}

}  // namespace zinf::cpu_adam::detail
