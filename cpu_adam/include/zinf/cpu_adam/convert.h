// zinf/cpu_adam/convert.h — fp32 ⇄ fp16 / bf16, scalar reference and vectorized bulk forms.
//
// fp32 → fp16: IEEE round-to-nearest-even; overflow (|x| ≥ 65520) gives ±inf; fp16 subnormals are
//   produced exactly; NaN stays NaN (quiet bit set, top payload bits kept) — what F16C's vcvtps2ph does.
// fp32 → bf16: round-to-nearest-even on the upper half; NaN stays NaN (quiet bit set); fp32
//   subnormal inputs (|x| < 2^-126) become signed zero — what AVX512-BF16's vcvtneps2bf16 does, so
//   every path (that instruction, the integer emulation, the scalar reference) agrees bit for bit,
//   and so do the CUDA kernels' conversions (cuda/round16.cuh; see spec.h).
// fp16/bf16 → fp32: exact (fp16 signalling NaNs come back quiet, as F16C does).
//
// Bulk functions run on active_simd() unless given a level; pointers need no alignment; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zinf/cpu_adam/simd.h"

namespace zinf::cpu_adam {

std::uint16_t fp32_to_fp16_reference(float x);
float fp16_to_fp32_reference(std::uint16_t h);
std::uint16_t fp32_to_bf16_reference(float x);
float bf16_to_fp32_reference(std::uint16_t b);

void fp32_to_fp16(const float* src, std::uint16_t* dst, std::size_t n, SimdLevel level);
void fp16_to_fp32(const std::uint16_t* src, float* dst, std::size_t n, SimdLevel level);
void fp32_to_bf16(const float* src, std::uint16_t* dst, std::size_t n, SimdLevel level);
void bf16_to_fp32(const std::uint16_t* src, float* dst, std::size_t n, SimdLevel level);

void fp32_to_fp16(const float* src, std::uint16_t* dst, std::size_t n);
void fp16_to_fp32(const std::uint16_t* src, float* dst, std::size_t n);
void fp32_to_bf16(const float* src, std::uint16_t* dst, std::size_t n);
void bf16_to_fp32(const std::uint16_t* src, float* dst, std::size_t n);

}  // namespace zinf::cpu_adam
