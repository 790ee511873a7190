// backend.cpp — the CPU backend's factory: the CPU device, the reference ops (run as compute-stream
// work in the device's async mode, so the host runs ahead of the math as it does on a GPU), the
// engine's cpu_adam kernels, and no device collectives (the host communicator moves host memory).
#include "cpu/cpu.h"
#include "cpu/cpu_ops.h"
#include "cpu/ops_stream.h"
#include "cpu/twin_ops.h"
#include "zinf/backends/sysinfo.h"

namespace zinf::cpu {
namespace {

// The reference ops with the thread pool they run on.
class PooledCpuOps final : public CpuOps {
 public:
  explicit PooledCpuOps(std::unique_ptr<ops::ChunkPool> pool) : CpuOps(*pool), owned_pool_(std::move(pool)) {}

 private:
  std::unique_ptr<ops::ChunkPool> owned_pool_;
};

class CpuBackend final : public backends::Backend {
 public:
  DeviceType type() const override { return DeviceType::cpu; }
  std::unique_ptr<Device> make_device(const backends::DeviceSpec& spec) const override {
    const std::size_t budget = spec.budget_bytes ? spec.budget_bytes : available_host_memory() / 2;
    return make_cpu_device(budget, spec.cpu);
  }
  std::unique_ptr<OpsBackend> make_ops(Device& dev, Precision precision, int threads, Kernels kernels, Attention) const override {
    std::unique_ptr<OpsBackend> ops =
        kernels == Kernels::fast
            ? make_twin_ops(precision, threads)
            : std::unique_ptr<OpsBackend>(std::make_unique<PooledCpuOps>(std::make_unique<ops::ChunkPool>(threads)));
    return dev.ops_stream_ordered() ? make_stream_ops(dev, std::move(ops)) : std::move(ops);
  }
  std::unique_ptr<offload::EngineKernels> make_engine_kernels(Device& dev, cpu_adam::HostThreads& pool) const override {
    return make_cpu_engine_kernels(dev, pool);
  }
  std::unique_ptr<Comm> make_device_comm(Comm&, int) const override { return nullptr; }
};

}  // namespace

const backends::Backend& cpu_backend() {
  static const CpuBackend backend;
  return backend;
}

}  // namespace zinf::cpu
