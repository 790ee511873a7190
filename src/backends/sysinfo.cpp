// sysinfo.cpp — machine facts for `zinf info` and `zinf plan` (zinf/backends/sysinfo.h).
#include <atomic>
#include "zinf/backends/sysinfo.h"

#include <hwloc.h>
#include <sys/resource.h>

#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>

#include "zinf/backends/gpu.h"
#include "zinf/cpu_adam/simd.h"

namespace zinf {
namespace {

std::uint64_t meminfo_kib(const std::string& key) {
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(key + ":", 0) == 0) {
      std::istringstream is(line.substr(key.size() + 1));
      std::uint64_t kib = 0;
      is >> kib;
      return kib;
    }
  }
  return 0;
}

std::string cpu_model_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto p = line.find(':');
      if (p != std::string::npos) return line.substr(p + 2);
    }
  }
  return "unknown";
}

}  // namespace

std::string format_bytes(std::uint64_t b) {
  if (b == std::numeric_limits<std::uint64_t>::max()) return "unlimited";
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024.0 && u < 5) v /= 1024.0, ++u;
  char buf[32];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%" PRIu64 " B", b);
  else
    std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

DeviceMemoryError over_budget_error(const std::string& what, std::size_t bytes, std::size_t in_use,
                                    std::size_t budget) {
  return DeviceMemoryError("device memory budget exceeded allocating " + what + " (" + format_bytes(bytes) +
                               "): " + format_bytes(in_use) + " of " + format_bytes(budget) + " already in use",
                           "raise device.memory_budget, lower the micro batch, enable model.activation_checkpointing, "
                           "or offload (see `zinf plan`)");
}

std::string format_count(std::int64_t n) {
  char buf[32];
  double v = static_cast<double>(n);
  if (v >= 1e9)
    std::snprintf(buf, sizeof buf, "%.2fB", v / 1e9);
  else if (v >= 1e6)
    std::snprintf(buf, sizeof buf, "%.2fM", v / 1e6);
  else if (v >= 1e3)
    std::snprintf(buf, sizeof buf, "%.2fK", v / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%" PRId64, n);
  return buf;
}

MachineInfo query_machine(int own_gpu) {
  MachineInfo m;
  m.cpu_model = cpu_model_name();

  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) == 0 && hwloc_topology_load(topo) == 0) {
    m.physical_cores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
    m.logical_cpus = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU);
    int nn = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
    for (int i = 0; i < nn; ++i) {
      hwloc_obj_t o = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(i));
      NumaNode node;
      node.index = static_cast<int>(o->os_index);
      node.memory_bytes = o->attr ? o->attr->numanode.local_memory : 0;
      char* s = nullptr;
      if (o->cpuset && hwloc_bitmap_list_asprintf(&s, o->cpuset) >= 0 && s) {
        node.cpus = s;
        std::free(s);
      }
      m.numa.push_back(node);
    }
    hwloc_topology_destroy(topo);
  }

  m.simd_detected = std::string(cpu_adam::to_string(cpu_adam::detect_simd()));
  m.simd_active = std::string(cpu_adam::to_string(cpu_adam::active_simd()));
  m.avx512_bf16 = cpu_adam::cpu_has_avx512_bf16();
  m.mem_total = meminfo_kib("MemTotal") * 1024;
  m.mem_available = available_host_memory();
  rlimit rl{};
  if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
    auto conv = [](rlim_t v) {
      return v == RLIM_INFINITY ? std::numeric_limits<std::uint64_t>::max() : static_cast<std::uint64_t>(v);
    };
    m.memlock_soft = conv(rl.rlim_cur);
    m.memlock_hard = conv(rl.rlim_max);
  }
  cuda::GpuQuery g = cuda::query_gpus(own_gpu);
  m.cuda_built = g.built;
  m.gpu_status = g.status;
  m.gpus = g.gpus;
  for (const GpuInfo& gpu : m.gpus)
    if (gpu.index == own_gpu) m.own_gpu = own_gpu;
  m.cuda_runtime = g.runtime;
  m.cuda_driver = g.driver;
  m.nccl = g.nccl;
  return m;
}

std::uint64_t available_host_memory() { return meminfo_kib("MemAvailable") * 1024; }

std::uint64_t resident_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) {
      std::istringstream is(line.substr(6));
      std::uint64_t kib = 0;
      is >> kib;
      return kib * 1024;
    }
  return 0;
}

namespace {
std::atomic<std::uint64_t> startup_resident{0};
}
void note_startup_resident() { startup_resident = resident_bytes(); }
std::uint64_t startup_resident_bytes() { return startup_resident; }

std::uint64_t peak_resident_bytes() {
  rusage u{};
  if (::getrusage(RUSAGE_SELF, &u) != 0) return 0;
  return static_cast<std::uint64_t>(u.ru_maxrss) * 1024;  // Linux: KiB
}

}  // namespace zinf
