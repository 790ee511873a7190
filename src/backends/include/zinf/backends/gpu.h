// zinf/backends/gpu.h — what zinf can learn about the machine's GPUs, and `zinf bench pcie`: plain
// types only, so callers need no CUDA headers. The CUDA backend (src/backends/cuda/) implements them; a
// build without CUDA answers "built without CUDA" from src/backends/backends.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "zinf/backends/sysinfo.h"

namespace zinf::cuda {

struct GpuQuery {
  bool built = false;  // this binary has the CUDA device
  std::string status;  // one line for `zinf info`
  std::vector<GpuInfo> gpus;
  std::string runtime, driver, nccl;
};

// The GPUs the CUDA runtime sees. Every GPU's static facts (name, memory size, compute capability,
// PCI address, PCIe link, NUMA node) come from cudaGetDeviceProperties and sysfs, which open no CUDA
// context. Free memory needs one — a context holds some hundreds of MiB of its GPU — so it is read on
// `own_gpu` alone, the GPU this process drives (its local rank's, as the CUDA device picks it): a query
// that read every GPU's would leave a context from every rank on every GPU of a node, and skew each
// rank's automatic budget. It is read on a thread of its own, so the caller's current device is left as
// it was. Every other GPU has free_known false. kNoOwnGpu (the default), or an index no GPU has, opens
// no context at all.
GpuQuery query_gpus(int own_gpu = kNoOwnGpu);

// `zinf bench pcie`: pinned host ⇄ device copy bandwidth on the GPU's own streams, against the link's
// nominal rate read from the device's PCIe generation and width.
struct PcieResult {
  std::string gpu;
  int pcie_gen = 0, pcie_width = 0;
  double nominal_gbps = 0;                           // per direction, from gen × width (0 when unknown)
  double h2d_gbps = 0, d2h_gbps = 0, both_gbps = 0;  // both: H2D and D2H at once, summed
  std::uint64_t bytes = 0;
};

// Throws zinf::Error ("no GPU visible (…)", or a CUDA call that failed, by name) when it cannot run.
PcieResult bench_pcie(int device, std::uint64_t bytes, int reps,
                      const std::function<void(const std::string&)>& progress);

// Nominal per-direction bandwidth of a PCIe link in GB/s (after 128b/130b or 8b/10b encoding).
double pcie_nominal_gbps(int gen, int width);

// sysfs link attributes (/sys/bus/pci/devices/<bdf>/{current,max}_link_{speed,width}): the generation
// of a speed line ("16.0 GT/s PCIe", "8 GT/s", "Unknown" → 4, 3, 0) and a width ("16" → 16, else 0).
int pcie_gen_from_sysfs_speed(const std::string& line);
int pcie_width_from_sysfs(const std::string& line);

// The link a bandwidth is compared with: the maximum the GPU and its slot negotiate (links step down
// to a lower generation and width while the GPU idles, so the current one, read before a copy
// starts, understates the rate); the current one where the maximum is unknown.
struct PcieLink {
  int gen = 0, width = 0;
};
PcieLink pcie_nominal_link(const GpuInfo& g);

}  // namespace zinf::cuda
