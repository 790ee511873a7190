// cuda_ops.h — the CUDA implementation of the model's OpsBackend (model/backend.h): one kernel file
// per op under cuda/ops/, GEMMs through cuBLAS in fp32 (TF32 off), everything on the device's
// compute stream, no atomics (every reduction has one owner), so results are deterministic.
// Built with ZINF_CUDA; without it, make_cuda_ops throws.
#pragma once

#include <memory>

#include "model/backend.h"
#include "zinf/device.h"

namespace zinf::cuda {

// `dev` must be the CUDA device; the backend enqueues on dev's compute stream.
std::unique_ptr<OpsBackend> make_cuda_ops(Device& dev);

}  // namespace zinf::cuda
