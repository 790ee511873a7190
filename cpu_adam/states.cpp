// states.cpp — the stored formats of Adam's m and v (adam.h StateFormat): sizes, names, and the bulk
// conversions to and from fp32 (spec.h defines the encodings).
#include <cstring>

#include "zinf/cpu_adam/adam.h"
#include "zinf/cpu_adam/convert.h"
#include "zinf/cpu_adam/spec.h"

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

const char* state_format_name(StateFormat f) {
  switch (f) {
    case StateFormat::fp32: return "fp32";
    case StateFormat::bf16: return "bf16";
    case StateFormat::q8: return "8bit";
  }
  return "?";
}

void encode_states(StateFormat f, StateKind k, const float* src, void* dst, float* scales, std::size_t n) {
  switch (f) {
    case StateFormat::fp32:
      if (n && dst != src) std::memmove(dst, src, n * sizeof(float));
      return;
    case StateFormat::bf16: fp32_to_bf16(src, static_cast<std::uint16_t*>(dst), n); return;
    case StateFormat::q8: {
      auto* codes = static_cast<std::uint8_t*>(dst);
      for (std::size_t b = 0; b < n; b += kQ8Block) {
        const std::size_t len = n - b < kQ8Block ? n - b : kQ8Block;
        scales[b / kQ8Block] = spec::q8_encode_block(src + b, codes + b, len, k);
      }
      return;
    }
  }
}

void decode_states(StateFormat f, StateKind k, const void* src, const float* scales, float* dst, std::size_t n) {
  switch (f) {
    case StateFormat::fp32:
      if (n && dst != src) std::memmove(dst, src, n * sizeof(float));
      return;
    case StateFormat::bf16: bf16_to_fp32(static_cast<const std::uint16_t*>(src), dst, n); return;
    case StateFormat::q8: {
      const auto* codes = static_cast<const std::uint8_t*>(src);
      for (std::size_t i = 0; i < n; ++i) dst[i] = spec::q8_decode(codes[i], scales[i / kQ8Block], k);
      return;
    }
  }
}

}  // namespace zinf::cpu_adam
