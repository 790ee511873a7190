// zinf/backends/sysinfo.h — the machine as an offload engine sees it (`zinf info`).
//
// CPU, NUMA nodes and their memory (hwloc), the SIMD path cpu_adam will run, host memory, the
// locked-memory limit that bounds pinned buffers, and the GPUs CUDA sees with their PCIe links.
// Read-only queries; safe to call from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "zinf/device.h"

namespace zinf {

struct NumaNode {
  int index = 0;
  std::uint64_t memory_bytes = 0;
  std::string cpus;  // e.g. "0-15"
};

// No GPU of this process's own: query_machine reads no GPU's free memory and opens no CUDA context.
constexpr int kNoOwnGpu = -1;

struct GpuInfo {
  int index = 0;
  std::string name;
  std::uint64_t total_bytes = 0, free_bytes = 0;
  // free_bytes was read: only on the GPU this process drives (reading it opens that GPU's CUDA context);
  // the others' free memory is unknown and free_bytes is 0.
  bool free_known = false;
  int cc_major = 0, cc_minor = 0;
  std::string pci_bus_id;                                                  // "0000:3b:00.0"
  int pcie_gen = 0, pcie_width = 0, pcie_gen_max = 0, pcie_width_max = 0;  // 0 when unknown
  int numa_node = -1;
};

struct MachineInfo {
  std::string cpu_model;
  int physical_cores = 0, logical_cpus = 0;
  std::vector<NumaNode> numa;
  std::string simd_detected, simd_active;
  bool avx512_bf16 = false;
  std::uint64_t mem_total = 0, mem_available = 0;
  std::uint64_t memlock_soft = 0, memlock_hard = 0;  // UINT64_MAX = unlimited
  bool cuda_built = false;
  std::string gpu_status;  // "2 GPUs", "no GPU visible (…)", "built without CUDA"
  std::vector<GpuInfo> gpus;
  int own_gpu = kNoOwnGpu;  // the CUDA index of this process's GPU when it is visible, else kNoOwnGpu
  std::string cuda_runtime, cuda_driver, nccl;  // versions, empty when unknown
};

// The machine, with `own_gpu` the GPU this process drives (its local rank's: the CUDA device's index):
// every GPU's static facts, and the free memory of that one alone (zinf/backends/gpu.h, query_gpus).
MachineInfo query_machine(int own_gpu);
// This process's GPU among m.gpus (the one whose free memory query_machine reads), or nullptr.
inline const GpuInfo* own_gpu_info(const MachineInfo& m) {
  for (const GpuInfo& g : m.gpus)
    if (g.index == m.own_gpu) return &g;
  return nullptr;
}
// MemAvailable of /proc/meminfo in bytes (0 when unknown): query_machine()'s mem_available alone,
// without the topology and GPU queries.
std::uint64_t available_host_memory();
// This process's resident set now (VmRSS of /proc/self/status) and its peak so far (getrusage's
// ru_maxrss, which counts every page the process has held at once: heap, mappings, pinned memory,
// code), in bytes; 0 when unknown.
std::uint64_t resident_bytes();
std::uint64_t peak_resident_bytes();
// The resident set of the program as loaded — its code and libraries before it allocates anything —
// recorded once by note_startup_resident() at the start of main(); 0 when never recorded.
void note_startup_resident();
std::uint64_t startup_resident_bytes();

// "1.50 GiB" style; exact bytes below 1 KiB.
std::string format_bytes(std::uint64_t bytes);
// "1.23M", "7.1B" style parameter counts.
std::string format_count(std::int64_t n);

// What every device says when an allocation of `bytes` for `what` would pass its budget.
DeviceMemoryError over_budget_error(const std::string& what, std::size_t bytes, std::size_t in_use, std::size_t budget);

}  // namespace zinf
