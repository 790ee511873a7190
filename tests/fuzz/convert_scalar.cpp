// convert_scalar.cpp — the bulk fp16/bf16 conversions the parsers call (reading and writing
// safetensors), in their scalar specification form. The fuzz build links this instead of
// zinf::cpu_adam: the SIMD dispatch there asks the CPU for features through a builtin that clang 14
// does not know, and which instructions convert a tensor is no concern of a parser's.
#include <cstddef>
#include <cstdint>

#include "zinf/cpu_adam/convert.h"
#include "zinf/cpu_adam/spec.h"

namespace zinf::cpu_adam {

void fp32_to_fp16(const float* s, std::uint16_t* d, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) d[i] = spec::fp32_to_fp16(s[i]);
}
void fp16_to_fp32(const std::uint16_t* s, float* d, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) d[i] = spec::fp16_to_fp32(s[i]);
}
void fp32_to_bf16(const float* s, std::uint16_t* d, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) d[i] = spec::fp32_to_bf16(s[i]);
}
void bf16_to_fp32(const std::uint16_t* s, float* d, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) d[i] = spec::bf16_to_fp32(s[i]);
}

}  // namespace zinf::cpu_adam
