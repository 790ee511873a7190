// zinf/types.h — the shared vocabulary, at the bottom of every layer: where a state lives, the
// training precision, the device kind, with their names; and the busy-time record every layer reports
// in. Header-only; includes nothing of zinf.
#pragma once

#include <algorithm>
#include <string_view>

namespace zinf {

enum class OffloadDevice { none, cpu, nvme };
enum class Precision { fp32, fp16, bf16 };
enum class DeviceType { automatic, cpu, cuda };
enum class ModelFamily { gpt2, llama };
// The device's kernels: `reference` (fp32 storage, the oracle kernels) or `fast` (activations and
// weights stored in the run's precision; on CUDA the tensor-core kernels, on the CPU device the twin
// that stores and rounds exactly as they do).
enum class Kernels { reference, fast };

// One name table per enum (the names are the config's words); the switches look alike by nature.
constexpr std::string_view to_string(OffloadDevice d) {
  switch (d) {
    case OffloadDevice::none: return "none";
    case OffloadDevice::cpu: return "cpu";
    case OffloadDevice::nvme: return "nvme";
  }
  return "?";
}
constexpr std::string_view to_string(Precision p) {
  switch (p) {
    case Precision::fp32: return "fp32";
    case Precision::fp16: return "fp16";
    case Precision::bf16: return "bf16";
  }
  return "?";
}
constexpr std::string_view to_string(DeviceType d) {
  switch (d) {
    case DeviceType::automatic: return "auto";
    case DeviceType::cpu: return "cpu";
    case DeviceType::cuda: return "cuda";
  }
  return "?";
}

constexpr std::string_view to_string(Kernels k) { return k == Kernels::fast ? "fast" : "reference"; }
// The Kernels of a config word; false when `name` is neither.
constexpr bool parse_kernels(std::string_view name, Kernels& out) {
  if (name == "reference") return out = Kernels::reference, true;
  if (name == "fast") return out = Kernels::fast, true;
  return false;
}

constexpr std::string_view to_string(ModelFamily f) { return f == ModelFamily::gpt2 ? "gpt2" : "llama"; }

// Seconds spent on activation checkpoints in host memory (activation_checkpointing.cpu_checkpointing;
// Checkpoints::take_times in src/model/lm.h): the d2h and h2d copies as their streams ran them, and
// the time the model's compute stream (on the synchronous CPU device, the host running the ops)
// stood waiting for one — the part of the copies not hidden behind the compute.
struct CheckpointTimes {
  double d2h = 0, h2d = 0, wait = 0;
  CheckpointTimes& operator+=(const CheckpointTimes& o) {
    d2h += o.d2h, h2d += o.h2d, wait += o.wait;
    return *this;
  }
};

// Seconds each resource of a step was busy, measured where its work ran (see zinf/device.h and the
// offload engine): the device's compute, h2d and d2h streams, the host workers, NVMe reads and writes.
struct BusyTimes {
  double compute = 0, h2d = 0, d2h = 0, host = 0, nvme_read = 0, nvme_write = 0;

  double busiest() const { return std::max({compute, h2d, d2h, host, nvme_read, nvme_write}); }
  const char* busiest_name() const {
    const double b = busiest();
    if (b == compute) return "compute";
    if (b == host) return "host";
    if (b == nvme_read) return "nvme_read";
    if (b == nvme_write) return "nvme_write";
    if (b == h2d) return "h2d";
    return "d2h";
  }
  BusyTimes& operator+=(const BusyTimes& o) {
    compute += o.compute, h2d += o.h2d, d2h += o.d2h, host += o.host, nvme_read += o.nvme_read,
        nvme_write += o.nvme_write;
    return *this;
  }
  template <class F>
  void each(F f) const {  // f(name, seconds) for every resource, in a fixed order
    f("compute", compute), f("h2d", h2d), f("d2h", d2h), f("host", host), f("nvme_read", nvme_read),
        f("nvme_write", nvme_write);
  }
  BusyTimes per(double n) const {  // a sum over n steps as a per-step mean
    return {compute / n, h2d / n, d2h / n, host / n, nvme_read / n, nvme_write / n};
  }
};

}  // namespace zinf
