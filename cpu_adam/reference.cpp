// reference.cpp — the scalar specification of every cpu_adam kernel (adam.h, convert.h).
// Compiled with -ffp-contract=off: each operation below is one IEEE rounding, fma only where written.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels.h"
#include "zinf/cpu_adam/convert.h"
#include "zinf/cpu_adam/spec.h"
#include "zinf/error.h"

namespace zinf::cpu_adam {

std::uint16_t fp32_to_fp16_reference(float x) { return spec::fp32_to_fp16(x); }
float fp16_to_fp32_reference(std::uint16_t h) { return spec::fp16_to_fp32(h); }
std::uint16_t fp32_to_bf16_reference(float x) { return spec::fp32_to_bf16(x); }
float bf16_to_fp32_reference(std::uint16_t b) { return spec::bf16_to_fp32(b); }

// beta^step by repeated squaring: + and × only, so the bias corrections (and with them every Update)
// are the same bits on every CPU. glibc's pow picks an FMA or a plain variant by the CPU it runs on,
// and the two can differ in the last bit.
static double power_by_squaring(double base, std::int64_t exponent) {
  double result = 1.0;
  while (exponent > 0) {
    if (exponent & 1) result *= base;
    base *= base;
    exponent >>= 1;
  }
  return result;
}

AdamStep make_adam_step(const AdamHyper& h, std::int64_t step, float grad_scale) {
  ZINF_CHECK(step >= 1);
  AdamStep s;
  s.beta1 = h.beta1;
  s.beta2 = h.beta2;
  s.one_minus_beta1 = static_cast<float>(1.0 - static_cast<double>(h.beta1));
  s.one_minus_beta2 = static_cast<float>(1.0 - static_cast<double>(h.beta2));
  s.eps = h.eps;
  const double bc1 = h.bias_correction ? 1.0 - power_by_squaring(static_cast<double>(h.beta1), step) : 1.0;
  const double bc2 = h.bias_correction ? 1.0 - power_by_squaring(static_cast<double>(h.beta2), step) : 1.0;
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

inline void store_param16(const UpdateChunk& c, std::size_t i, float p) {
  if (!c.param16) return;
  auto* out = static_cast<std::uint16_t*>(c.param16);
  out[i] = c.param16_type == HalfType::fp16 ? fp32_to_fp16_reference(p) : fp32_to_bf16_reference(p);
}

// One q8 block [b, b + len): decode m and v, the fp32 step element by element, encode.
void adam_q8_block(const AdamStep& s, const UpdateChunk& c, std::size_t b, std::size_t len) {
  float m[kQ8Block], v[kQ8Block];
  auto* mc = static_cast<std::uint8_t*>(c.m) + b;
  auto* vc = static_cast<std::uint8_t*>(c.v) + b;
  float& ms = c.m_scale[b / kQ8Block];
  float& vs = c.v_scale[b / kQ8Block];
  for (std::size_t i = 0; i < len; ++i) {
    m[i] = spec::q8_decode(mc[i], ms, StateKind::m);
    v[i] = spec::q8_decode(vc[i], vs, StateKind::v);
  }
  for (std::size_t i = 0; i < len; ++i) {
    float p = c.master[b + i];
    spec::adam_element(s, load_grad(c.grad, c.grad_type, b + i), p, m[i], v[i]);
    c.master[b + i] = p;
    store_param16(c, b + i, p);
  }
  ms = spec::q8_encode_block(m, mc, len, StateKind::m);
  vs = spec::q8_encode_block(v, vc, len, StateKind::v);
}

void adam_scalar_range(const AdamStep& s, const UpdateChunk& c, std::size_t begin, std::size_t end) {
  switch (c.states) {
    case StateFormat::fp32: {
      auto* ms = static_cast<float*>(c.m);
      auto* vs = static_cast<float*>(c.v);
      for (std::size_t i = begin; i < end; ++i) {
        float p = c.master[i], m = ms[i], v = vs[i];
        spec::adam_element(s, load_grad(c.grad, c.grad_type, i), p, m, v);
        c.master[i] = p;
        ms[i] = m;
        vs[i] = v;
        store_param16(c, i, p);
      }
      return;
    }
    case StateFormat::bf16: {
      auto* ms = static_cast<std::uint16_t*>(c.m);
      auto* vs = static_cast<std::uint16_t*>(c.v);
      for (std::size_t i = begin; i < end; ++i) {
        float p = c.master[i], m = spec::bf16_to_fp32(ms[i]), v = spec::bf16_to_fp32(vs[i]);
        spec::adam_element(s, load_grad(c.grad, c.grad_type, i), p, m, v);
        c.master[i] = p;
        ms[i] = spec::fp32_to_bf16(m);
        vs[i] = spec::fp32_to_bf16(v);
        store_param16(c, i, p);
      }
      return;
    }
    case StateFormat::q8:
      ZINF_CHECK(begin % kQ8Block == 0 && (end % kQ8Block == 0 || end == c.n));
      for (std::size_t b = begin; b < end; b += kQ8Block) adam_q8_block(s, c, b, std::min(kQ8Block, end - b));
      return;
  }
}

void sum_squares_scalar_range(const void* grad, GradType t, std::size_t begin, std::size_t end, double acc[16]) {
  for (std::size_t i = begin; i < end; ++i) {
    const double x = load_grad(grad, t, i);
    acc[i & 15] += x * x;  // x·x is exact in double (24-bit mantissas)
  }
}

double fold16(double acc[16]) { return spec::fold16(acc); }

void traffic_tail(const UpdateChunk& c, std::size_t from) {
  if (from >= c.n) return;
  UpdateChunk t = c;
  const std::size_t esz = state_elem_bytes(c.states);
  t.n = c.n - from;
  t.grad = static_cast<const char*>(c.grad) + from * (c.grad_type == GradType::fp32 ? 4 : 2);
  t.master = c.master + from;
  t.m = static_cast<char*>(c.m) + from * esz;
  t.v = static_cast<char*>(c.v) + from * esz;
  if (c.states == StateFormat::q8) {
    t.m_scale = c.m_scale + from / kQ8Block;
    t.v_scale = c.v_scale + from / kQ8Block;
  }
  if (c.param16) t.param16 = static_cast<std::uint16_t*>(c.param16) + from;
  scalar_kernels().traffic(t);
}

void q8_encode_scalar_range(StateKind k, const float* src, std::uint8_t* dst, float* scales, std::size_t begin,
                            std::size_t n) {
  for (std::size_t b = begin; b < n; b += kQ8Block)
    scales[b / kQ8Block] = spec::q8_encode_block(src + b, dst + b, std::min(kQ8Block, n - b), k);
}
void q8_decode_scalar_range(StateKind k, const std::uint8_t* src, const float* scales, float* dst, std::size_t begin,
                            std::size_t n) {
  for (std::size_t i = begin; i < n; ++i) dst[i] = spec::q8_decode(src[i], scales[i / kQ8Block], k);
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
    switch (c.states) {
      case StateFormat::fp32:
        static_cast<float*>(c.m)[i] += g;
        static_cast<float*>(c.v)[i] += g;
        break;
      case StateFormat::bf16: {
        const auto gb = static_cast<std::uint16_t>(spec::bits_of(g) >> 16);
        static_cast<std::uint16_t*>(c.m)[i] += gb;
        static_cast<std::uint16_t*>(c.v)[i] += gb;
        break;
      }
      case StateFormat::q8: {
        const auto gb = static_cast<std::uint8_t>(spec::bits_of(g) >> 24);
        static_cast<std::uint8_t*>(c.m)[i] += gb;
        static_cast<std::uint8_t*>(c.v)[i] += gb;
        if (i % kQ8Block == 0) {
          c.m_scale[i / kQ8Block] += g;
          c.v_scale[i / kQ8Block] += g;
        }
        break;
      }
    }
    if (out) out[i] = c.param16_type == HalfType::fp16 ? fp32_to_fp16_reference(p) : fp32_to_bf16_reference(p);
  }
}
void f32_f16(const float* s, std::uint16_t* d, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) d[i] = fp32_to_fp16_reference(s[i]);
}
void q8_enc(StateKind k, const float* s, std::uint8_t* d, float* scales, std::size_t n) {
  q8_encode_scalar_range(k, s, d, scales, 0, n);
}
void q8_dec(StateKind k, const std::uint8_t* s, const float* scales, float* d, std::size_t n) {
  q8_decode_scalar_range(k, s, scales, d, 0, n);
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
  static const KernelTable t{adam_scalar, sum_squares_scalar, f32_f16, f16_f32, f32_bf16, bf16_f32, traffic_scalar, q8_enc, q8_dec};
  return t;
}

}  // namespace detail

void adam_update_reference(const AdamStep& s, const UpdateChunk& c) { detail::adam_scalar_range(s, c, 0, c.n); }

SumSquares sum_squares_reference(const void* grad, GradType t, std::size_t n) {
  return detail::scalar_kernels().sum_squares(grad, t, n);
}

}  // namespace zinf::cpu_adam
