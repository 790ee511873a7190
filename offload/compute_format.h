// compute_format.h — the compute copy's number format (internal to zinf_offload), chosen once from
// the precision (resolve.cpp: make_compute_format): 16 bits in mixed runs (fp16 or bf16), fp32
// otherwise. The host's conversions between it and fp32, the GradOut of a gradient bucket in it and
// the Update's 16-bit output go through it, so no stage asks which precision it runs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

#include "zinf/cpu_adam/convert.h"
#include "zinf/cpu_adam/host_threads.h"
#include "zinf/device.h"
#include "zinf/offload/buffer_specs.h"
#include "zinf/offload/engine_kernels.h"

namespace zinf::offload::detail {

// acc += x elementwise, on the host threads (chunked, so the result does not depend on the count).
inline void add_fp32(cpu_adam::HostThreads& threads, float* acc, const float* x, std::size_t n) {
  threads.parallel_for(n, 1 << 16, [&](std::size_t b, std::size_t e) {
    for (std::size_t i = b; i < e; ++i) acc[i] += x[i];
  });
}

class ComputeFormat {
 public:
  virtual ~ComputeFormat() = default;
  // n fp32 values into the compute format, on the host.
  virtual void from_fp32(const float* s, void* d, std::size_t n) const = 0;
  // n values of the compute format as fp32 into `d`, or added into `acc`, on the host.
  virtual void to_fp32(const void* s, float* d, std::size_t n) const = 0;
  virtual void add_to(const void* s, float* acc, std::size_t n) const = 0;
  // GradOut of n fp32 gradient elements `g` (device) into `land` (host), on stream r: rounded into
  // the device buffer `stage` first in 16 bits (d2h writes, d2h reads: stream order), or straight.
  virtual void grad_out(Device& dev, EngineKernels& kern, const float* g, void* stage, void* land, std::size_t n,
                        StreamRole r) const = 0;
  // The Update's 16-bit output (cpu_adam::UpdateChunk::param16): `out`, or null in fp32 runs (whose
  // compute copy is the new master, copied by the Updater).
  virtual void* update_half(void* out) const = 0;
  virtual const char* param_name() const = 0;  // the compute copy's buffer name: " param16" or " param"
};

class HalfFormat final : public ComputeFormat {
 public:
  HalfFormat(cpu_adam::HostThreads& threads, cpu_adam::HalfType half) : threads_(threads), half_(half) {}
  void from_fp32(const float* s, void* d, std::size_t n) const override {
    cpu_adam::to_half(threads_, s, static_cast<std::uint16_t*>(d), n, half_);
  }
  void to_fp32(const void* s, float* d, std::size_t n) const override {
    cpu_adam::from_half(threads_, static_cast<const std::uint16_t*>(s), d, n, half_);
  }
  void add_to(const void* s, float* acc, std::size_t n) const override {
    cpu_adam::accumulate_half(threads_, static_cast<const std::uint16_t*>(s), acc, n, half_);
  }
  void grad_out(Device& dev, EngineKernels& kern, const float* g, void* stage, void* land, std::size_t n,
                StreamRole r) const override {
    kern.to_half(g, stage, n, half_, r);
    dev.copy_to_host(land, stage, n * 2, r);
  }
  void* update_half(void* out) const override { return out; }
  const char* param_name() const override { return " param16"; }

 private:
  cpu_adam::HostThreads& threads_;
  const cpu_adam::HalfType half_;
};

class Fp32Format final : public ComputeFormat {
 public:
  explicit Fp32Format(cpu_adam::HostThreads& threads) : threads_(threads) {}
  void from_fp32(const float* s, void* d, std::size_t n) const override { std::memcpy(d, s, n * 4); }
  void to_fp32(const void* s, float* d, std::size_t n) const override { std::memcpy(d, s, n * 4); }
  void add_to(const void* s, float* acc, std::size_t n) const override {
    add_fp32(threads_, acc, static_cast<const float*>(s), n);
  }
  void grad_out(Device& dev, EngineKernels&, const float* g, void*, void* land, std::size_t n,
                StreamRole r) const override {
    dev.copy_to_host(land, g, n * 4, r);
  }
  void* update_half(void*) const override { return nullptr; }
  const char* param_name() const override { return " param"; }

 private:
  cpu_adam::HostThreads& threads_;
};

// The format of the layout's compute copy.
std::unique_ptr<const ComputeFormat> make_compute_format(const Layout& layout, cpu_adam::HostThreads& threads,
                                                         cpu_adam::HalfType half);

}  // namespace zinf::offload::detail
