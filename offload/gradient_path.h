// gradient_path.h — the gradient path (internal to zinf_offload): the model's fp32 gradient buffer per
// unit on the device, then GradOut and Reduce into the Update's input.
//
//   optimizer on the device   Reduce rounds the gradient to 16 bits (and sums micro batches in fp32)
//                             in place on the device, on the d2h stream
//   optimizer off the device  block gradients pass through two device gradient slots; GradOut rounds
//                             each bucket (reduce_bucket_size) to 16 bits on the device and copies it
//                             into one of two pinned landing buffers (d2h stream, an event each);
//                             Reduce copies it into host grad16, or adds it into host grad32 (GA > 1)
//   device_accum              (optimizer off the device, one rank, GA > 1) each micro batch is rounded
//                             and summed on the device as with the optimizer there; after the last,
//                             GradOut copies the fp32 sum through the landing buffers into host grad32
//   partitioned gradients     (ZeRO stage ≥ 2, several ranks) block gradients pass through the two
//                             gradient slots whatever the optimizer's tier: a rank keeps only its shard
//   more than one rank        the Update's input is always an fp32 sum; each bucket's rounded
//                             gradient is reduced across ranks (reduce_bucket) before it is summed
//                             over micro batches — into this rank's shard only under ZeRO stage ≥ 2
// GradOut+Reduce of a unit run on the Reduce worker behind the backward (overlap exact) or inline.
#pragma once

#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "engine_state.h"
#include "gradient_stream.h"
#include "zinf/jitter.h"
#include "zinf/serial_worker.h"

namespace zinf::offload::detail {

class GradientPath {
 public:
  explicit GradientPath(EngineState& s);
  ~GradientPath();
  void add(Unit& u, const std::string& name);  // unit u's gradient buffers (at construction)
  void allocate_shared();                      // slots, landing buffers, staging (after every add)
  void allocate_comm_scratch();                // the receive scratch of the cross-rank reduction

  void begin_micro_batch(std::int64_t micro);
  // The layer-major order (Layout::layer_major): the step's micro batches begin together, and
  // set_micro says which one the next grads / grads_done are for.
  void begin_micro_batches();
  void set_micro(std::int64_t micro) { micro_ = micro; }
  std::int64_t micro() const { return micro_; }
  // Unit u's gradient of the current micro batch: a gradient slot taken (and zeroed) at its first
  // request, held until grads_done hands it to the GradOut/Reduce job, which frees it.
  float* grads(std::size_t u);
  void grads_done(std::size_t u);  // starts GradOut + Reduce of u
  void drain();                    // the barrier: every Reduce has finished; rethrows its error
  void check();                    // rethrows a Reduce error without waiting

  // The Update's input for unit u.
  std::pair<const void*, cpu_adam::GradType> update_input(const Unit& u) const;
  // Gradient streaming (gradient_stream.h): the ring and NVMe copy that replace the host gradient; null
  // without it.
  GradientStream* stream() const { return stream_.get(); }
  // Every unit's 64 Ki-block sums of squares of its kept range, units in order (the norm's parts;
  // synchronous, one wait for the device for all units). Added in block order they are the unit's
  // sum of squares; with partitioned gradients the ranks' blocks are gathered first.
  // `known(u, sums)`, when given, may supply a unit's sums computed already (the speculative Update's,
  // the same function of the same gradient); the optimizer off the device only. Without speculation
  // the Reduce worker sums each unit's squares once its last micro batch is in (under the backward,
  // not at the barrier); those are used too.
  std::vector<std::vector<double>> block_sums(
      const std::function<bool(std::size_t, std::vector<double>&)>& known = {});

 private:
  // How a unit's gradient becomes the Update's input, chosen once at construction (StagePlan::route,
  // resolve.h): DeviceRoute (the optimizer on the device: rounded, summed and reduced in
  // place on d2h), its OrderedDeviceRoute (the same, with the collectives issued from the trainer's
  // thread), AccumRoute (device_accum: summed on the device, the sum leaves once per step) and
  // HostRoute (GradOut through the landing buffers, then one of three host Reduces: a 16-bit copy, the
  // fp32 sum of one rank, or the cross-rank reduction then the sum of this rank's part).
  class Route;
  class DeviceRoute;
  class OrderedDeviceRoute;
  class HostInput;
  class AccumRoute;
  class HostRoute;
  std::unique_ptr<Route> make_route();
  // The optimizer on the device, or device_accum: the rounding, Reduce and fp32 sum of unit u's
  // gradient (StagePlan::device_actions), enqueued on the d2h stream behind `complete` (the caller
  // then waits for the stream).
  void enqueue_on_device(Unit& u, float* grad, std::int64_t micro, EventHandle complete);
  void release(int slot);  // a gradient slot free for the next micro batch (or unit)
  void* grad16_of(const float* grad) const;  // the 16-bit rounding buffer beside a slot's gradient
  void reduce_bucket(Unit& u, std::size_t o, std::size_t len, float* g, bool on_device);
  // device_accum: the step's fp32 sum of unit u leaves the device (bucket by bucket through the
  // landing buffers) into its host gradient.
  void grad_out_sum(Unit& u);
  // GradOut of n elements, bucket by bucket through the landing buffers: `out(o, len, landing)`
  // enqueues the bucket's copies into a landing buffer on d2h, `in(o, len, landing)` reads it on this
  // thread (host busy time) once its event has completed. The copies run ahead of the reads by as
  // many buckets as there are landing buffers.
  using BucketFn = std::function<void(std::size_t o, std::size_t len, PinnedBuffer& landing)>;
  void through_landing(const Unit& u, std::size_t n, const BucketFn& out, const BucketFn& in);

  // Each unit's gradient buffers, as its layout has them (add): the model's fp32 device gradient
  // (units without a gradient slot), its 16-bit rounding and fp32 sum on the device, and the Update's
  // input in host memory; `input` is the Update's input among them (StagePlan::input), with its type.
  struct UnitGrads {
    DeviceBuffer grad, grad16, grad_sum;
    std::vector<DeviceBuffer> more;  // layer-major: its other gradient buffers (BufferSpec::count − 1)
    HostMem host_grad;
    std::pair<const void*, cpu_adam::GradType> input{nullptr, cpu_adam::GradType::fp32};
    // The gradient slots (slots_) this unit's gradient may take: the one over its own buffers, or
    // the shared gradient slots (Unit::grad_windowed), decided once in add / allocate_shared.
    std::vector<std::size_t> slots;
  };
  std::vector<UnitGrads> of_;
  UnitGrads& of(const Unit& u) { return of_[u.index]; }
  const UnitGrads& of(const Unit& u) const { return of_[u.index]; }

  // Where a micro batch's gradient of a unit lives: a unit's own buffers, or one of the shared
  // gradient slots; taken at grads(u) (open_, the trainer's thread), handed to the GradOut/Reduce job
  // at grads_done(u) and released (busy cleared) when it is done.
  struct GradSlot {
    float* grad = nullptr;
    void* grad16 = nullptr;  // the 16-bit rounding (the optimizer on the device, mixed runs)
    bool busy = false;       // under mu
  };
  EngineState& state_;
  std::vector<GradSlot> slots_;
  std::vector<DeviceBuffer> slot_memory_;  // the shared gradient slots' buffers
  std::vector<PinnedBuffer> landing_;  // 2 × bucket × compute_bytes (× 4 bytes with device_accum: the fp32 sum)
  DeviceBuffer gradout_stage_;         // one bucket rounded to 16 bits before it leaves the device
  HostMem reduce_scratch_;             // bucket × 4: the fp32 of a landed bucket (GA > 1, several ranks)
  HostMem host_recv_;                  // several ranks: every rank's part of a bucket, received
  DeviceBuffer device_recv_;           //   (host when the optimizer is offloaded, else device)
  // The trainer's thread only: open_[u][m] is the slot of unit u's open gradient of micro batch m
  // (asked for, not yet done), −1 none.
  std::vector<std::vector<int>> open_;
  // The Reduce worker only: the step in which a Reduce job of unit u failed (with streaming, the
  // unit's later micro batches then do nothing: its ring slot is gone).
  std::vector<std::uint64_t> failed_step_;
  // The Reduce worker's block sums of unit u's step gradient (optimizer off the device, no
  // speculation) and the step they are of: written by the worker only, read by block_sums() after
  // drain() (the barrier). step_ counts steps (begin_micro_batch(0)) on the trainer's thread; a job
  // carries the step it was queued in.
  std::vector<std::vector<double>> sums_;
  std::vector<std::uint64_t> summed_step_;
  std::uint64_t step_ = 1;
  std::int64_t micro_ = 0;
  std::unique_ptr<Route> route_;
  std::unique_ptr<GradientStream> stream_;  // gradient streaming only
  // Where the Reduce writes unit u's Update input: its host gradient, or with streaming its ring slot.
  char* host_input(const Unit& u) const { return stream_ ? stream_->input(u) : of(u).host_grad.get(); }
  Jitter jitter_;
  std::unique_ptr<HostQueue> worker_;  // last: its jobs use everything above
};

}  // namespace zinf::offload::detail
