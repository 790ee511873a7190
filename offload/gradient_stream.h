// gradient_stream.h — gradient streaming (internal to zinf_offload; offload_optimizer.gradient_streaming,
// docs/offload-engine.md "Streaming gradients"): the host holds no model-sized gradient buffer.
//
// With the optimizer on NVMe, overlap exact (and with GA > 1 one rank, the micro batches summed on the
// device), the Reduce of a unit's last micro batch lands its gradient — the Update's input, 16-bit at
// GA 1 on one rank, else the fp32 sum — in one of a few pinned ring slots, each the size of the largest
// unit's gradient this rank keeps, instead of a host gradient buffer of its own. With several ranks
// the slot holds the bucket-wise cross-rank reduction of the part this rank keeps (Unit::grad_range:
// its shard under ZeRO stage ≥ 2, else the whole unit), and so does its NVMe copy; a rank's empty
// shard writes and reads nothing:
//
//   Reduce worker   acquire(u): waits for a free slot; the landing buckets fill it; written(u): the
//                   slot → the unit's NVMe tensor (waited for); then the unit is reduced (under mu,
//                   reduced_locked), and the slot is kept for the speculative Update while the ring is
//                   open, else freed at once
//   update worker   the speculative walk reads the slot of each unit it reaches (the gate waits for
//                   Unit::reduced), frees it after the unit's last sub-group (consumed), and closes the
//                   ring — every slot freed — when it stops (the norm says the step clips or is not
//                   finite, the host backup is full, the verdict came, or the unit it waits for can
//                   no longer get a slot) and when it ends
//   no speculation  (`speculative: false`) the ring is never open: each slot is freed once written, and
//                   the Update reads every unit back
//   second pass     the walk after the verdict (sub-groups the speculation did not reach, or a step
//                   redone with the clip factor) reads each unit's gradient back from NVMe into slot 0
//                   (input), once per unit
//
// Handoffs: a slot's holder and the ring's state are under the engine's mutex (cv notified on every
// change); the NVMe write is waited for by the Reduce worker before the unit is reduced, and the
// barrier drains the Reduce worker before any read back; a read back is waited for by the update
// worker before its Update. The Reduce of the next step cannot start before the second pass ends (its
// backward waits for every unit to land), so slot 0 is never read back into while the Reduce fills it.
#pragma once

#include <string>
#include <vector>

#include "engine_state.h"

namespace zinf::offload::detail {

class GradientStream {
 public:
  explicit GradientStream(EngineState& s);
  void add(Unit& u, const std::string& name);  // unit u's NVMe tensor (at construction)
  void allocate();                             // the ring (after every add)
  nvme::TensorStore& store() { return store_; }

  // ---- the Reduce worker, the step's last micro batch ----
  void acquire(const Unit& u);  // a slot for u's gradient (waits for a free one)
  void written(const Unit& u);  // u's gradient is complete in its slot: → NVMe, waited for
  void reduced_locked(const Unit& u);  // under mu, as u is marked reduced: its slot freed unless the ring is open
  // The Reduce of u's last micro batch failed after acquire (its copy off the device, its NVMe write):
  // u's slot is freed and the ring closed for the speculation it was kept for, so that neither a
  // later Reduce (acquire) nor the walk (waiting for u) waits forever; the error reaches step() when
  // it drains the Reduce worker.
  void failed(const Unit& u);

  // ---- the Update's input ----
  // u's gradient: its slot while it holds one, else read back from NVMe into slot 0 (the update worker,
  // after the barrier).
  char* input(const Unit& u);

  // ---- the speculative Update ----
  // The trainer's thread, as speculation `gen` starts; only that speculation closes it.
  void open(std::uint64_t gen);
  bool held_locked(const Unit& u) const;    // under mu: a slot holds u
  // Under mu: u can never reach a slot the speculation will read — the ring is closed, or every slot
  // holds another unit (only the speculation frees them).
  bool blocked_locked(const Unit& u) const;
  void consumed(const Unit& u);  // the speculation has updated u's last sub-group: its slot is free
  // Under mu: no more slots kept for speculation `gen` (the ring closed if it is still open for it);
  // each of its slots whose unit is reduced freed (one the Reduce still fills is freed when it is).
  void close_locked(std::uint64_t gen);
  void close(std::uint64_t gen);

 private:
  int slot_of_locked(const Unit& u) const;
  EngineState& s_;
  nvme::TensorStore store_;
  std::vector<nvme::TensorStore::Id> tensor_;  // per unit
  std::vector<std::uint64_t> bytes_;           // per unit: its gradient's bytes
  std::vector<PinnedBuffer> ring_;
  struct Holder {              // under mu
    std::int64_t unit = -1;    // the unit the slot holds, -1: free
    std::uint64_t gen = 0;     // the speculation it is kept for (0: none, the ring was closed)
    bool filled = false;       // its unit is reduced
  };
  std::vector<Holder> holder_;
  bool open_ = false;           // under mu: slots are kept for speculation open_for_
  std::uint64_t open_for_ = 0;  // under mu
  // A speculation's walk may still end (and close) after the next step's speculation has opened the
  // ring (the trainer does not wait for it): a slot is tagged with the speculation it is kept for, and
  // a close frees that speculation's slots only.
  std::int64_t loaded_ = -1;          // under mu: the unit read back into slot 0 (-1: none)
};

}  // namespace zinf::offload::detail
