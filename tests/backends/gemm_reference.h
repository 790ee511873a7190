// gemm_reference.h — what cuBLASLt computes for a GemmPlan (src/backends/cuda/gemm_plan.h), on the
// host: column-major (element (i, j) of a stored matrix with leading dimension ld at i + j·ld),
// operands read in their dtype and widened to fp32, fp32 sums in k order, each output element rounded
// once to its dtype, and the plan's epilogue. The CPU plan test runs the plans with it; the GPU test
// of the executor compares against it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cpu/ops_gpt.h"
#include "cuda/gemm_plan.h"
#include "zinf/cpu_adam/spec.h"

namespace zinf::cuda::gemm_ref {

inline float load(DType t, const void* p, std::size_t i) {
  switch (t) {
    case DType::fp32: return static_cast<const float*>(p)[i];
    case DType::fp16: return cpu_adam::spec::fp16_to_fp32(static_cast<const std::uint16_t*>(p)[i]);
    case DType::bf16: return cpu_adam::spec::bf16_to_fp32(static_cast<const std::uint16_t*>(p)[i]);
  }
  return 0;
}
inline void store(DType t, void* p, std::size_t i, float x) {
  switch (t) {
    case DType::fp32: static_cast<float*>(p)[i] = x; return;
    case DType::fp16: static_cast<std::uint16_t*>(p)[i] = cpu_adam::spec::fp32_to_fp16(x); return;
    case DType::bf16: static_cast<std::uint16_t*>(p)[i] = cpu_adam::spec::fp32_to_bf16(x); return;
  }
}

inline void run_column_major(const GemmCall& g) {
  const GemmPlan& p = g.plan;
  validate(p, g.ops);
  ops::ChunkPool one(1);
  for (int t = 0; t < p.batch; ++t) {
    const auto at = [t](long long stride, long long i) { return static_cast<std::size_t>(t * stride + i); };
    const auto a = [&](int i, int kk) {
      return load(
          p.a_type, g.ops.a,
          at(p.stride_a, p.ta ? kk + static_cast<long long>(i) * p.lda : i + static_cast<long long>(kk) * p.lda));
    };
    const auto b = [&](int kk, int j) {
      return load(
          p.b_type, g.ops.b,
          at(p.stride_b, p.tb ? j + static_cast<long long>(kk) * p.ldb : kk + static_cast<long long>(j) * p.ldb));
    };
    for (int j = 0; j < p.n; ++j)
      for (int i = 0; i < p.m; ++i) {
        float acc = 0;
        for (int kk = 0; kk < p.k; ++kk) acc += a(i, kk) * b(kk, j);
        const std::size_t ci = at(p.stride_c, i + static_cast<long long>(j) * p.ldc);
        float d = p.beta != 0.0f ? acc + p.beta * load(p.c_type, g.ops.c, ci) : acc;
        if ((p.epilogue == Epilogue::bias || p.epilogue == Epilogue::gelu_aux_bias) && g.ops.bias)
          d += load(p.bias_type, g.ops.bias, static_cast<std::size_t>(i));
        if (p.epilogue == Epilogue::gelu_aux_bias) {
          store(p.aux_type, g.ops.aux,
                at(static_cast<long long>(p.aux_ld) * p.n, i + static_cast<long long>(j) * p.aux_ld), d);
          float y = 0;
          ops::gelu_forward(one, &y, &d, 1);  // GELU of the fp32 pre-activation
          d = y;
        }
        store(p.c_type, g.ops.c, ci, d);
      }
    if (p.epilogue == Epilogue::bgrad)
      for (int i = 0; i < p.m; ++i) {
        float s = 0;
        for (int kk = 0; kk < p.k; ++kk) s += a(i, kk);
        static_cast<float*>(g.ops.bias_grad)[i] = s;
      }
  }
}

}  // namespace zinf::cuda::gemm_ref
