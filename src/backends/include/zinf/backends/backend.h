// zinf/backends/backend.h — one factory per kind of device. A backend makes everything a run needs on
// its device: the device itself (streams, events, memory), the model's ops on it, the offload
// engine's kernels on its memory, and the collectives over its memory for data-parallel runs. The
// CPU backend lives in src/backends/cpu/, the CUDA backend in src/backends/cuda/ (built only with CUDA);
// a run asks backend_for() once and never names a device type again.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "model/backend.h"
#include "zinf/backends/cpu.h"
#include "zinf/comm.h"
#include "zinf/cpu_adam/host_threads.h"
#include "zinf/device.h"
#include "zinf/offload/engine_kernels.h"
#include "zinf/types.h"

namespace zinf::backends {

struct DeviceSpec {
  int local_rank = 0;            // this process's rank on its node: which GPU it drives
  std::size_t budget_bytes = 0;  // device memory zinf may use; 0: the backend's default
  CpuDeviceOptions cpu;          // the CPU device's async mode and jitter (others ignore it)
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual DeviceType type() const = 0;
  // Budget 0: the GPU's free memory less a reserve for cuBLAS/NCCL (CUDA, zinf/device_memory.h), half of the available
  // host memory (CPU).
  virtual std::unique_ptr<Device> make_device(const DeviceSpec& spec) const = 0;
  // The model's ops on `dev` (a device of this backend), enqueued on its compute stream. `threads`
  // sizes the CPU reference's pool; `precision` picks the CUDA GEMMs' 16-bit inputs and, with
  // `kernels` fast, the dtype the model stores its activations and weights in (the CPU device's twin
  // of the CUDA fast path stores and rounds as the GPU does).
  // `attention` (device.attention) picks the CUDA fast kernels' attention: cuDNN's or the wmma
  // kernel (resolve_attention; cudnn in a build without cuDNN throws ConfigError). The CPU backend's
  // twin has one attention and ignores it.
  virtual std::unique_ptr<OpsBackend> make_ops(Device& dev, Precision precision, int threads, Kernels kernels,
                                               Attention attention = Attention::automatic) const = 0;
  virtual std::unique_ptr<offload::EngineKernels> make_engine_kernels(Device& dev,
                                                                      cpu_adam::HostThreads& pool) const = 0;
  // The collectives over this device's memory, bootstrapped through the host communicator; nullptr
  // when the host communicator can move device memory itself (the CPU device's memory is host memory).
  virtual std::unique_ptr<Comm> make_device_comm(Comm& host, int local_rank) const = 0;
};

// Whether this build has cuDNN (the CUDA fast kernels' attention: device.attention auto means cudnn).
bool cudnn_built();
// "x.y.z", the cuDNN this zinf runs with, or "built without" (zinf info).
std::string cudnn_version();

// The backend for a device type. Throws zinf::Error with a hint when this build does not have it.
const Backend& backend_for(DeviceType type);

}  // namespace zinf::backends
