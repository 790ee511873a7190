// update_pipeline.cpp — the update pipeline: SwapIn, Update, Upload, SwapOut (update_pipeline.h).
#include "update_pipeline.h"

#include <cmath>
#include <deque>
#include <utility>

namespace zinf::offload::detail {

UpdatePipeline::UpdatePipeline(EngineState& s, OptimizerStates& states, ParamHome& resident, ParamHome* offloaded,
                               GradientPath& grads)
    : state_(s),
      states_(states),
      resident_(resident),
      offloaded_(offloaded),
      grads_(grads),
      jitter_(s.dev.jitter(), 12) {
  auto on_start = [this] {
    state_.dev.bind_thread();
    state_.name_thread("Update worker");
  };
  worker_ = std::make_unique<SerialWorker>([this] { jitter_.delay(); }, on_start);
}

UpdatePipeline::~UpdatePipeline() {
  abandon();  // a walk or a speculation started for a step that never came finishes unchanged
  try {
    worker_->drain();
  } catch (...) {
  }
}

void UpdatePipeline::push(std::function<void()> job) {
  worker_->push([this, job = std::move(job)] {
    try {
      job();
    } catch (...) {
      {
        std::lock_guard<std::mutex> lk(state_.mu);
        state_.update_failed = true;
      }
      state_.cv.notify_all();
      throw;
    }
  });
}

void UpdatePipeline::start_early() {
  decision_ = std::make_unique<std::promise<Decision>>();
  auto fut = decision_->get_future().share();
  push([this, fut] { run(fut); });  // SwapIn of the first sub-groups starts now
}

void UpdatePipeline::speculate(const cpu_adam::AdamStep& assumed, double loss_scale, double clip) {
  verdict_ = std::make_unique<std::promise<Verdict>>();
  auto fut = verdict_->get_future().share();
  const std::uint64_t gen = ++generation_;
  push([this, assumed, loss_scale, clip, gen, fut] { run_speculative(assumed, loss_scale, clip, gen, fut); });
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
  if (state_.exact())
    push([this, fut] { run(fut); });
  else
    run(fut);
}

void UpdatePipeline::drain() { worker_->drain(); }
void UpdatePipeline::check() { worker_->check(); }

void UpdatePipeline::run(const std::shared_future<Decision>& d) {
  int k = 0;             // alternates the two upload slots
  std::size_t next = 0;  // units land in order, each once its sub-groups (possibly none: an empty shard) are home
  auto land_through = [&](std::size_t ui) {
    while (next <= ui) land(next++);
  };
  // The device's own Update is d2h stream work: its sub-groups are enqueued back to back, with no
  // wait between them. What the Update writes on the device (the unit's master, m, v and compute
  // copy, or its home in pinned memory) is read next by other streams and by other threads once the
  // unit has landed (the gather and the fp32 working weights on h2d, the model on compute, a Fetch
  // from the pinned home); so the unit's last sub-group records an event on d2h, and the unit
  // lands — in order — only when the host has seen that event complete: polled between sub-groups,
  // waited for at the end of the walk. Every sub-group records one (land_chunk: a home that reads
  // the target on the host, as the NVMe home's write to disk, waits for it there).
  const bool on_device = !state_.layout.optimizer_offloaded;
  std::deque<std::pair<std::size_t, EventHandle>> updated;  // units whose last sub-group is enqueued
  auto land_updated = [&](bool wait) {
    while (!updated.empty() && (wait || updated.front().second->done())) {
      updated.front().second->wait();
      land_through(updated.front().first);
      updated.pop_front();
    }
  };
  states_.update_walk(d, [&](std::size_t ui, std::size_t o, std::size_t len, const StateSlice& states,
                             const cpu_adam::AdamStep& st) {
    Unit& u = state_.units[ui];
    // The units before this one are complete (a speculative Update may have done all of a unit's
    // sub-groups already: the walk passes them by).
    if (!on_device && ui > 0) land_through(ui - 1);
    ParamHome& home = home_of(u);
    const int slot = k++ % 2;
    void* out = home.update_target(u, o, slot);
    const auto t0 = Clock::now();
    update_chunk(u, o, len, states, st, out);
    state_.add_host_time(t0, "Update", static_cast<std::int64_t>(ui));
    // The device's Update: one event per sub-group, for a home that reads the target on the host.
    EventHandle written = on_device ? state_.dev.record(StreamRole::d2h) : nullptr;
    home.land_chunk(u, o, len, slot, written);  // Upload
    const bool last = o + len == u.state_range.hi;
    if (!on_device) {
      if (last) land_through(ui);
      return;
    }
    if (last) updated.emplace_back(ui, std::move(written));
    land_updated(false);
  });
  if (on_device) {
    // The walk enqueues faster than d2h runs it: the units land one by one as their events complete,
    // so the next forward starts on the first unit while the device still updates the others. Then
    // the stream is synchronized, where an error of its work surfaces on a device whose events carry
    // none (the CPU device: its tail units may have landed by then, as earlier ones could before; the
    // CUDA device's event wait reports the error already).
    land_updated(true);
    state_.dev.synchronize(StreamRole::d2h);
  }
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
  // Each sub-group waits until its unit's last Reduce has finished (the host gradient is handed over
  // by mu, see Unit::reduced); nothing of the backward reads the states or the home it rewrites then.
  auto gate = [&](std::size_t i) {
    const std::size_t ui = order[i].first;
    Unit& u = state_.units[ui];
    if (stop) return false;
    {
      std::unique_lock<std::mutex> lk(state_.mu);
      state_.cv.wait(lk, [&] { return u.reduced || decided_ >= gen; });
      if (decided_ >= gen) return false;  // the rest waits for the decision's walk
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
                    });
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
    ParamHome& home = home_of(u);
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
    home_of(u).restored(u);
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
  ParamHome& home = home_of(u);
  void* out = home.update_target(u, o, slot);
  const auto t0 = Clock::now();
  update_chunk(u, o, len, states, st, out);
  state_.add_host_time(t0, "Update", static_cast<std::int64_t>(u.index));
  home.land_chunk(u, o, len, slot, nullptr);  // the host wrote it: nothing to wait for
}

void UpdatePipeline::update_chunk(Unit& u, std::size_t o, std::size_t len, const StateSlice& states,
                                  const cpu_adam::AdamStep& st, void* param_out) {
  float* master = states.master;
  auto [g, type] = grads_.update_input(u);
  cpu_adam::UpdateChunk ch;
  ch.n = len;
  ch.grad = static_cast<const char*>(g) + (o - u.grad_range.lo) * (type == cpu_adam::GradType::fp32 ? 4 : 2);
  ch.grad_type = type;
  ch.master = master;
  ch.m = states.m;
  ch.v = states.v;
  ch.m_scale = states.m_scale;
  ch.v_scale = states.v_scale;
  ch.states = state_.layout.states;
  ch.param16 = state_.layout.mixed ? param_out : nullptr;
  ch.param16_type = state_.half;
  if (!state_.layout.optimizer_offloaded) {  // the states live on the device: the device's fused Update (run() waits)
    state_.kern->adam_update(st, ch, StreamRole::d2h);
    if (!state_.layout.mixed && param_out != master) state_.kern->copy(param_out, master, len * 4, StreamRole::d2h);
    return;
  }
  cpu_adam::adam_update(state_.threads, st, ch);
  if (!state_.layout.mixed && param_out != master) std::memcpy(param_out, master, len * 4);
}

void UpdatePipeline::land(std::size_t ui) {
  Unit& u = state_.units[ui];
  home_of(u).land_unit(u);
  ++landed_;
  {
    std::lock_guard<std::mutex> lk(state_.mu);
    u.version = state_.applied;
  }
  state_.cv.notify_all();
}

}  // namespace zinf::offload::detail
