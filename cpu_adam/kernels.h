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
  // q8 states in bulk (blocks counted from the start; scales: one per block)
  void (*q8_encode)(StateKind, const float*, std::uint8_t*, float*, std::size_t);
  void (*q8_decode)(StateKind, const std::uint8_t*, const float*, float*, std::size_t);
};

// The table of `level`, clamped to what the CPU has.
const KernelTable& kernels_for(SimdLevel level);

const KernelTable& scalar_kernels();
const KernelTable& avx2_kernels();
const KernelTable& avx512_kernels();

// Scalar pieces shared by the vector paths' tails (defined in reference.cpp).
// For q8 states, begin is a multiple of kQ8Block and end one too or c.n (whole blocks only).
void adam_scalar_range(const AdamStep& s, const UpdateChunk& c, std::size_t begin, std::size_t end);
// Adds x_i² of [begin, end) into acc[i mod 16] (i counted from the start of the range).
void sum_squares_scalar_range(const void* grad, GradType t, std::size_t begin, std::size_t end, double acc[16]);
double fold16(double acc[16]);
// The memory-traffic kernel's scalar form on elements [from, n) of c (the vector paths' tails).
void traffic_tail(const UpdateChunk& c, std::size_t from);
// Elements [begin, n) of a q8 bulk encode / decode in the scalar specification; begin is a multiple
// of kQ8Block (blocks are counted from element 0).
void q8_encode_scalar_range(StateKind k, const float* src, std::uint8_t* dst, float* scales, std::size_t begin,
                            std::size_t n);
void q8_decode_scalar_range(StateKind k, const std::uint8_t* src, const float* scales, float* dst, std::size_t begin,
                            std::size_t n);

// A q8 block of exponent E (top < E < 255) for the vector paths: the fp32 bits of 2^(E−129−top), the
// spacing of its codes below the normal range (a subnormal for the two smallest E), and of the inverse
// 2^(129+top−E) (finite for E > top + 1 only).
inline std::uint32_t q8_small_step_bits(std::uint32_t E, std::uint32_t top) {
  const int ex = static_cast<int>(E) - 2 - static_cast<int>(top);  // its biased exponent, ≥ −1
  return ex >= 1 ? static_cast<std::uint32_t>(ex) << 23 : 1u << (22 + ex);
}
inline std::uint32_t q8_small_inverse_bits(std::uint32_t E, std::uint32_t top) { return (256u + top - E) << 23; }

}  // namespace zinf::cpu_adam::detail
