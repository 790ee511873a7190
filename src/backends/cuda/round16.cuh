// cuda/round16.cuh — the one fp32 → bf16 / fp16 rounding of the CUDA kernels that write 16-bit
// values (rows.cu's narrow, flash_attention.cu's from_f: every 16-bit output, and the P and dS tiles
// the tensor cores read). It is cpu_adam/spec.h's fp32_to_bf16 / fp32_to_fp16, bit for bit: the rule
// of cpu_adam's Update on every path, of the device Update (engine_kernels.cu) and of the CPU twin
// (cpu/twin_ops.cpp, cpu/ops_attention_tiled.cpp), so the GPU rounds where the twin rounds and to
// the same bits.
//
// The hardware conversion (cvt.rn.bf16.f32 / cvt.rn.f16.f32: round to nearest even, subnormals
// kept) is already that rule on every input but these, which take spec.h's own code: fp32
// subnormals for bf16 (the hardware keeps them as bf16 subnormals, spec.h flushes them to ±0 as
// AVX512-BF16's vcvtneps2bf16 does) and NaNs (NVIDIA's conversion gives one canonical NaN, 0x7FFF in
// its host code, whatever the sign and payload; spec.h keeps the sign and the top payload bits, quiet
// bit set). So the cost is one compare and a select per element.
//
// tests/cpu_adam/bf16_rule_test.cpp checks both functions against spec.h, compiled by g++ with
// NVIDIA's host code for the conversions (the code the CUDA executor runs too): round_bf16 over all
// 2^32 fp32 inputs, round_fp16 over every exponent where fp16's rounding changes form;
// tests/backends/cuda_rows_test.cpp checks the GPU's own instructions at the edges.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "zinf/cpu_adam/spec.h"

namespace zinf::cuda {

ZINF_HD inline __nv_bfloat16 round_bf16(float x) {
  namespace spec = ::zinf::cpu_adam::spec;
  const std::uint32_t a = spec::bits_of(x) & 0x7FFFFFFFu;
  // |x| < 2^-126 (a zero or a subnormal) or a NaN: a − 2^23 wraps around below, passes 0x7F000000 above.
  if (a - 0x00800000u > 0x7F000000u) {
    __nv_bfloat16_raw r;
    r.x = spec::fp32_to_bf16(x);
    return __nv_bfloat16(r);
  }
  return __float2bfloat16_rn(x);
}

ZINF_HD inline __half round_fp16(float x) {
  namespace spec = ::zinf::cpu_adam::spec;
  if ((spec::bits_of(x) & 0x7FFFFFFFu) > 0x7F800000u) {  // NaN
    __half_raw r;
    r.x = spec::fp32_to_fp16(x);
    return __half(r);
  }
  return __float2half_rn(x);
}

}  // namespace zinf::cuda
