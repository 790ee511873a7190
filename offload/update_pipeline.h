// update_pipeline.h — the update pipeline (internal to zinf_offload): after the norm barrier, every
// sub-group in forward order goes through
//   SwapIn   its master|m|v come in (NVMe tier only; read ahead, from the last backward on)
//   Update   one fused cpu_adam pass (or the device's kernel when the states live on the device):
//            unscale · clip · Adam(W) · the new compute copy
//   Upload   the compute copy goes home: into the device (h2d), pinned memory, or NVMe
//   SwapOut  master|m|v go back (NVMe tier only; written behind)
// and each unit "lands" when its last sub-group is home: version[u] = applied, which the next
// forward's weights(u) waits for. Runs on the update worker (overlap exact) or inline.
//
// The speculative Update (speculate(); the optimizer off the device, overlap exact): from the last
// micro batch's backward, each unit's sub-groups are updated as soon as its gradient is reduced —
// units in the order their Reduce finishes (last to first) — with the step the trainer expects,
// which assumes no clipping and a finite step. Nothing lands before the decision. Then:
//   kept       the step is the assumed one: the tier commits the speculative versions, and the
//              walk updates only the sub-groups left, landing units in order
//   redone     clipped (or another step): the tier rolls back, and the whole walk runs with the step
//   skipped    not finite: the tier rolls back, and the compute copies the speculation rewrote are
//              rebuilt from the restored masters; only the units it rewrote wait for that (their
//              version is held back meanwhile), and no unit lands — nothing of the step is applied
//   abandoned  no step comes (synchronize() mid-step, teardown, an error): restored as a skipped
//              step, without a landing or a collective, and not counted as a rollback
// Speculation stops early — the rest waits for the decision — once this rank's partial sum of
// squares already says the step clips or is not finite, or the host backup is full.
#pragma once

#include <atomic>
#include <cstdint>
#include <future>
#include <memory>

#include "gradient_path.h"
#include "tiers.h"
#include "zinf/jitter.h"
#include "zinf/serial_worker.h"

namespace zinf::offload::detail {

// Where a sub-group's Update runs, chosen once from the optimizer's tier (update_pipeline.cpp): the
// host's cpu_adam pass (HostUpdater) or the device's kernel on the device Update stream
// (DeviceUpdater). update() writes the new compute copy to `param_out` and returns the event after
// which it is written (null: written already); finish() ends a walk (the device's stream synchronized).
class Updater {
 public:
  virtual ~Updater() = default;
  virtual EventHandle update(const cpu_adam::AdamStep& st, const cpu_adam::UpdateChunk& ch, void* param_out) = 0;
  virtual void finish() {}
};
std::unique_ptr<Updater> make_updater(EngineState& s);

class UpdatePipeline {
 public:
  UpdatePipeline(EngineState& s, OptimizerStates& states, GradientPath& grads);
  ~UpdatePipeline();

  // NVMe optimizer, overlap exact: starts the walk at the last micro batch's forward so that the
  // first sub-groups' SwapIn overlaps it; it waits for decide().
  void start_early();
  bool started_early() const { return decision_ != nullptr; }
  // The barrier's decision: for a walk started early, or for the speculation in flight (a step, or
  // nothing: the step is skipped). No-op otherwise.
  void decide(Decision d);
  // No step follows what is in flight (synchronize() mid-step, teardown, an error): a speculation
  // is undone — the states restored, the compute copies it rewrote rebuilt — without landing any
  // unit or issuing any collective; a walk started early passes the states by unchanged.
  void abandon();
  // Starts the speculative Update of this step (from the last micro batch's forward, on the worker):
  // `assumed` is the step without clipping; speculation stops once this rank's gradient norm so far
  // (loss-scaled, with `loss_scale`) is not finite or says `clip` (> 0) applies.
  void speculate(const cpu_adam::AdamStep& assumed, double loss_scale, double clip);
  bool speculating() const { return verdict_ != nullptr; }
  // Runs (or, overlap exact, starts) the Update of a finite step; `as_assumed`: it is the step a
  // speculation assumed, bit for bit, so its results are kept.
  void launch(const cpu_adam::AdamStep& st, bool as_assumed = false);
  // Counted on the trainer's thread when the verdict is given (so a step's report includes its own).
  std::int64_t rollbacks() const { return rollbacks_.load(); }
  std::int64_t speculated() const { return speculated_.load(); }  // sub-groups updated speculatively
  std::int64_t restored() const { return restored_.load(); }      // units rebuilt after a discarded speculation
  std::int64_t landed() const { return landed_.load(); }          // unit landings
  // The block sums of unit u's gradient if this step's speculative walk has computed them (for the
  // barrier, after every Reduce; the trainer's thread).
  bool known_sums(std::size_t u, std::vector<double>& out);

  void drain();  // waits for the pipeline in flight; rethrows its error
  void check();  // rethrows its error without waiting

 private:
  void run(const std::shared_future<Decision>& d);
  // The Update of [o, o+len) of unit u, its new compute copy into `param_out`: the event after which it
  // is written (null: written already).
  EventHandle update_chunk(Unit& u, std::size_t o, std::size_t len, const StateSlice& states,
                           const cpu_adam::AdamStep& st, void* param_out);
  void land(std::size_t u);
  struct Verdict {
    enum Kind { keep, redo, skip, abandon } kind = skip;
    Decision step;  // keep and redo: the step
  };
  void settle(Verdict v);
  // Skipped or abandoned: the tier's old states current again, and the compute copies speculation
  // `gen` rewrote rebuilt from them; those units' versions (held back by settle) are released.
  void restore(std::uint64_t gen, int& k);
  void run_speculative(const cpu_adam::AdamStep& assumed, double loss_scale, double clip, std::uint64_t gen,
                       const std::shared_future<Verdict>& verdict);
  // Writes unit u's new compute copy of [o, o+len) to its home's target and moves it home (Upload);
  // the unit lands later.
  void update_and_upload(Unit& u, std::size_t o, std::size_t len, const StateSlice& states,
                         const cpu_adam::AdamStep& st, int slot);

  EngineState& state_;
  OptimizerStates& states_;
  GradientPath& grads_;
  std::unique_ptr<std::promise<Decision>> decision_;
  // The speculation in flight: its verdict (set by the trainer's thread, read by the worker through
  // the future), and `decided_` under mu — set with it, so that a speculative walk waiting for a
  // gradient under the cv stops.
  std::unique_ptr<std::promise<Verdict>> verdict_;
  std::uint64_t generation_ = 0;  // speculations started (the trainer's thread)
  std::uint64_t decided_ = 0;     // under mu: the last speculation whose verdict is set
  std::atomic<std::int64_t> rollbacks_{0}, speculated_{0}, restored_{0}, landed_{0};
  // Under mu: the speculation that last let a sub-group of each unit be updated (its gate said yes
  // before the verdict); settle reads it once the verdict is set, when no more can be let through.
  std::vector<std::uint64_t> touched_by_;
  // Under mu: each unit's block sums as the speculative walk computed them, and the speculation they
  // belong to (handed from the update worker to the barrier by the mutex).
  std::vector<std::vector<double>> sums_;
  std::vector<std::uint64_t> sums_of_;
  Jitter jitter_;
  std::unique_ptr<Updater> updater_;
  std::unique_ptr<HostQueue> worker_;  // last: its jobs use everything above
};

}  // namespace zinf::offload::detail
