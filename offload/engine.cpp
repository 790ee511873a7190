// engine.cpp — the offload engine's front (zinf/offload/engine.h): construction, the calls the
// model and the trainer make, and the norm barrier. The stages are in their own files (see
// engine_state.h for the map): param_window.cpp (Fetch), gradient_path.cpp (GradOut, Reduce),
// update_pipeline.cpp (SwapIn, Update, Upload, SwapOut), and the tiers in optimizer_states.cpp and
// param_homes.cpp.
//
// A unit's life in one step:
//   forward   weights(u): resident → its buffer; windowed → a window slot, fetched (or prefetched)
//             from its home once u's previous update has landed
//   backward  grads(u): a zeroed fp32 device buffer (resident, or a gradient slot); grads_done(u):
//             GradOut + Reduce into the Update's input, behind the backward
//   step      barrier (every Reduce done) → norm over units in order → overflow/clip decision →
//             the update pipeline, which lands unit by unit; the next forward's weights(u) waits for
//             u's landing
// Every buffer is fixed in count and size and allocated in the constructor.
#include "zinf/offload/engine.h"

#include <cmath>

#include "engine_state.h"
#include "gradient_path.h"
#include "tiers.h"
#include "update_pipeline.h"
#include "param_window.h"
#include "zinf/offload/placement.h"

namespace zinf::offload {

using namespace detail;

struct Engine::Impl {
  EngineState s;
  UploadSlots uploads;
  std::unique_ptr<OptimizerStates> states;
  std::unique_ptr<ParamHome> resident, offloaded;  // offloaded: the windowed units' home (null without windows)
  std::unique_ptr<ParamWindow> window;             // null without windowed units
  std::unique_ptr<GradientPath> grads;
  std::unique_ptr<UpdatePipeline> update;
  bool backward = false;

  Impl(const EngineConfig& c, Device& d) : s(c, d) {}
  ParamHome& home_of(const Unit& u) { return u.windowed ? *offloaded : *resident; }
};

// ---- sizes: the plan's byte model is the engine's ----------------------------------------------------

PlanInput Engine::plan_input(const EngineConfig& c) {
  PlanInput in;
  for (auto n : c.units) in.unit_params.push_back(static_cast<std::int64_t>(n));
  in.persistent = c.persistent;
  in.compute_bytes = c.precision == Precision::fp32 ? 4 : 2;
  in.optimizer = c.optimizer;
  in.param = c.param;
  in.grad_accum = c.grad_accum;
  in.sub_group_size = static_cast<std::int64_t>(c.sub_group_size);
  in.reduce_bucket_size = static_cast<std::int64_t>(c.reduce_bucket_size);
  in.optimizer_buffer_count = c.overlap == Overlap::exact ? c.optimizer_buffer_count : 1;
  in.prefetch_depth = c.prefetch_depth;
  in.fp32_work = true;  // the CPU device
  in.world = c.comm ? c.comm->size() : 1;
  in.rank = c.comm ? c.comm->rank() : 0;
  in.stage = c.stage;
  in.persistence_threshold = static_cast<std::int64_t>(c.persistence_threshold);
  return in;
}

std::size_t Engine::device_bytes(const EngineConfig& c) {
  return make_plan(plan_input(c)).totals[static_cast<int>(Tier::device)];
}
std::size_t Engine::pinned_bytes(const EngineConfig& c) { return make_plan(plan_input(c)).pinned_pool; }

// ---- construction ------------------------------------------------------------------------------------

Engine::Engine(const EngineConfig& cfg, Device& dev, const InitFn& init) {
  ZINF_CHECK(!cfg.units.empty() && cfg.persistent.size() == cfg.units.size());
  ZINF_CHECK(cfg.stage >= 0 && cfg.stage <= 3);
  impl_ = std::make_unique<Impl>(cfg, dev);
  Impl& m = *impl_;
  EngineState& s = m.s;
  const EngineConfig& c = s.c;
  if (s.parallel()) {  // one communicator per thread that runs collectives, in this order on every rank
    Comm& hc = *c.comm;
    Comm& dc = c.device_comm ? *c.device_comm : *c.comm;
    s.front_comm = hc.dup();
    s.reduce_comm = hc.dup();
    s.reduce_dcomm = dc.dup();
    s.update_comm = hc.dup();
    if (!s.ordered_collectives) s.update_dcomm = dc.dup();  // (ordered: the trainer gathers at first use instead)
    s.fetch_comm = hc.dup();
    s.fetch_dcomm = dc.dup();
  }
  if (!cfg.kernels) throw Error("offload engine: no kernels for the device (EngineConfig::kernels is empty)");
  s.kern = cfg.kernels(dev, s.threads);
  const Plan plan = make_plan(plan_input(c));
  const std::size_t need_device = plan.totals[static_cast<int>(Tier::device)];
  if (need_device > dev.budget() - dev.in_use())
    throw DeviceMemoryError("the offload plan needs " + std::to_string(need_device) + " bytes of device memory for states and windows, " +
                                std::to_string(dev.budget() - dev.in_use()) + " are left in the budget of " + std::to_string(dev.budget()),
                            "offload more (offload_optimizer / offload_param), raise device.memory_budget, or see `zinf plan`");
  s.pinned = std::make_unique<PinnedPool>(plan.pinned_pool, c.pin_memory);
  if (s.pinned->capacity()) dev.register_host(s.pinned->slab().iov_base, s.pinned->capacity());  // CUDA: one copy, no bounce

  const bool windows = s.param_offloaded || s.shard_params;  // some units visit a window slot
  // Units that stay whole and resident: the model's persistent ones, and (partitioned parameters)
  // those at or under the persistence threshold.
  auto kept = [&](std::size_t u) { return c.persistent[u] || (s.shard_params && c.units[u] <= c.persistence_threshold); };
  std::size_t max_unit = 0, max_windowed = 0, max_grad_windowed = 0;
  for (std::size_t u = 0; u < c.units.size(); ++u) {
    max_unit = std::max(max_unit, c.units[u]);
    if (windows && !kept(u)) max_windowed = std::max(max_windowed, c.units[u]);
    if (!c.persistent[u]) max_grad_windowed = std::max(max_grad_windowed, c.units[u]);  // (every non-persistent unit)
  }
  s.bucket = std::min(round_up(std::max<std::size_t>(c.reduce_bucket_size, 1), kChunkAlign), round_up(max_unit, kChunkAlign));
  s.sub_group = std::min(round_up(std::max<std::size_t>(c.sub_group_size, 1), kChunkAlign), round_up(max_unit, kChunkAlign));
  for (auto n : c.units)  // the receive scratch: every rank's contribution to this rank's part of a bucket
    s.comm_scratch = std::max<std::size_t>(s.comm_scratch, std::min<std::size_t>(s.bucket, shard_of(n, s.world, s.rank).len()));
  s.comm_scratch *= static_cast<std::size_t>(s.world);

  m.states = make_optimizer_states(s);
  if (s.optimizer_offloaded || c.param == OffloadDevice::nvme)
    for (int i = 0; i < 2; ++i) m.uploads.buffer.push_back(s.pinned->acquire(s.sub_group * s.compute_bytes));
  m.uploads.copied.resize(2);
  m.resident = make_device_home(s, m.uploads);
  m.offloaded = make_offload_home(s, m.uploads);
  m.grads = std::make_unique<GradientPath>(s);

  std::vector<float> master(max_unit);
  s.units.reserve(c.units.size());
  for (std::size_t ui = 0; ui < c.units.size(); ++ui) {
    Unit u;
    u.n = c.units[ui];
    u.windowed = windows && !kept(ui);
    // Off the device (or partitioned), a block's gradient only passes through a gradient slot.
    u.grad_windowed = (s.optimizer_offloaded || s.shard_grads) && !c.persistent[ui];
    for (int r = 0; r < s.world; ++r) u.bounds.push_back(shard_of(u.n, s.world, r).lo);
    u.bounds.push_back(u.n);
    const Shard mine = shard_of(u.n, s.world, s.rank);
    u.s_lo = s.shard_states ? mine.lo : 0, u.s_hi = s.shard_states ? mine.hi : u.n;
    u.g_lo = s.shard_grads ? mine.lo : 0, u.g_hi = s.shard_grads ? mine.hi : u.n;
    u.p_lo = s.shard_params && u.windowed ? mine.lo : 0, u.p_hi = s.shard_params && u.windowed ? mine.hi : u.n;
    for (std::size_t o = u.s_lo; o < u.s_hi; o += s.sub_group) u.chunks.push_back(o);
    const std::string name = "unit " + std::to_string(ui);
    init(ui, master.data());
    m.states->add(u, name, master.data());
    m.home_of(u).place(u, name, master.data());
    m.grads->add(u, name);
    s.units.push_back(std::move(u));
  }
  if (windows) m.window = std::make_unique<ParamWindow>(s, *m.offloaded, max_windowed);
  m.grads->allocate_shared(max_grad_windowed);
  m.grads->allocate_comm_scratch();
  m.update = std::make_unique<UpdatePipeline>(s, *m.states, *m.resident, m.offloaded.get(), *m.grads);
}

Engine::~Engine() {
  if (!impl_) return;
  Impl& m = *impl_;
  if (m.update) m.update->decide(std::nullopt);
  try {
    if (m.grads) m.grads->drain();
  } catch (...) {
  }
  try {
    if (m.update) m.update->drain();
  } catch (...) {
  }
  try {
    m.s.dev.synchronize();
  } catch (...) {
  }
  if (m.s.pinned && m.s.pinned->capacity()) m.s.dev.unregister_host(m.s.pinned->slab().iov_base);
}

// ---- the model's side -------------------------------------------------------------------------------

void Engine::begin_micro_batch(std::int64_t micro) { impl_->grads->begin_micro_batch(micro); }
void Engine::begin_forward() { impl_->backward = false; }
void Engine::begin_backward() {
  Impl& m = *impl_;
  m.backward = true;
  if (m.s.exact() && m.s.c.optimizer == OffloadDevice::nvme && m.grads->micro() == m.s.c.grad_accum - 1 && !m.update->started_early())
    m.update->start_early();
}

const float* Engine::weights(std::size_t u) {
  Impl& m = *impl_;
  m.grads->check();
  m.update->check();
  m.s.wait_landed(u, [&] { m.update->drain(); });  // the drain rethrows the pipeline's error
  Unit& unit = m.s.units[u];
  if (!unit.windowed) {
    if (unit.gather_pending) {  // the other ranks' parts of its new copy, gathered in the trainer's order of use
      m.resident->finish_landing(unit);
      model_waits_for(m.s.dev, m.s.dev.record(StreamRole::h2d));
    }
    return m.s.mixed ? unit.work.as<float>() : unit.param.as<float>();
  }
  return m.window->acquire(u, m.backward);
}

void Engine::done_with(std::size_t u) {
  if (impl_->s.units[u].windowed) impl_->window->release(u);
}

float* Engine::grads(std::size_t u) { return impl_->grads->grads(u); }
void Engine::grads_done(std::size_t u) { impl_->grads->grads_done(u); }

// ---- the step: the norm barrier and the decision ----------------------------------------------------

StepOutcome Engine::step(const StepOptions& o) {
  Impl& m = *impl_;
  try {
    m.grads->drain();  // the barrier: every gradient is in its Update buffer
  } catch (...) {
    m.update->decide(std::nullopt);  // an early-started Update must not wait forever
    throw;
  }
  const auto t0 = Clock::now();
  double sumsq = 0;
  bool finite = true;
  const auto parts = m.grads->block_sums();  // every unit's blocks, one wait for the device
  if (!m.s.shard_grads) {
    for (const auto& unit_parts : parts) {  // units in order, 64 Ki blocks in order: the same sum on every placement
      double part = 0;
      for (double p : unit_parts) part += p;
      sumsq += part;
      finite = finite && std::isfinite(part);
    }
  } else {
    // Each rank holds the reduced gradient of its shards only: their block sums are gathered and
    // added per unit in block order (shards start on block boundaries), then units in order, which
    // is the one-rank sum exactly.
    std::vector<double> mine;
    std::vector<std::size_t> counts(static_cast<std::size_t>(m.s.world), 0);
    auto blocks = [](std::size_t a, std::size_t b) { return (b - a + cpu_adam::kNormBlock - 1) / cpu_adam::kNormBlock; };
    for (std::size_t ui = 0; ui < m.s.units.size(); ++ui) {
      mine.insert(mine.end(), parts[ui].begin(), parts[ui].end());
      const Unit& u = m.s.units[ui];
      for (std::size_t r = 0; r < counts.size(); ++r) counts[r] += blocks(u.bounds[r], u.bounds[r + 1]);
    }
    std::vector<double> all;
    for (auto c : counts) all.resize(all.size() + c);
    std::size_t at = 0;
    for (std::size_t r = 0; r < static_cast<std::size_t>(m.s.rank); ++r) at += counts[r];
    std::copy(mine.begin(), mine.end(), all.begin() + static_cast<std::ptrdiff_t>(at));
    m.s.front_comm->allgatherv(all.data(), counts, sizeof(double));
    std::vector<std::size_t> next(counts.size(), 0);  // each rank's read position, rank-major
    for (std::size_t r = 1; r < counts.size(); ++r) next[r] = next[r - 1] + counts[r - 1];
    for (auto& u : m.s.units) {
      double part = 0;
      for (std::size_t r = 0; r < counts.size(); ++r)
        for (std::size_t k = blocks(u.bounds[r], u.bounds[r + 1]); k > 0; --k) part += all[next[r]++];
      sumsq += part;
      finite = finite && std::isfinite(part);
    }
  }
  m.s.add_time(&BusyTimes::host, since(t0));
  StepOutcome out;
  out.norm = std::sqrt(sumsq) / o.loss_scale;
  out.finite = finite && std::isfinite(out.norm);
  if (!out.finite) {
    m.update->decide(std::nullopt);
    return out;
  }
  double combined = o.loss_scale;  // DeepSpeed: loss_scale × max(1, (norm + 1e-6) / clip)
  if (o.gradient_clipping > 0) {
    const double coef = (out.norm + 1e-6) / o.gradient_clipping;
    if (coef > 1) combined *= coef;
  }
  const cpu_adam::AdamStep st = cpu_adam::make_adam_step(o.hyper, o.step, static_cast<float>(1.0 / combined));
  {
    std::lock_guard<std::mutex> lk(m.s.mu);
    ++m.s.applied;
  }
  m.update->launch(st);
  return out;
}

void Engine::synchronize() {
  Impl& m = *impl_;
  m.update->decide(std::nullopt);  // a pipeline started for a step that never came: let it finish unchanged
  m.grads->drain();
  m.update->drain();
  for (auto& u : m.s.units)  // every compute copy whole again (every rank calls this at the same point)
    if (u.gather_pending) m.resident->finish_landing(u);
  m.s.dev.synchronize();
}

// ---- checkpoints ----------------------------------------------------------------------------------

bool Engine::states_partitioned() const { return impl_->s.shard_states; }

void Engine::read_master(std::size_t u, float* dst) { read_states(u, dst, nullptr, nullptr); }

void Engine::read_states(std::size_t ui, float* master, float* m, float* v) {
  synchronize();
  Impl& e = *impl_;
  Unit& u = e.s.units[ui];
  e.states->read(u, master, m, v);
  if (!e.s.shard_states) return;
  const auto counts = u.counts_in(0, u.n);  // every rank's shard, gathered into the whole unit
  for (float* p : {master, m, v})
    if (p) e.s.front_comm->allgatherv(p, counts, 4);
}

void Engine::write_states(std::size_t ui, const float* master, const float* m, const float* v) {
  synchronize();
  Impl& e = *impl_;
  Unit& u = e.s.units[ui];
  e.states->write(u, master, m, v);
  e.home_of(u).rebuild(u, master);  // the compute copy, exactly as the Update would write it
  std::lock_guard<std::mutex> lk(e.s.mu);
  ++e.s.applied;  // every window slot is stale now; all units are current at the new version
  for (auto& other : e.s.units) other.version = e.s.applied;
}

// ---- reports ---------------------------------------------------------------------------------------

BusyTimes Engine::take_times() {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lk(m.s.times_mu);
  BusyTimes t = m.s.times;
  // Stream work as the device measured it where it ran; the model's compute too when its ops are
  // stream work (otherwise the trainer reports the host time it spent in them).
  t.h2d += m.s.dev.take_busy(StreamRole::h2d);
  t.d2h += m.s.dev.take_busy(StreamRole::d2h);
  if (m.s.dev.ops_stream_ordered()) t.compute += m.s.dev.take_busy(StreamRole::compute);
  for (nvme::TensorStore* st : {m.states->store(), m.offloaded ? m.offloaded->store() : nullptr})
    if (st) {
      t.nvme_read += st->take_busy(false);
      t.nvme_write += st->take_busy(true);
    }
  m.s.times = BusyTimes{};
  return t;
}

void Engine::add_compute_time(double sec) { impl_->s.add_time(&BusyTimes::compute, sec); }
std::size_t Engine::pinned_capacity() const { return impl_->s.pinned->capacity(); }
std::size_t Engine::pinned_peak() const { return impl_->s.pinned->peak(); }

std::string Engine::describe() const {
  Impl& m = *impl_;
  std::string d = "offload_optimizer=" + std::string(to_string(m.s.c.optimizer)) + " offload_param=" +
                  std::string(to_string(m.s.c.param)) + ", overlap " + (m.s.exact() ? "exact" : "none") + ", pinned pool " +
                  std::to_string(m.s.pinned->capacity()) + " bytes";
  if (m.s.parallel()) {
    d += "; rank " + std::to_string(m.s.rank) + " of " + std::to_string(m.s.world) + ", ZeRO stage " + std::to_string(m.s.c.stage);
    d += m.s.shard_params ? " (optimizer states, gradients and parameters partitioned)"
         : m.s.shard_grads ? " (optimizer states and gradients partitioned)"
         : m.s.shard_states ? " (optimizer states partitioned)"
                            : " (every state on every rank)";
  }
  nvme::TensorStore* stores[] = {m.states->store(), m.offloaded ? m.offloaded->store() : nullptr};
  if (stores[0]) d += "; optimizer store: " + stores[0]->description();
  if (stores[1]) d += "; param store: " + stores[1]->description();
  for (auto* st : stores)
    if (st)
      for (const auto& line : st->stale_report()) d += "; stale swap directory " + line;
  return d;
}

}  // namespace zinf::offload
