// engine_kernels.cpp — the offload engine's kernels (zinf/offload/engine_kernels.h) on the CPU device:
// cpu_adam on the host pool, run in stream order on the device's workers.
#include <cstring>

#include "zinf/backends/cpu.h"
#include "zinf/cpu_adam/convert.h"

namespace zinf {
namespace {

using offload::EngineKernels;

class CpuEngineKernels final : public EngineKernels {
 public:
  CpuEngineKernels(Device& d, cpu_adam::HostThreads& p) : dev_(d), pool_(p) {}
  void zero(void* p, std::size_t bytes, StreamRole s) override {
    dev_.launch(s, [=] { std::memset(p, 0, bytes); });
  }
  void to_half(const float* src, void* dst, std::size_t n, cpu_adam::HalfType t, StreamRole s) override {
    dev_.launch(s, [=, this] { cpu_adam::to_half(pool_, src, static_cast<std::uint16_t*>(dst), n, t); });
  }
  void from_half(const void* src, float* dst, std::size_t n, cpu_adam::HalfType t, StreamRole s) override {
    dev_.launch(s, [=, this] { cpu_adam::from_half(pool_, static_cast<const std::uint16_t*>(src), dst, n, t); });
  }
  void copy(void* dst, const void* src, std::size_t bytes, StreamRole s) override {
    dev_.launch(s, [=] { std::memcpy(dst, src, bytes); });
  }
  void add(float* acc, const float* x, std::size_t n, StreamRole s) override {
    dev_.launch(s, [=, this] {
      pool_.parallel_for(n, 1 << 16, [&](std::size_t b, std::size_t e) {
        for (std::size_t i = b; i < e; ++i) acc[i] += x[i];
      });
    });
  }
  std::vector<std::vector<double>> block_sums(const std::vector<NormInput>& in, StreamRole s) override {
    dev_.synchronize(s);
    std::vector<std::vector<double>> out;
    for (const auto& x : in) out.push_back(cpu_adam::sum_squares_parts(pool_, x.g, x.t, x.n));
    return out;
  }
  void adam_update(const cpu_adam::AdamStep& st, const cpu_adam::UpdateChunk& c, StreamRole s) override {
    dev_.launch(s, [st, c, this] { cpu_adam::adam_update(pool_, st, c); });
  }

 private:
  Device& dev_;
  cpu_adam::HostThreads& pool_;
};

}  // namespace

std::unique_ptr<EngineKernels> make_cpu_engine_kernels(Device& dev, cpu_adam::HostThreads& pool) {
  return std::make_unique<CpuEngineKernels>(dev, pool);
}

}  // namespace zinf
