// gradient_path.h — the gradient path (internal to zinf_offload): the model's fp32 gradient buffer per
// unit on the device, then GradOut and Reduce into the Update's input.
//
//   optimizer on the device   Reduce rounds the gradient to 16 bits (and sums micro batches in fp32)
//                             in place on the device, on the d2h stream
//   optimizer off the device  block gradients pass through two device gradient slots; GradOut rounds
//                             each bucket (reduce_bucket_size) to 16 bits on the device and copies it
//                             into one of two pinned landing buffers (d2h stream, an event each);
//                             Reduce copies it into host grad16, or adds it into host grad32 (GA > 1)
// GradOut+Reduce of a unit run on the Reduce worker behind the backward (overlap exact) or inline.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "engine_state.h"
#include "zinf/jitter.h"
#include "zinf/serial_worker.h"

namespace zinf::offload::detail {

class GradientPath {
 public:
  explicit GradientPath(EngineState& s);
  void add(Unit& u, const std::string& name);  // unit u's gradient buffers (at construction)
  void allocate_shared(std::size_t max_unit);   // slots, landing buffers, staging (after every add)

  void begin_micro_batch(std::int64_t micro);
  std::int64_t micro() const { return micro_; }
  float* grads(std::size_t u);       // zeroed at the first request of a micro batch
  void grads_done(std::size_t u);    // starts GradOut + Reduce of u
  void drain();                      // the barrier: every Reduce has finished; rethrows its error
  void check();                      // rethrows a Reduce error without waiting

  // The Update's input for unit u, and the sum of squares of it (the norm's part; synchronous).
  std::pair<const void*, cpu_adam::GradType> update_input(Unit& u) const;
  cpu_adam::SumSquares sum_squares(Unit& u);

 private:
  void grad_out_and_reduce(std::size_t u, float* grad, std::int64_t micro);
  std::size_t host_grad_bytes() const { return (s_.c.grad_accum > 1 || !s_.mixed) ? 4 : 2; }

  struct GradSlot {
    DeviceBuffer grad;
    bool busy = false;  // under mu
  };
  EngineState& s_;
  std::vector<GradSlot> slots_;
  std::vector<PinnedBuffer> landing_;  // 2 × bucket × compute_bytes
  DeviceBuffer gradout_stage_;         // one bucket rounded to 16 bits before it leaves the device
  HostMem reduce_scratch_;             // bucket × 4: the fp32 of a landed bucket (GA > 1)
  std::vector<bool> zeroed_;           // this micro batch's gradient of unit u is zeroed
  std::int64_t micro_ = 0;
  Jitter jitter_;
  std::unique_ptr<SerialWorker> worker_;  // last: its jobs use everything above
};

}  // namespace zinf::offload::detail
