// update_pipeline.h — the update pipeline (internal to zinf_offload): after the norm barrier, every
// sub-group in forward order goes through
//   SwapIn   its master|m|v come in (NVMe tier only; read ahead, from the last backward on)
//   Update   one fused cpu_adam pass (or the device's kernel when the states live on the device):
//            unscale · clip · Adam(W) · the new compute copy
//   Upload   the compute copy goes home: into the device (h2d), pinned memory, or NVMe
//   SwapOut  master|m|v go back (NVMe tier only; written behind)
// and each unit "lands" when its last sub-group is home: version[u] = applied, which the next
// forward's weights(u) waits for. Runs on the update worker (overlap exact) or inline.
#pragma once

#include <future>
#include <memory>

#include "gradient_path.h"
#include "tiers.h"
#include "zinf/jitter.h"
#include "zinf/serial_worker.h"

namespace zinf::offload::detail {

class UpdatePipeline {
 public:
  UpdatePipeline(EngineState& s, OptimizerStates& states, ParamHome& resident, ParamHome* offloaded,
                 GradientPath& grads);
  ~UpdatePipeline();

  // NVMe optimizer, overlap exact: starts the walk at the last micro batch's backward so that the
  // first sub-groups' SwapIn overlaps it; it waits for decide().
  void start_early();
  bool started_early() const { return decision_ != nullptr; }
  void decide(Decision d);  // the barrier's decision for a walk started early (no-op otherwise)
  // Runs (or, overlap exact, starts) the Update of a finite step.
  void launch(const cpu_adam::AdamStep& st);

  void drain();  // waits for the pipeline in flight; rethrows its error
  void check();  // rethrows its error without waiting

 private:
  void push(std::function<void()> job);  // a failure wakes everyone waiting for a landing
  void run(const std::shared_future<Decision>& d);
  void update_chunk(Unit& u, std::size_t o, std::size_t len, const StateSlice& states, const cpu_adam::AdamStep& st,
                    void* param_out);
  ParamHome& home_of(const Unit& u) { return u.windowed ? *offloaded_ : resident_; }
  void land(std::size_t u);

  EngineState& state_;
  OptimizerStates& states_;
  ParamHome& resident_;
  ParamHome* offloaded_;
  GradientPath& grads_;
  std::unique_ptr<std::promise<Decision>> decision_;
  Jitter jitter_;
  std::unique_ptr<SerialWorker> worker_;  // last: its jobs use everything above
};

}  // namespace zinf::offload::detail
