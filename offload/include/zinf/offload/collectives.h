// zinf/offload/collectives.h — collectives on a device's memory as the offload engine runs them (and
// `zinf bench comm` measures them), over a communicator of zinf/comm.h.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "zinf/comm.h"
#include "zinf/device.h"
#include "zinf/offload/device_kernels.h"

namespace zinf::offload {

// Runs f on memory of stream s: a stream-ordered transport (NCCL) gets the native stream and enqueues
// behind the stream's work; a host transport (MPI on the CPU device's memory) runs once the stream has
// drained, with nullptr.
void on_stream(Comm& comm, Device& dev, StreamRole s, const std::function<void(void*)>& f);

// The rank-ordered reduce-scatter, in place: `g` holds this rank's contributions to the parts
// counts[0], counts[1], … (one per rank, one after another); afterwards this rank's part of `g` holds
// ((x₀ + x₁) + x₂) + … over the ranks. `recv`: scratch of ranks × counts[rank] floats in the same
// memory. The all-to-all goes through `comm`, the sums through `kern` on stream s.
void reduce_scatter_ordered(Comm& comm, Device& dev, DeviceKernels& kern, StreamRole s, float* g, const std::vector<std::size_t>& counts,
                            float* recv);

}  // namespace zinf::offload
