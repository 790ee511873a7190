// gpu_query.cu — ask the CUDA runtime which GPUs it sees (never the default stream: no work is
// launched here), opening a CUDA context on this process's own GPU only (zinf/backends/gpu.h). A
// machine without a driver or GPU is a normal answer, not an error.
#include <cuda_runtime.h>
#if ZINF_HAVE_NCCL
#include <nccl.h>
#endif

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "cuda/device_flags.cuh"
#include "zinf/backends/gpu.h"

namespace zinf::cuda {
namespace {

std::string version_string(int v) {  // 13000 -> "13.0"
  char buf[32];
  std::snprintf(buf, sizeof buf, "%d.%d", v / 1000, (v % 1000) / 10);
  return buf;
}

std::string read_line(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

// The free memory of GPU `index`, which needs its primary context: made as the CUDA device makes it
// (device_flags.cuh). On a thread of its own: cudaSetDevice binds the context to the calling thread
// (and, from CUDA 12 on, creates it there and then), so the caller's current device is not changed,
// nor is a context made on the GPU that was current there. Errors stay on that thread.
bool read_free_memory(int index, std::uint64_t* free_bytes) {
  bool ok = false;
  std::thread reader([&] {
    if (cudaSetDevice(index) != cudaSuccess) return;
    (void)cuda::request_blocking_sync();
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) return;
    *free_bytes = free_b;
    ok = true;
  });
  reader.join();
  return ok;
}

}  // namespace

GpuQuery query_gpus(int own_gpu) {
  GpuQuery q;
  q.built = true;
  int rt = 0;
  if (cudaRuntimeGetVersion(&rt) == cudaSuccess) q.runtime = version_string(rt);
  int drv = 0;
  if (cudaDriverGetVersion(&drv) == cudaSuccess && drv > 0) q.driver = version_string(drv);
#if ZINF_HAVE_NCCL
  int nccl = 0;
  if (ncclGetVersion(&nccl) == ncclSuccess) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%d.%d.%d", nccl / 10000, (nccl / 100) % 100, nccl % 100);
    q.nccl = buf;
  }
#else
  q.nccl = "built without";
#endif
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    q.status = std::string("no GPU visible (") + (e != cudaSuccess ? cudaGetErrorString(e) : "no devices") + ")";
    (void)cudaGetLastError();
    return q;
  }
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    GpuInfo g;
    g.index = i;
    g.name = p.name;
    g.total_bytes = p.totalGlobalMem;
    g.cc_major = p.major;
    g.cc_minor = p.minor;
    char bus[32];
    std::snprintf(bus, sizeof bus, "%04x:%02x:%02x.0", p.pciDomainID, p.pciBusID, p.pciDeviceID);
    g.pci_bus_id = bus;
    if (i == own_gpu) g.free_known = read_free_memory(i, &g.free_bytes);
    const std::string sys = "/sys/bus/pci/devices/" + g.pci_bus_id + "/";
    // current_*: the link now (it steps down while the GPU idles); max_*: what it trains to under load.
    g.pcie_gen = pcie_gen_from_sysfs_speed(read_line(sys + "current_link_speed"));
    g.pcie_gen_max = pcie_gen_from_sysfs_speed(read_line(sys + "max_link_speed"));
    g.pcie_width = pcie_width_from_sysfs(read_line(sys + "current_link_width"));
    g.pcie_width_max = pcie_width_from_sysfs(read_line(sys + "max_link_width"));
    std::string numa = read_line(sys + "numa_node");
    g.numa_node = numa.empty() ? -1 : std::atoi(numa.c_str());
    q.gpus.push_back(g);
  }
  q.status = std::to_string(q.gpus.size()) + (q.gpus.size() == 1 ? " GPU" : " GPUs");
  return q;
}

}  // namespace zinf::cuda
