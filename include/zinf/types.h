// zinf/types.h — the shared vocabulary, at the bottom of every layer: where a state lives, the
// training precision, the device kind, with their names; and the busy-time record every layer reports
// in. Header-only; includes nothing of zinf.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace zinf {

enum class OffloadDevice { none, cpu, nvme };
enum class Precision { fp32, fp16, bf16 };
enum class DeviceType { automatic, cpu, cuda };
enum class ModelFamily { gpt2, llama };
// The device's kernels: `reference` (fp32 storage, the oracle kernels) or `fast` (activations and
// weights stored in the run's precision; on CUDA the tensor-core kernels, on the CPU device the twin
// that stores and rounds exactly as they do).
enum class Kernels { reference, fast };
// The attention of the CUDA kernel sets (device.attention): `cudnn` (cuDNN's fused flash attention,
// the fast kernels' default where this zinf was built with cuDNN), `wmma` (the project's own flash
// kernel, cuda/ops/flash_attention.cu), `reference` (the reference kernels' attention); `automatic`
// is the kernel set's default (resolve_attention).
enum class Attention { automatic, cudnn, wmma, reference };

// The name of `v` in `names`, its enum's names in the order of its enumerators (which count from 0
// without gaps, as every enum given a name table here does); "?" for a value outside the table.
template <class E, std::size_t N>
constexpr const char* enum_name(E v, const char* const (&names)[N]) {
  const auto i = static_cast<std::size_t>(v);
  return i < N ? names[i] : "?";
}

// One name table per enum (the names are the config's words).
constexpr std::string_view to_string(OffloadDevice d) { return enum_name(d, {"none", "cpu", "nvme"}); }
constexpr std::string_view to_string(Precision p) { return enum_name(p, {"fp32", "fp16", "bf16"}); }
constexpr std::string_view to_string(DeviceType d) { return enum_name(d, {"auto", "cpu", "cuda"}); }

constexpr std::string_view to_string(Kernels k) { return k == Kernels::fast ? "fast" : "reference"; }

constexpr std::string_view to_string(Attention a) { return enum_name(a, {"auto", "cudnn", "wmma", "reference"}); }
// What `auto` means for a kernel set: the reference kernels' own attention, or under `fast` cuDNN's
// where this build has it and the wmma kernel otherwise. Other choices are kept as they are (the
// config refuses the ones that do not belong to the kernel set).
constexpr Attention resolve_attention(Attention a, Kernels k, bool have_cudnn) {
  if (a != Attention::automatic) return a;
  if (k == Kernels::reference) return Attention::reference;
  return have_cudnn ? Attention::cudnn : Attention::wmma;
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

// One disk's part of a step (zinf/nvme/disk.h): busy while any transfer to it was in flight — a read
// and a write at the same time count once —, reads alone, writes alone, and the bytes moved. Every
// store on the disk counts here (the optimizer states and the parameters in two folders on one drive
// are one disk).
struct DiskBusy {
  std::string name;  // the kernel's name of the whole disk: "nvme0n1", "vda"
  double busy = 0, read = 0, write = 0;
  double read_bytes = 0, write_bytes = 0;
};

// Seconds each resource of a step was busy, measured where its work ran (see zinf/device.h and the
// offload engine): the device's compute, h2d and d2h streams, the host workers, and each disk the
// NVMe tiers use. The busiest of them sets the pace of the step.
struct BusyTimes {
  double compute = 0, h2d = 0, d2h = 0, host = 0;
  std::vector<DiskBusy> disks;

  // The busiest resource's seconds and name ("compute", "host", "disk vda", "h2d", "d2h"); on a tie
  // the first in that order.
  double busiest() const {
    double b = std::max({compute, h2d, d2h, host});
    for (const auto& d : disks) b = std::max(b, d.busy);
    return b;
  }
  std::string busiest_name() const {
    const double b = busiest();
    if (b == compute) return "compute";
    if (b == host) return "host";
    for (const auto& d : disks)
      if (b == d.busy) return "disk " + d.name;
    if (b == h2d) return "h2d";
    return "d2h";
  }
  // Every disk together: the bytes read and written.
  double nvme_read_bytes() const { return sum(&DiskBusy::read_bytes); }
  double nvme_write_bytes() const { return sum(&DiskBusy::write_bytes); }

  BusyTimes& operator+=(const BusyTimes& o) {
    compute += o.compute, h2d += o.h2d, d2h += o.d2h, host += o.host;
    for (const auto& od : o.disks) {
      auto it = std::find_if(disks.begin(), disks.end(), [&](const DiskBusy& d) { return d.name == od.name; });
      if (it == disks.end()) it = disks.insert(disks.end(), DiskBusy{od.name});
      it->busy += od.busy, it->read += od.read, it->write += od.write;
      it->read_bytes += od.read_bytes, it->write_bytes += od.write_bytes;
    }
    return *this;
  }
  template <class F>
  void each(F f) const {  // f(name, seconds) for every resource, in a fixed order; disks as "disk <name>"
    f(std::string("compute"), compute), f(std::string("h2d"), h2d), f(std::string("d2h"), d2h),
        f(std::string("host"), host);
    for (const auto& d : disks) f("disk " + d.name, d.busy);
  }
  BusyTimes per(double n) const {  // a sum over n steps as a per-step mean
    BusyTimes r{compute / n, h2d / n, d2h / n, host / n, disks};
    for (auto& d : r.disks) d.busy /= n, d.read /= n, d.write /= n, d.read_bytes /= n, d.write_bytes /= n;
    return r;
  }

 private:
  double sum(double DiskBusy::*field) const {
    double s = 0;
    for (const auto& d : disks) s += d.*field;
    return s;
  }
};

}  // namespace zinf
