// zinf/backends/cpu.h — the CPU backend's own pieces, for callers that build a CPU device directly
// (tests, `zinf bench comm`): the device, its options, and the engine's kernels on it. A run asks
// zinf/backends/backend.h's factory instead.
#pragma once

#include <cstddef>
#include <memory>

#include "zinf/cpu_adam/host_threads.h"
#include "zinf/device.h"
#include "zinf/jitter.h"
#include "zinf/offload/engine_kernels.h"

namespace zinf {

struct CpuDeviceOptions {
  bool async = false;  // the model's ops run as compute-stream work (see Device::ops_stream_ordered)
  JitterSpec jitter;   // seeded delays before every job on every stream; seed 0: none
};
// The options the environment asks for: ZINF_DEVICE_ASYNC=1, ZINF_JITTER_SEED=N (N > 0) and
// ZINF_JITTER_US=M override `base` where set (a malformed value is a zinf::Error naming it).
CpuDeviceOptions cpu_device_options_from_env(CpuDeviceOptions base);

// The CPU device with a memory budget in bytes.
std::unique_ptr<Device> make_cpu_device(std::size_t budget_bytes, const CpuDeviceOptions& opts = {});

// The engine's kernels on the CPU device: cpu_adam on the host pool `pool`, run in stream order on
// `dev`'s workers.
std::unique_ptr<offload::EngineKernels> make_cpu_engine_kernels(Device& dev, cpu_adam::HostThreads& pool);

}  // namespace zinf
