// comm_bench.h — `zinf bench comm`: the data-parallel collectives of the active transport, on the active
// device's memory, per size, as nccl-tests reports them — algorithm bandwidth (bytes / time) and bus
// bandwidth (the algorithm bandwidth times the share of the data each rank must move: 2(n−1)/n for
// all-reduce, (n−1)/n for all-gather, reduce-scatter and all-to-all) — beside the device's own copy
// rate at the same size (memcpy on the CPU device, a device-to-device copy on a GPU), measured in the
// same run. Every rank calls it; the slowest rank's time counts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zinf/comm.h"
#include "zinf/device.h"
#include "zinf/offload/engine_kernels.h"

namespace zinf {

struct CommBenchRow {
  std::string op;               // all_gather, all_to_all, reduce_scatter, all_reduce, broadcast
  std::uint64_t bytes = 0;      // the whole buffer (every rank's parts together), as nccl-tests counts it
  double seconds = 0;           // per call, the slowest rank's mean
  double algbw = 0, busbw = 0;  // GB/s
  double copy_gbps = 0;         // one copy of the same bytes in the device's memory, GB/s
};

// `comm` moves `device`'s memory (MPI for the CPU device, NCCL for CUDA); `kernels` do the sums. The
// reduce-scatter is the engine's: each rank's part goes to its owner (all-to-all), which sums the
// contributions in rank order on the device; all-reduce is that followed by an all-gather.
std::vector<CommBenchRow> bench_comm(Comm& comm, Device& device, offload::EngineKernels& kernels,
                                     const std::vector<std::uint64_t>& sizes, int iters);

}  // namespace zinf
