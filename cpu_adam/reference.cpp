// reference.cpp — the scalar specification of every cpu_adam kernel (adam.h, convert.h).
// Compiled with -ffp-contract=off: each operation below is one IEEE rounding, fma only where written.
#include <cmath>
#include <cstring>

#include "kernels.h"
#include "zinf/cpu_adam/convert.h"
#include "zinf/error.h"

namespace zinf::cpu_adam {

namespace {
inline std::uint32_t bits_of(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
inline float float_of(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
}  // namespace

std::uint16_t fp32_to_fp16_reference(float x) {
  const std::uint32_t u = bits_of(x);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));  // NaN
  if (a >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);  // ≥ 65520 rounds to inf
  if (a < 0x38800000u) {  // below fp16's smallest normal (2^-14): subnormal or zero
    if (a <= 0x33000000u) return sign;  // ≤ 2^-25: ties to even give zero
    const std::uint32_t mant = (a & 0x7FFFFFu) | 0x800000u;
    const std::uint32_t shift = 126u - (a >> 23);  // value = mant · 2^(e−150), unit 2^-24
    std::uint32_t q = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<std::uint16_t>(sign | q);
  }
  std::uint32_t h = (a - 0x38000000u) >> 13;  // rebias 127 → 15
  const std::uint32_t rem = a & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry rolls into the exponent
  return static_cast<std::uint16_t>(sign | h);
}

float fp16_to_fp32_reference(std::uint16_t h) {
  const std::uint32_t sign = (static_cast<std::uint32_t>(h) & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
  if (e == 0x1F) return float_of(sign | 0x7F800000u | (mant << 13) | (mant ? 0x400000u : 0u));  // inf / quiet NaN
  if (e != 0) return float_of(sign | ((e + 112u) << 23) | (mant << 13));
  if (mant == 0) return float_of(sign);
  // subnormal: mant · 2^-24, exact in fp32
  float v = static_cast<float>(mant) * 0x1p-24f;
  return float_of(sign | bits_of(v));
}

std::uint16_t fp32_to_bf16_reference(float x) {
  const std::uint32_t u = bits_of(x);
  const std::uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);      // NaN, made quiet
  if (a < 0x00800000u) return static_cast<std::uint16_t>((u >> 16) & 0x8000u);    // subnormal → ±0
  return static_cast<std::uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);      // RNE; overflow → inf
}

float bf16_to_fp32_reference(std::uint16_t b) { return float_of(static_cast<std::uint32_t>(b) << 16); }

AdamStep make_adam_step(const AdamHyper& h, std::int64_t step, float grad_scale) {
  ZINF_CHECK(step >= 1);
  AdamStep s;
  s.beta1 = h.beta1;
  s.beta2 = h.beta2;
  s.one_minus_beta1 = static_cast<float>(1.0 - static_cast<double>(h.beta1));
  s.one_minus_beta2 = static_cast<float>(1.0 - static_cast<double>(h.beta2));
  s.eps = h.eps;
  const double t = static_cast<double>(step);
  const double bc1 = h.bias_correction ? 1.0 - std::pow(static_cast<double>(h.beta1), t) : 1.0;
  const double bc2 = h.bias_correction ? 1.0 - std::pow(static_cast<double>(h.beta2), t) : 1.0;
  s.step_size = static_cast<float>(-static_cast<double>(h.lr) / bc1);
  s.bc2_rsqrt = static_cast<float>(1.0 / std::sqrt(bc2));
  s.decoupled = h.decoupled;
  s.apply_decay = h.weight_decay > 0.0f;
  s.decay = h.decoupled ? static_cast<float>(1.0 - static_cast<double>(h.lr) * static_cast<double>(h.weight_decay))
                        : h.weight_decay;
  s.grad_scale = grad_scale;
  return s;
}

namespace detail {

inline float load_grad(const void* g, GradType t, std::size_t i) {
  switch (t) {
    case GradType::fp32: return static_cast<const float*>(g)[i];
    case GradType::fp16: return fp16_to_fp32_reference(static_cast<const std::uint16_t*>(g)[i]);
    case GradType::bf16: return bf16_to_fp32_reference(static_cast<const std::uint16_t*>(g)[i]);
  }
  return 0;
}

void adam_scalar_range(const AdamStep& s, const UpdateChunk& c, std::size_t begin, std::size_t end) {
  for (std::size_t i = begin; i < end; ++i) {
    float g = load_grad(c.grad, c.grad_type, i) * s.grad_scale;
    float p = c.master[i];
    if (s.apply_decay && !s.decoupled) g = std::fma(s.decay, p, g);
    const float m = std::fma(c.m[i], s.beta1, g * s.one_minus_beta1);
    const float v = std::fma(c.v[i], s.beta2, (g * g) * s.one_minus_beta2);
    const float denom = std::fma(std::sqrt(v), s.bc2_rsqrt, s.eps);
    const float u = m / denom;
    if (s.apply_decay && s.decoupled) p = p * s.decay;
    p = std::fma(s.step_size, u, p);
    c.master[i] = p;
    c.m[i] = m;
    c.v[i] = v;
    if (c.param16) {
      auto* out = static_cast<std::uint16_t*>(c.param16);
      out[i] = c.param16_type == HalfType::fp16 ? fp32_to_fp16_reference(p) : fp32_to_bf16_reference(p);
    }
  }
}

void sum_squares_scalar_range(const void* grad, GradType t, std::size_t begin, std::size_t end, double acc[16]) {
  for (std::size_t i = begin; i < end; ++i) {
    const double x = load_grad(grad, t, i);
    acc[i & 15] += x * x;  // x·x is exact in double (24-bit mantissas)
  }
}

double fold16(double acc[16]) {
  for (int w = 8; w >= 1; w /= 2)
    for (int j = 0; j < w; ++j) acc[j] += acc[j + w];
  return acc[0];
}

namespace {
void adam_scalar(const AdamStep& s, const UpdateChunk& c) { adam_scalar_range(s, c, 0, c.n); }
SumSquares sum_squares_scalar(const void* g, GradType t, std::size_t n) {
  double acc[16] = {};
  sum_squares_scalar_range(g, t, 0, n, acc);
  const double sum = fold16(acc);
  return {sum, std::isfinite(sum)};
}
void traffic_scalar(const UpdateChunk& c) {
  auto* out = static_cast<std::uint16_t*>(c.param16);
  for (std::size_t i = 0; i < c.n; ++i) {
    const float g = load_grad(c.grad, c.grad_type, i);
    const float p = c.master[i] + g;
    c.master[i] = p;
    c.m[i] = c.m[i] + g;
    c.v[i] = c.v[i] + g;
    if (out) out[i] = c.param16_type == HalfType::fp16 ? fp32_to_fp16_reference(p) : fp32_to_bf16_reference(p);
  }
}
void f32_f16(const float* s, std::uint16_t* d, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) d[i] = fp32_to_fp16_reference(s[i]);
}
void f16_f32(const std::uint16_t* s, float* d, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) d[i] = fp16_to_fp32_reference(s[i]);
}
void f32_bf16(const float* s, std::uint16_t* d, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) d[i] = fp32_to_bf16_reference(s[i]);
}
void bf16_f32(const std::uint16_t* s, float* d, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) d[i] = bf16_to_fp32_reference(s[i]);
}
}  // namespace

const KernelTable& scalar_kernels() {
  static const KernelTable t{adam_scalar, sum_squares_scalar, f32_f16, f16_f32, f32_bf16, bf16_f32, traffic_scalar};
  return t;
}

}  // namespace detail

void adam_update_reference(const AdamStep& s, const UpdateChunk& c) { detail::adam_scalar_range(s, c, 0, c.n); }

SumSquares sum_squares_reference(const void* grad, GradType t, std::size_t n) {
  return detail::scalar_kernels().sum_squares(grad, t, n);
}

}  // namespace zinf::cpu_adam
