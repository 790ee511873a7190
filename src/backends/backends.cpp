// backends.cpp — which backends this build has. The CUDA backend (src/backends/cuda/) is compiled only
// with CUDA and the MPI communicator (src/backends/mpi/) only with MPI; this file is the one place that
// knows, and answers for a missing one with a clear error (or, for the facts `zinf info` shows, with
// "built without").
#include "cpu/cpu.h"
#include "zinf/backends/backend.h"
#include "zinf/backends/gpu.h"
#include "zinf/backends/world.h"
#include "zinf/comm.h"
#include "zinf/error.h"
#include "zinf/backends/sysinfo.h"

#if ZINF_HAVE_CUDA
#include "cuda/cuda.h"
#endif
#if ZINF_HAVE_CUDNN
#include "cuda/cudnn_attention_version.h"
#endif

namespace zinf {

const backends::Backend& backends::backend_for(DeviceType type) {
  switch (type) {
    case DeviceType::cuda:
#if ZINF_HAVE_CUDA
      return cuda::cuda_backend();
#else
      throw Error("CUDA device: this zinf was built without CUDA",
                  "configure with -DZINF_CUDA=ON on a machine with nvcc");
#endif
    case DeviceType::cpu: return cpu::cpu_backend();
    case DeviceType::automatic: break;
  }
  throw Error("device.type auto must be resolved to cpu or cuda before a backend is chosen");
}

#if ZINF_HAVE_CUDNN
bool backends::cudnn_built() { return true; }
std::string backends::cudnn_version() { return cuda::cudnn_build_version(); }
#else
bool backends::cudnn_built() { return false; }
std::string backends::cudnn_version() { return "built without"; }
#endif

#if !ZINF_HAVE_CUDA
cuda::GpuQuery cuda::query_gpus(int) {
  GpuQuery q;
  q.status = "built without CUDA (configure with -DZINF_CUDA=ON and nvcc to enable the GPU device)";
  return q;
}

cuda::PcieResult cuda::bench_pcie(int, std::uint64_t, int, const std::function<void(const std::string&)>&) {
  throw Error("bench pcie: this zinf was built without CUDA", "configure with -DZINF_CUDA=ON on a machine with nvcc");
}
#endif

#if ZINF_HAVE_CUDA && !ZINF_HAVE_NCCL
// The CUDA backend without NCCL: one rank per machine; data-parallel ranks need NCCL to move device memory.
std::unique_ptr<Comm> cuda::make_nccl_comm(Comm& host, int) {
  throw ConfigError("device.comm nccl: this zinf was built without NCCL, so the CUDA device's " +
                        std::to_string(host.size()) + " ranks cannot exchange device memory",
                    "install NCCL (the CUDA toolkit's copy or libnccl-dev) and rebuild (ZINF_NCCL=AUTO finds it; "
                    "-DZINF_NCCL_LIBRARY and -DZINF_NCCL_INCLUDE name one elsewhere), or run one rank");
}
#endif

#if !ZINF_HAVE_MPI
// Without MPI a job has one rank.
std::unique_ptr<Comm> make_world_comm(const World& w) {
  if (w.size <= 1) return make_solo_comm();
  throw ConfigError("launched as rank " + std::to_string(w.rank) + " of " + std::to_string(w.size) +
                        ", but this build of zinf has no MPI",
                    "install libopenmpi-dev (scripts/install-deps.sh) and rebuild");
}
void mark_world_failing() {}
void end_world_job(int) {}
void remove_world_files() {}
void leave_world() {}
#endif

}  // namespace zinf
