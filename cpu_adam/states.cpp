// states.cpp — the stored formats of Adam's m and v (adam.h StateFormat): sizes, names, and the bulk
// conversions to and from fp32 (spec.h defines the encodings).
#include <cstring>

#include "kernels.h"
#include "zinf/cpu_adam/adam.h"
#include "zinf/cpu_adam/convert.h"

namespace zinf::cpu_adam {

std::size_t state_elem_bytes(StateFormat f) {
  switch (f) {
    case StateFormat::fp32: return 4;
    case StateFormat::bf16: return 2;
    case StateFormat::q8: return 1;
  }
  return 4;
}

std::size_t state_scales(StateFormat f, std::size_t n) {
  return f == StateFormat::q8 ? (n + kQ8Block - 1) / kQ8Block : 0;
}

void encode_states(StateFormat f, StateKind k, const float* src, void* dst, float* scales, std::size_t n) {
  encode_states(f, k, src, dst, scales, n, active_simd());
}
void decode_states(StateFormat f, StateKind k, const void* src, const float* scales, float* dst, std::size_t n) {
  decode_states(f, k, src, scales, dst, n, active_simd());
}

void encode_states(StateFormat f, StateKind k, const float* src, void* dst, float* scales, std::size_t n,
                   SimdLevel level) {
  switch (f) {
    case StateFormat::fp32:
      if (n && dst != src) std::memmove(dst, src, n * sizeof(float));
      return;
    case StateFormat::bf16: fp32_to_bf16(src, static_cast<std::uint16_t*>(dst), n, level); return;
    case StateFormat::q8:
      detail::kernels_for(level).q8_encode(k, src, static_cast<std::uint8_t*>(dst), scales, n);
      return;
  }
}

void decode_states(StateFormat f, StateKind k, const void* src, const float* scales, float* dst, std::size_t n,
                   SimdLevel level) {
  switch (f) {
    case StateFormat::fp32:
      if (n && dst != src) std::memmove(dst, src, n * sizeof(float));
      return;
    case StateFormat::bf16: bf16_to_fp32(static_cast<const std::uint16_t*>(src), dst, n, level); return;
    case StateFormat::q8:
      detail::kernels_for(level).q8_decode(k, static_cast<const std::uint8_t*>(src), scales, dst, n);
      return;
  }
}

}  // namespace zinf::cpu_adam
