// zinf/offload/collectives.h — collectives on a device's memory as the offload engine runs them (and
// `zinf bench comm` measures them), over a communicator of zinf/comm.h.
#pragma once

#include <cstddef>
#include <functional>
#include <mutex>
#include <vector>

#include "zinf/comm.h"
#include "zinf/device.h"
#include "zinf/offload/engine_kernels.h"

namespace zinf::offload {

// Runs f on memory of stream s: a stream-ordered transport (NCCL) gets the native stream and enqueues
// behind the stream's work; a host transport (MPI on the CPU device's memory) runs once the stream has
// drained, with nullptr.
void on_stream(Comm& comm, Device& dev, StreamRole s, const std::function<void(void*)>& f);

// One order for every collective on a stream-ordered transport (NCCL) of one process: each is
// issued through run(), and the stream it goes on first waits for the previous one's completion, so
// they execute one after another in issue order whatever stream each is on. Two ranks that issue
// the same collectives in the same order then run them in the same order — NCCL does not promise
// that two collectives in flight at once on one GPU both progress, so an order that differed between
// ranks could hang. The caller makes the issue order the same on every rank (one thread issues them
// all); with a host transport (MPI) run() is on_stream().
class CollectiveOrder {
 public:
  void run(Comm& comm, Device& dev, StreamRole s, const std::function<void(void*)>& f);

 private:
  std::mutex mu_;
  EventHandle last_;  // after the previous collective, on last_role_
  StreamRole last_role_ = StreamRole::compute;
};

// The rank-ordered reduce-scatter, in place: `g` holds this rank's contributions to the parts
// counts[0], counts[1], … (one per rank, one after another); afterwards this rank's part of `g` holds
// ((x₀ + x₁) + x₂) + … over the ranks. `recv`: scratch of ranks × counts[rank] floats in the same
// memory. The all-to-all goes through `comm`, the sums through `kern` on stream s.
// With `order`, the all-to-all is issued through it.
void reduce_scatter_ordered(Comm& comm, Device& dev, EngineKernels& kern, StreamRole s, float* g,
                            const std::vector<std::size_t>& counts, float* recv, CollectiveOrder* order = nullptr);

}  // namespace zinf::offload
