// backend.cpp — the CUDA backend's factory: the CUDA device, the kernels of cuda_ops.cu, the engine's
// kernels of engine_kernels.cu and NCCL for device memory.
#include "cuda/cuda.h"
#include "cuda/cuda_ops.h"
#include "cuda/fast_ops.h"

namespace zinf::cuda {
namespace {

class CudaBackend final : public backends::Backend {
 public:
  DeviceType type() const override { return DeviceType::cuda; }
  std::unique_ptr<Device> make_device(const backends::DeviceSpec& spec) const override {
    return make_cuda_device(spec.local_rank, spec.budget_bytes);
  }
  std::unique_ptr<OpsBackend> make_ops(Device& dev, Precision precision, int, Kernels kernels,
                                       Attention attention) const override {
    if (kernels == Kernels::fast)
      return make_cuda_fast_ops(dev, precision, resolve_attention(attention, kernels, backends::cudnn_built()));
    return make_cuda_ops(dev, precision);
  }
  std::unique_ptr<offload::EngineKernels> make_engine_kernels(Device& dev, cpu_adam::HostThreads&) const override {
    return make_cuda_engine_kernels(dev);
  }
  std::unique_ptr<Comm> make_device_comm(Comm& host, int local_rank) const override {
    return make_nccl_comm(host, local_rank);
  }
};

}  // namespace

const backends::Backend& cuda_backend() {
  static const CudaBackend backend;
  return backend;
}

}  // namespace zinf::cuda
