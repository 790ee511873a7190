// engine_kernels.h — the offload engine's DeviceKernels on the GPU (zinf/offload/device_kernels.h):
// zero, 16-bit conversions, accumulation, the norm's sum of squares in cpu_adam's exact order, and
// the fused Adam Update — all from zinf/cpu_adam/spec.h, so results equal the CPU's bit for bit.
#pragma once

#include <memory>

#include "zinf/offload/device_kernels.h"

namespace zinf::cuda {

std::unique_ptr<offload::DeviceKernels> make_engine_kernels(Device& dev);

}  // namespace zinf::cuda
