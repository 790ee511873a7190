// info.cpp — `zinf info [--path DIR]... [--json]`: the machine as an offload engine sees it.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <unistd.h>
#include <cstdio>
#include <limits>

#include "commands.h"
#include "zinf/backends/backend.h"
#include "zinf/backends/world.h"
#include "zinf/comm.h"
#include "zinf/nvme/probe.h"
#include "zinf/backends/sysinfo.h"

namespace zinf::cli {
namespace {

struct InfoArgs {
  std::vector<std::string> paths;
  bool json = false;
};

std::string memlock_meaning(const MachineInfo& m) {
  if (::geteuid() == 0)
    return "running as root (CAP_IPC_LOCK): pinned buffers are bounded by host memory, not by this limit";
  if (m.memlock_soft == std::numeric_limits<std::uint64_t>::max())
    return "unlimited: pinned buffers are bounded by host memory";
  return "pinned (page-locked) buffers may total at most " + format_bytes(m.memlock_soft) +
         "; raise it with `ulimit -l` or /etc/security/limits.conf (memlock) for larger pools";
}

nlohmann::json machine_json(const MachineInfo& m, const std::vector<nvme::PathProbe>& probes) {
  nlohmann::json j;
  j["cpu"] = {{"model", m.cpu_model},           {"physical_cores", m.physical_cores},
              {"logical_cpus", m.logical_cpus}, {"simd_detected", m.simd_detected},
              {"simd_active", m.simd_active},   {"avx512_bf16", m.avx512_bf16}};
  j["numa"] = nlohmann::json::array();
  for (const auto& n : m.numa)
    j["numa"].push_back({{"node", n.index}, {"memory_bytes", n.memory_bytes}, {"cpus", n.cpus}});
  j["memory"] = {{"total_bytes", m.mem_total}, {"available_bytes", m.mem_available}};
  auto lim = [](std::uint64_t v) -> nlohmann::json {
    if (v == std::numeric_limits<std::uint64_t>::max()) return "unlimited";
    return v;
  };
  j["memlock"] = {{"soft", lim(m.memlock_soft)}, {"hard", lim(m.memlock_hard)}, {"meaning", memlock_meaning(m)}};
  j["cuda"] = {{"built", m.cuda_built},
               {"status", m.gpu_status},
               {"runtime", m.cuda_runtime},
               {"driver", m.cuda_driver},
               {"nccl", m.nccl},
               {"cudnn", backends::cudnn_version()}};
  j["gpus"] = nlohmann::json::array();
  // The JSON objects read as tables, a few keys a line. free_bytes is null on the GPUs other than this
  // process's: reading it would open a CUDA context there.
  // clang-format off
  for (const auto& g : m.gpus)
    j["gpus"].push_back({{"index", g.index}, {"name", g.name}, {"total_bytes", g.total_bytes},
                         {"free_bytes", g.free_known ? nlohmann::json(g.free_bytes) : nlohmann::json(nullptr)},
                         {"own", g.index == m.own_gpu},
                         {"compute_capability", std::to_string(g.cc_major) + "." + std::to_string(g.cc_minor)},
                         {"pci_bus_id", g.pci_bus_id}, {"pcie_gen", g.pcie_gen}, {"pcie_width", g.pcie_width},
                         {"pcie_gen_max", g.pcie_gen_max}, {"pcie_width_max", g.pcie_width_max}, {"numa_node", g.numa_node}});
  j["paths"] = nlohmann::json::array();
  for (const auto& p : probes)
    j["paths"].push_back({{"path", p.path}, {"exists", p.exists}, {"filesystem", p.filesystem}, {"free_bytes", p.free_bytes},
                          {"total_bytes", p.total_bytes}, {"dio_align", p.dio_align}, {"o_direct", p.odirect},
                          {"o_direct_reason", p.odirect_reason}, {"io_uring", p.io_uring},
                          {"io_uring_reason", p.io_uring_reason}});
  // clang-format on
  return j;
}

void print_machine(const MachineInfo& m, const std::vector<nvme::PathProbe>& probes) {
  std::printf("zinf %s\n", ZINF_VERSION);
  std::printf("cpu        %s — %d physical cores, %d logical CPUs\n", m.cpu_model.c_str(), m.physical_cores,
              m.logical_cpus);
  std::printf("simd       %s (detected %s%s; cap with device.simd or ZINF_SIMD)\n", m.simd_active.c_str(),
              m.simd_detected.c_str(), m.avx512_bf16 ? ", with AVX512-BF16" : "");
  for (const auto& n : m.numa)
    std::printf("numa       node %d: %s, cpus %s\n", n.index, format_bytes(n.memory_bytes).c_str(), n.cpus.c_str());
  std::printf("memory     %s total, %s available\n", format_bytes(m.mem_total).c_str(),
              format_bytes(m.mem_available).c_str());
  std::printf("memlock    soft %s, hard %s — %s\n", format_bytes(m.memlock_soft).c_str(),
              format_bytes(m.memlock_hard).c_str(), memlock_meaning(m).c_str());
  std::printf("cuda       %s", m.gpu_status.c_str());
  if (m.cuda_built)
    std::printf(" — runtime %s, driver %s, NCCL %s", m.cuda_runtime.empty() ? "?" : m.cuda_runtime.c_str(),
                m.cuda_driver.empty() ? "none" : m.cuda_driver.c_str(), m.nccl.empty() ? "?" : m.nccl.c_str());
  std::printf("\n");
  if (m.cuda_built)
    std::printf("attention  %s\n", backends::cudnn_built()
                                       ? ("cuDNN " + backends::cudnn_version() +
                                          " for the fast kernels (device.attention auto = cudnn)").c_str()
                                       : "built without cuDNN: the fast kernels run the wmma flash kernel");
  for (const auto& g : m.gpus) {
    // Only this process's GPU is opened (a CUDA context) to read its free memory.
    const std::string free = g.free_known           ? format_bytes(g.free_bytes) + " free"
                             : g.index == m.own_gpu ? "free memory unreadable"
                             : m.own_gpu == kNoOwnGpu
                                 ? "free not read: no GPU is this process's"
                                 : "free not read: this process's GPU is " + std::to_string(m.own_gpu);
    std::printf("gpu %d      %s, sm_%d%d, %s (%s), PCIe %s", g.index, g.name.c_str(), g.cc_major, g.cc_minor,
                format_bytes(g.total_bytes).c_str(), free.c_str(), g.pci_bus_id.c_str());
    if (g.pcie_gen)
      std::printf(" gen%d x%d (max gen%d x%d)", g.pcie_gen, g.pcie_width, g.pcie_gen_max, g.pcie_width_max);
    std::printf(", NUMA node %d\n", g.numa_node);
  }
  for (const auto& p : probes) {
    if (!p.exists) {
      std::printf("path       %s: does not exist or is not a directory\n", p.path.c_str());
      continue;
    }
    std::printf("path       %s: %s, %s free of %s\n", p.path.c_str(), p.filesystem.c_str(),
                format_bytes(p.free_bytes).c_str(), format_bytes(p.total_bytes).c_str());
    std::printf(
        "             O_DIRECT  %s\n",
        p.odirect
            ? ("yes" + (p.dio_align ? " (alignment " + std::to_string(p.dio_align) + " B)" : std::string())).c_str()
            : ("no: " + p.odirect_reason).c_str());
    std::printf("             io_uring  %s\n", p.io_uring ? "yes" : ("no: " + p.io_uring_reason).c_str());
  }
}

int run_info(const InfoArgs& a) {
  const MachineInfo machine = query_machine(detect_world().local_rank);  // the GPU the CUDA device would drive
  std::vector<nvme::PathProbe> probes;
  for (const auto& p : a.paths) probes.push_back(nvme::probe_path(p));
  if (a.json)
    print_json(machine_json(machine, probes));
  else
    print_machine(machine, probes);
  return 0;
}

}  // namespace

Command add_info(CLI::App& app) {
  auto [sub, args] = add_subcommand<InfoArgs>(app, "info",
                                              "Show the machine as an offload engine sees it: CPU, NUMA, SIMD path, "
                                              "host and locked memory, GPUs and their PCIe links, swap paths");
  sub->add_option("--path", args->paths,
                  "Also probe DIR as a swap location: filesystem, free space, O_DIRECT, io_uring")
      ->type_name("DIR");
  sub->add_flag("--json", args->json, "Print one JSON object instead of text");
  return command(sub, args, run_info);
}

}  // namespace zinf::cli
