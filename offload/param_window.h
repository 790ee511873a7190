// param_window.h — Fetch and the parameter window (internal to zinf_offload): under offload_param the
// device holds a few slots, each one unit's compute copy (and fp32 working weights in 16-bit runs
// under the reference kernels);
// a unit is fetched from its home into a slot on the h2d stream when the model asks for it, or
// ahead of that (prefetch, Layout::prefetch_depth units) in the pass's direction. A slot is reused least
// recently used first, once nobody holds it and the compute stream has passed the model's last read.
// Called from the trainer's thread only.
#pragma once

#include <cstdint>
#include <vector>

#include "tiers.h"

namespace zinf::offload::detail {

class ParamWindow {
 public:
  // Allocates the slots of the buffer specs: max(2, 1 + prefetch_depth), each the largest windowed unit.
  ParamWindow(EngineState& s, ParamHome& home);
  // The weights of windowed unit u for the model (of Engine::weights_precision()), fetched if
  // needed; the model's stream waits for the Fetch. `backward`: the pass runs from the last unit to
  // the first (prefetch direction).
  const void* acquire(std::size_t u, bool backward);
  void release(std::size_t u);  // the model is done with u (its reads are enqueued)

 private:
  struct Slot {
    DeviceBuffer param, work;
    const void* weights = nullptr;  // what the model reads: the fp32 working weights, or the compute copy
    PinnedBuffer staging;  // offload_param nvme: the read's target before the h2d copy
    int unit = -1;
    std::int64_t version = -1;
    int users = 0;
    std::uint64_t last_use = 0;
    EventHandle ready;     // h2d: the Fetch into this slot is complete
    EventHandle released;  // compute: the model's last read of this slot is complete
  };
  int find(std::size_t u);
  int fetch(std::size_t u);
  void prefetch_after(std::size_t u, bool backward);

  EngineState& state_;
  ParamHome& home_;
  std::vector<Slot> slots_;
  std::uint64_t tick_ = 0;
};

}  // namespace zinf::offload::detail
