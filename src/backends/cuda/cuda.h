// cuda.h — the CUDA backend's pieces (src/backends/cuda/), for its factory (backend.cpp) and for the
// tests that drive one piece on a GPU. Plain C++: no CUDA types.
#pragma once

#include <cstddef>
#include <memory>

#include "zinf/backends/backend.h"
#include "zinf/comm.h"
#include "zinf/device.h"
#include "zinf/offload/engine_kernels.h"

namespace zinf::cuda {

// The CUDA device `index` with a memory budget (0: the GPU's free memory less cuda_budget_reserve). Throws zinf::Error
// when no GPU is visible. `launch` enqueues host code in stream order (cudaLaunchHostFunc: it must not call CUDA);
// kernels go on the streams through the op backends.
std::unique_ptr<Device> make_cuda_device(int index, std::size_t budget_bytes);

// The engine's kernels on the GPU: zero, 16-bit conversions, accumulation, the norm's sum of squares
// in cpu_adam's exact order, and the fused Adam Update — all from zinf/cpu_adam/spec.h, so results
// equal the CPU's bit for bit.
std::unique_ptr<offload::EngineKernels> make_cuda_engine_kernels(Device& dev);

// The communicator for CUDA device memory: NCCL over the ranks of `host` (bootstrapped through it);
// throws when no GPU is visible, and (ConfigError) in a build without NCCL (backends.cpp).
std::unique_ptr<Comm> make_nccl_comm(Comm& host, int cuda_device);

const backends::Backend& cuda_backend();

}  // namespace zinf::cuda
