// cuda_ops.h — the CUDA implementation of the model's OpsBackend (model/backend.h): one kernel file
// per op under cuda/ops/, GEMMs through cuBLASLt (gemm_plan.h), everything on the device's
// compute stream, no atomics (every reduction has one owner), so results are deterministic.
// Built with ZINF_CUDA; without it, make_cuda_ops throws.
#pragma once

#include <memory>

#include "model/backend.h"
#include "zinf/device.h"
#include "zinf/types.h"

namespace zinf::cuda {

// `dev` must be the CUDA device; the backend enqueues on dev's compute stream. GEMMs: fp32 for fp32
// runs; for fp16/bf16 runs tensor-core GEMMs that round their inputs to that 16-bit type and
// accumulate in fp32 (compute type 32F_FAST_16F / 32F_FAST_16BF) — the weights are already
// 16-bit values, so this is what a 16-bit run computes.
std::unique_ptr<OpsBackend> make_cuda_ops(Device& dev, Precision precision = Precision::fp32);

}  // namespace zinf::cuda
