// update_pipeline.cpp — the update pipeline: SwapIn, Update, Upload, SwapOut (update_pipeline.h).
#include "update_pipeline.h"

#include <cmath>
#include <deque>
#include <utility>

namespace zinf::offload::detail {

UpdatePipeline::UpdatePipeline(EngineState& s, OptimizerStates& states, GradientPath& grads)
    : state_(s),
      states_(states),
      grads_(grads),
      jitter_(s.dev.jitter(), 12) {
  auto on_start = [this] {
    state_.dev.bind_thread();
    state_.name_thread("Update worker");
  };
  // A failure wakes everyone waiting for a landing.
  auto on_error = [this] {
    {
      std::lock_guard<std::mutex> lk(state_.mu);
      state_.update_failed = true;
    }
    state_.cv.notify_all();
  };
  worker_ = std::make_unique<HostQueue>(s.exact(), [this] { jitter_.delay(); }, on_start, on_error);
  updater_ = make_updater(s);
}

UpdatePipeline::~UpdatePipeline() {
  abandon();  // a walk or a speculation started for a step that never came finishes unchanged
  try {
    worker_->drain();
  } catch (...) {
  }
}

void UpdatePipeline::start_early() {
  decision_ = std::make_unique<std::promise<Decision>>();
  auto fut = decision_->get_future().share();
  worker_->push([this, fut] { run(fut); });  // SwapIn of the first sub-groups starts now
}

void UpdatePipeline::speculate(const cpu_adam::AdamStep& assumed, double loss_scale, double clip) {
  verdict_ = std::make_unique<std::promise<Verdict>>();
  auto fut = verdict_->get_future().share();
  const std::uint64_t gen = ++generation_;
  if (GradientStream* gs = grads_.stream()) gs->open(gen);  // the Reduce keeps each unit's ring slot for this walk
  worker_->push([this, assumed, loss_scale, clip, gen, fut] { run_speculative(assumed, loss_scale, clip, gen, fut); });
}

// The verdict goes to the worker through the promise; decided_ (under mu, with a notify) wakes a
// speculative walk that waits for a gradient, so that it stops. Once decided_ is set no gate lets
// another sub-group through, so the units this speculation touched are known here, on the trainer's
// thread: a rollback is counted in the step that has it, and the units whose compute copies a
// skipped or abandoned step must rebuild are held back (version kRestoring) until restore() has —
// the next forward waits for those alone.
void UpdatePipeline::settle(Verdict v) {
  {
    std::lock_guard<std::mutex> lk(state_.mu);
    decided_ = generation_;
    if (v.kind != Verdict::keep) {
      bool any = false;
      for (std::size_t ui = 0; ui < touched_by_.size(); ++ui) {
        if (touched_by_[ui] != generation_) continue;
        any = true;
        if (v.kind != Verdict::redo) state_.units[ui].version = kRestoring;
      }
      if (any && v.kind != Verdict::abandon) ++rollbacks_;
    }
  }
  verdict_->set_value(std::move(v));
  verdict_.reset();
  state_.cv.notify_all();
}

bool UpdatePipeline::known_sums(std::size_t u, std::vector<double>& out) {
  std::lock_guard<std::mutex> lk(state_.mu);
  if (!verdict_ || u >= sums_of_.size() || sums_of_[u] != generation_) return false;
  out = sums_[u];
  return true;
}

void UpdatePipeline::decide(Decision d) {
  if (verdict_) return settle({d ? Verdict::redo : Verdict::skip, d});
  if (decision_) {
    decision_->set_value(d);
    decision_.reset();
  }
}

void UpdatePipeline::abandon() {
  if (verdict_) return settle({Verdict::abandon, std::nullopt});
  decide(std::nullopt);  // a walk started early: the states pass through unchanged, nothing lands
}

void UpdatePipeline::launch(const cpu_adam::AdamStep& st, bool as_assumed) {
  if (verdict_) return settle({as_assumed ? Verdict::keep : Verdict::redo, st});
  if (decision_) return decide(st);
  std::promise<Decision> p;
  p.set_value(st);
  auto fut = p.get_future().share();
  worker_->run([this, fut] { run(fut); });  // on the worker (overlap exact) or now
}

void UpdatePipeline::drain() { worker_->drain(); }
void UpdatePipeline::check() { worker_->check(); }

void UpdatePipeline::run(const std::shared_future<Decision>& d) {
  int k = 0;             // alternates the two upload slots
  std::size_t next = 0;  // units land in order, each once its sub-groups (possibly none: an empty shard) are home
  auto land_through = [&](std::size_t ui) {
    while (next <= ui) land(next++);
  };
  // Units whose last sub-group is updated, in order, each with the event that says the Updater has
  // written it (null: written already, by the host). A unit lands — in order — once the host has
  // seen its event complete: polled after every sub-group, waited for at the end of the walk.
  std::deque<std::pair<std::size_t, EventHandle>> updated;
  auto land_updated = [&](bool wait) {
    while (!updated.empty() && (wait || !updated.front().second || updated.front().second->done())) {
      if (updated.front().second) updated.front().second->wait();
      land_through(updated.front().first);
      updated.pop_front();
    }
  };
  states_.update_walk(d, [&](std::size_t ui, std::size_t o, std::size_t len, const StateSlice& states,
                             const cpu_adam::AdamStep& st) {
    Unit& u = state_.units[ui];
    // The units before this one are complete once their own events are (a speculative Update may
    // have done all of a unit's sub-groups already: the walk passes them by).
    if (ui > 0) updated.emplace_back(ui - 1, nullptr);
    ParamHome& home = *u.home;
    const int slot = k++ % 2;
    void* out = home.update_target(u, o, slot);
    EventHandle written = update_chunk(u, o, len, states, st, out);
    home.land_chunk(u, o, len, slot, written);  // Upload
    if (o + len == u.state_range.hi) updated.emplace_back(ui, std::move(written));
    land_updated(false);
  });
  // The device's Update is enqueued faster than its stream runs it: the units land one by one as
  // their events complete, so the next forward starts on the first unit while the device still
  // updates the others. Then the Updater finishes (the device's stream synchronized, where an error
  // of its work surfaces on a device whose events carry none).
  land_updated(true);
  updater_->finish();
  if (d.get() && !state_.units.empty()) land_through(state_.units.size() - 1);
}

void UpdatePipeline::run_speculative(const cpu_adam::AdamStep& assumed, double loss_scale, double clip,
                                     std::uint64_t gen, const std::shared_future<Verdict>& verdict) {
  const std::size_t n_units = state_.units.size();
  std::vector<OptimizerStates::SubGroupRef> order;  // the order the backward's Reduces finish in
  for (std::size_t ui = n_units; ui-- > 0;)
    for (std::size_t ci = 0; ci < state_.units[ui].chunks.size(); ++ci) order.emplace_back(ui, ci);
  std::vector<char> summed(n_units, 0);
  double sumsq = 0;  // this rank's gradient so far, loss-scaled, units in the order reduced
  bool stop = false;
  int k = 0;  // alternates the two upload slots
  GradientStream* const stream = grads_.stream();
  struct Close {  // however the walk ends, the ring's slots go back to the Reduce
    GradientStream* g;
    std::uint64_t gen;
    ~Close() {
      if (g) g->close(gen);
    }
  } close{stream, gen};
  // Each sub-group waits until its unit's last Reduce has finished (the host gradient is handed over
  // by mu, see Unit::reduced); nothing of the backward reads the states or the home it rewrites then.
  auto gate = [&](std::size_t i) {
    const std::size_t ui = order[i].first;
    Unit& u = state_.units[ui];
    if (stop) return false;
    {
      std::unique_lock<std::mutex> lk(state_.mu);
      state_.cv.wait(lk, [&] { return u.reduced || decided_ >= gen || (stream && stream->blocked_locked(u)); });
      if (decided_ >= gen) return false;  // the rest waits for the decision's walk
      if (stream && !stream->held_locked(u)) {  // its gradient will not come through the ring: stop here
        stop = true;
        stream->close_locked(gen);
        lk.unlock();
        state_.cv.notify_all();
        return false;
      }
    }
    if (!summed[ui]) {
      summed[ui] = 1;
      const auto t0 = Clock::now();
      auto [g, type] = grads_.update_input(u);
      std::vector<double> sums = cpu_adam::sum_squares_parts(state_.threads, g, type, u.grad_range.len());
      double part = 0;
      for (double p : sums) part += p;
      sumsq += part;
      state_.add_host_time(t0, "Norm part", static_cast<std::int64_t>(ui));
      {  // for the barrier, which need not sum this unit again
        std::lock_guard<std::mutex> lk(state_.mu);
        if (sums_.size() < n_units) sums_.resize(n_units), sums_of_.resize(n_units, 0);
        sums_[ui] = std::move(sums);
        sums_of_[ui] = gen;
      }
      // The norm can only grow: once what is summed already clips (or is not finite), the step will.
      if (!std::isfinite(part) || (clip > 0 && std::sqrt(sumsq) / loss_scale + 1e-6 > clip)) stop = true;
    }
    if (stop) return false;
    // The sub-group goes ahead: its unit is marked touched in the same hold of mu as the check that
    // no verdict has come, so settle() sees every unit a speculation may rewrite.
    std::lock_guard<std::mutex> lk(state_.mu);
    if (decided_ >= gen) return false;
    if (touched_by_.size() < n_units) touched_by_.resize(n_units, 0);
    touched_by_[ui] = gen;
    return true;
  };
  states_.speculate(order, gate, assumed,
                    [&](std::size_t ui, std::size_t o, std::size_t len, const StateSlice& states,
                        const cpu_adam::AdamStep& st) {
                      update_and_upload(state_.units[ui], o, len, states, st, k++ % 2);
                      ++speculated_;
                      // the unit's last sub-group: its ring slot goes back to the Reduce
                      if (stream && o + len == state_.units[ui].state_range.hi) stream->consumed(state_.units[ui]);
                    });
  if (stream) stream->close(gen);  // the rest reads its gradients back from NVMe
  const Verdict v = verdict.get();
  auto walk = [&](const cpu_adam::AdamStep& st) {
    std::promise<Decision> p;
    p.set_value(st);
    run(p.get_future().share());
  };
  switch (v.kind) {
    case Verdict::keep:  // the speculative versions are the step's: the walk does the rest and lands every unit
      states_.commit();
      return walk(*v.step);
    case Verdict::redo:  // another step (clipped): everything again, from the old states
      states_.rollback(nullptr);
      return walk(*v.step);
    case Verdict::skip:
    case Verdict::abandon: return restore(gen, k);
  }
}

// Nothing of the step is applied, so nothing lands: a unit speculation did not reach is as it was,
// and one it did is the old one again once its rewritten chunks are rebuilt — every rank's part of
// a whole unit is then the old one, so there is nothing to gather either. This issues no collective
// (one rank may abandon while another never speculated), and leaves every window slot current.
void UpdatePipeline::restore(std::uint64_t gen, int& k) {
  OptimizerStates::SubGroupFn rewrite = [&](std::size_t ui, std::size_t o, std::size_t len, const StateSlice& states,
                                            const cpu_adam::AdamStep&) {
    Unit& u = state_.units[ui];
    ParamHome& home = *u.home;
    const int slot = k++ % 2;
    void* out = home.update_target(u, o, slot);
    state_.to_compute(states.master, out, len);  // as the Update writes it
    home.land_chunk(u, o, len, slot, nullptr);
  };
  states_.rollback(&rewrite);
  std::vector<std::size_t> held;
  {
    std::lock_guard<std::mutex> lk(state_.mu);
    for (std::size_t ui = 0; ui < touched_by_.size(); ++ui)
      if (touched_by_[ui] == gen && state_.units[ui].version == kRestoring) held.push_back(ui);
  }
  for (std::size_t ui : held) {
    Unit& u = state_.units[ui];
    u.home->restored(u);
    {
      std::lock_guard<std::mutex> lk(state_.mu);
      u.version = state_.applied;
    }
    ++restored_;
    state_.cv.notify_all();
  }
}

void UpdatePipeline::update_and_upload(Unit& u, std::size_t o, std::size_t len, const StateSlice& states,
                                       const cpu_adam::AdamStep& st, int slot) {
  ParamHome& home = *u.home;
  void* out = home.update_target(u, o, slot);
  EventHandle written = update_chunk(u, o, len, states, st, out);
  home.land_chunk(u, o, len, slot, written);
}

EventHandle UpdatePipeline::update_chunk(Unit& u, std::size_t o, std::size_t len, const StateSlice& states,
                                         const cpu_adam::AdamStep& st, void* param_out) {
  auto [g, type] = grads_.update_input(u);
  cpu_adam::UpdateChunk ch;
  ch.n = len;
  ch.grad = static_cast<const char*>(g) + (o - u.grad_range.lo) * (type == cpu_adam::GradType::fp32 ? 4 : 2);
  ch.grad_type = type;
  ch.master = states.master;
  ch.m = states.m;
  ch.v = states.v;
  ch.m_scale = states.m_scale;
  ch.v_scale = states.v_scale;
  ch.states = state_.layout.states;
  ch.param16 = state_.format->update_half(param_out);
  ch.param16_type = state_.half;
  const auto t0 = Clock::now();
  EventHandle written = updater_->update(st, ch, param_out);
  state_.add_host_time(t0, "Update", static_cast<std::int64_t>(u.index));
  return written;
}

// ---- the Updaters: where a sub-group's Update runs, chosen once (StagePlan::updater) ---------------------

namespace {

// The states in host memory or on NVMe: cpu_adam's fused pass on the host threads.
class HostUpdater : public Updater {
 public:
  explicit HostUpdater(EngineState& s) : s_(s) {}
  EventHandle update(const cpu_adam::AdamStep& st, const cpu_adam::UpdateChunk& ch, void* param_out) override {
    cpu_adam::adam_update(s_.threads, st, ch);
    if (!ch.param16 && param_out != ch.master) std::memcpy(param_out, ch.master, ch.n * 4);  // fp32 runs
    return nullptr;
  }

 private:
  EngineState& s_;
};

// The states on the device: the device's fused Update, enqueued on the device Update stream
// (kDeviceUpdateStream) back to back, with no wait between sub-groups. What it writes (the unit's
// master, m, v and compute copy, or its home in pinned memory) is read next by other streams and by
// other threads once the unit has landed (the gather and the fp32 working weights on h2d, the model
// on compute, a Fetch from the pinned home); so every sub-group records an event behind its work —
// the unit lands once its last one has completed, and a home that reads the target on the host (the
// NVMe home's write to disk) waits for it in land_chunk.
class DeviceUpdater : public Updater {
 public:
  explicit DeviceUpdater(EngineState& s) : s_(s) {}
  EventHandle update(const cpu_adam::AdamStep& st, const cpu_adam::UpdateChunk& ch, void* param_out) override {
    s_.kern->adam_update(st, ch, kDeviceUpdateStream);
    if (!ch.param16 && param_out != ch.master) s_.kern->copy(param_out, ch.master, ch.n * 4, kDeviceUpdateStream);
    return s_.dev.record(kDeviceUpdateStream);
  }
  void finish() override { s_.dev.synchronize(kDeviceUpdateStream); }

 private:
  EngineState& s_;
};

}  // namespace

std::unique_ptr<Updater> make_updater(EngineState& s) {
  switch (s.stages.updater) {
    case StagePlan::Updater::host:
      s.claim("Norm", "Update(g)", Handoff::host_wait);        // the decision's future
      s.claim("Update(g)", "Land(u)", Handoff::stream_order);  // the worker updates, then lands
      return std::make_unique<HostUpdater>(s);
    case StagePlan::Updater::device:
      s.claim("Norm", "Update(g)", Handoff::enqueued_after);  // the worker takes the decision, then enqueues
      s.claim("Update(g)", "Land(u)", Handoff::host_wait);    // the unit's last event, waited on before it lands
      return std::make_unique<DeviceUpdater>(s);
  }
  throw Error("offload: unknown Update placement");
}

void UpdatePipeline::land(std::size_t ui) {
  Unit& u = state_.units[ui];
  u.home->land_unit(u);
  ++landed_;
  {
    std::lock_guard<std::mutex> lk(state_.mu);
    u.version = state_.applied;
  }
  state_.cv.notify_all();
}

}  // namespace zinf::offload::detail
