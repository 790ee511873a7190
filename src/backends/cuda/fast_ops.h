// fast_ops.h — the CUDA backend's fast kernels (device.kernels fast): every op of the model's list on
// views of the run's precision, with fp32 weight gradients and fp32 accumulation.
#pragma once

#include <memory>

#include "model/backend.h"
#include "zinf/device.h"
#include "zinf/types.h"

namespace zinf::cuda {

// `dev` must be the CUDA device; the ops enqueue on its compute stream.
std::unique_ptr<OpsBackend> make_cuda_fast_ops(Device& dev, Precision precision);

}  // namespace zinf::cuda
