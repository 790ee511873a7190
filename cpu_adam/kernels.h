// kernels.h — the per-instruction-set kernel tables (internal to zinf_cpu_adam).
// Each table lives in its own translation unit compiled with that ISA's flags (CMakeLists.txt);
// dispatch.cpp picks one at run time. Tails shorter than a vector run the scalar reference code,
// which is bit-identical by construction (see adam.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "zinf/cpu_adam/adam.h"

namespace zinf::cpu_adam::detail {

struct KernelTable {
  void (*adam)(const AdamStep&, const UpdateChunk&);
  SumSquares (*sum_squares)(const void*, GradType, std::size_t);
  void (*fp32_to_fp16)(const float*, std::uint16_t*, std::size_t);
  void (*fp16_to_fp32)(const std::uint16_t*, float*, std::size_t);
  void (*fp32_to_bf16)(const float*, std::uint16_t*, std::size_t);
  void (*bf16_to_fp32)(const std::uint16_t*, float*, std::size_t);
  void (*traffic)(const UpdateChunk&);  // benchmark limit: Adam's loads and stores, trivial math
};

const KernelTable& scalar_kernels();
const KernelTable& avx2_kernels();
const KernelTable& avx512_kernels();

// Scalar pieces shared by the vector paths' tails (defined in reference.cpp).
void adam_scalar_range(const AdamStep& s, const UpdateChunk& c, std::size_t begin, std::size_t end);
// Adds x_i² of [begin, end) into acc[i mod 16] (i counted from the start of the range).
void sum_squares_scalar_range(const void* grad, GradType t, std::size_t begin, std::size_t end, double acc[16]);
double fold16(double acc[16]);

}  // namespace zinf::cpu_adam::detail
