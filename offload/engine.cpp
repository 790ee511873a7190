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

#include <bit>
#include <cmath>
#include <optional>

#include "engine_state.h"
#include "gradient_path.h"
#include "param_window.h"
#include "tiers.h"
#include "update_pipeline.h"
#include "zinf/offload/placement.h"

namespace zinf::offload {

using namespace detail;

struct Engine::Impl {
  EngineState s;
  UploadSlots uploads;
  std::unique_ptr<OptimizerStates> states;
  std::unique_ptr<ParamHome> resident, offloaded;  // offloaded: the windowed units' home (null without windows)
  std::unique_ptr<ParamWindow> window;             // null without windowed units
  std::vector<nvme::TensorStore*> stores;          // the NVMe stores of the tiers (optimizer first)
  std::unique_ptr<GradientPath> grads;
  std::unique_ptr<UpdatePipeline> update;
  bool backward = false;
  bool training_micro = false;               // between begin_micro_batch and begin_backward
  std::optional<StepOptions> expected;       // expect_step's, until the speculation starts
  std::optional<cpu_adam::AdamStep> assumed;  // the step the speculation in flight assumes
  TierBytes held{};  // what the tiers handed out at construction

  Impl(const EngineConfig& c, Device& d) : s(c, d) {}
  void add_units(const InitFn& init);
  void start_update_early();  // the step's Update from its last micro batch on (SwapIn ahead, speculation)
};

// ---- sizes: the plan's byte model is the engine's ----------------------------------------------------

std::size_t Engine::device_bytes(const EngineConfig& c) {
  return make_plan(c.plan).totals[static_cast<int>(Tier::device)];
}
std::size_t Engine::pinned_bytes(const EngineConfig& c) { return make_plan(c.plan).pinned_pool; }

// ---- construction ------------------------------------------------------------------------------------

Engine::Engine(const EngineConfig& cfg, Device& dev, const InitFn& init) {
  const PlanInput& in = cfg.plan;
  ZINF_CHECK(!in.unit_params.empty() && in.persistent.size() == in.unit_params.size());
  ZINF_CHECK(in.stage >= 0 && in.stage <= 3);
  // The plan's ranks are the communicators' (one rank without them).
  ZINF_CHECK(in.world == (cfg.comm ? cfg.comm->size() : 1) && in.rank == (cfg.comm ? cfg.comm->rank() : 0));
  if (in.gradient_streaming) {  // before anything is allocated
    const std::string why = gradient_streaming_refusal(in.optimizer, in.overlap == Overlap::exact, in.world,
                                                       in.grad_accum, in.device_grad_accum, in.layer_major);
    if (!why.empty()) throw Error("offload engine: gradient_streaming " + why);
  }
  impl_ = std::make_unique<Impl>(cfg, dev);
  Impl& impl = *impl_;
  EngineState& s = impl.s;
  const EngineConfig& c = s.config;
  open_communicators(s);
  if (!c.kernels) throw Error("offload engine: no kernels for the device (EngineConfig::kernels is empty)");
  s.kern = c.kernels(dev, s.threads);
  check_placement(s.layout, s.kern->takes_states(s.layout.states));
  s.claim("Land(u)", "Forward(u)", Handoff::version);  // weights(u) waits for the landing (wait_landed)
  const Plan plan = make_plan(s.buffers);
  const std::size_t need_device = plan.totals[static_cast<int>(Tier::device)];
  if (need_device > dev.budget() - dev.in_use())
    throw DeviceMemoryError(
        "the offload plan needs " + std::to_string(need_device) + " bytes of device memory for states and windows, " +
            std::to_string(dev.budget() - dev.in_use()) + " are left in the budget of " + std::to_string(dev.budget()),
        "offload more (offload_optimizer / offload_param), raise device.memory_budget, or see `zinf plan`");
  s.pinned = std::make_unique<PinnedPool>(plan.pinned_pool, s.layout.pin_memory);
  // Registered only when page-locked (CUDA: one copy, no bounce); pageable staging (pin_memory false)
  // copies through the driver's own staging.
  if (s.pinned->capacity() && s.pinned->locked()) dev.register_host(s.pinned->slab().iov_base, s.pinned->capacity());

  const std::size_t device_before = dev.in_use();
  impl.states = make_optimizer_states(s);
  if (const BufferSpec* upload = s.find(Buffer::param_upload))
    for (std::uint64_t i = 0; i < upload->count; ++i) impl.uploads.buffer.push_back(s.pinned->acquire(upload->bytes));
  impl.uploads.copied.resize(2);
  impl.resident = make_device_home(s, impl.uploads);
  impl.offloaded = make_offload_home(s, impl.uploads);
  impl.grads = std::make_unique<GradientPath>(s);
  impl.add_units(init);
  if (s.find(Buffer::param_slot)) impl.window = std::make_unique<ParamWindow>(s, *impl.offloaded);
  impl.grads->allocate_shared();
  impl.grads->allocate_comm_scratch();
  impl.update = std::make_unique<UpdatePipeline>(s, *impl.states, *impl.grads);
  // What the tiers handed out (every buffer is allocated by now, for the engine's whole life).
  impl.held[static_cast<int>(Tier::device)] = dev.in_use() - device_before;
  // Without pin_memory the staging pool's pages are pageable host memory, as the plan counts them.
  impl.held[static_cast<int>(s.layout.pool_tier)] += s.pinned->in_use();
  impl.held[static_cast<int>(Tier::host)] += s.host_bytes;
  for (nvme::TensorStore* st : {impl.states->store(), impl.offloaded ? impl.offloaded->store() : nullptr,
                                impl.grads->stream() ? &impl.grads->stream()->store() : nullptr})
    if (st) impl.stores.push_back(st);
  for (nvme::TensorStore* st : impl.stores) impl.held[static_cast<int>(Tier::nvme)] += st->reserved();
}

// Each unit's buffers and states, in forward order, from its place in the layout.
void Engine::Impl::add_units(const InitFn& init) {
  const Layout& layout = s.buffers.layout();
  s.units.reserve(layout.units.size());
  for (std::size_t ui = 0; ui < layout.units.size(); ++ui) {
    // This unit's initial parameters, freed once placed: the host holds one unit's fp32 beside the
    // states placed so far, not the largest unit's beside every state.
    std::vector<float> master(layout.units[ui].n);
    Unit u;
    static_cast<UnitLayout&>(u) = layout.units[ui];
    u.index = ui;
    for (int r = 0; r < s.layout.world; ++r) u.bounds.push_back(shard_of(u.n, s.layout.world, r).lo);
    u.bounds.push_back(u.n);
    for (std::size_t o = u.state_range.lo; o < u.state_range.hi; o += s.layout.sub_group) u.chunks.push_back(o);
    const std::string name = "unit " + std::to_string(ui);
    init(ui, master.data());
    states->add(u, name, master.data());
    switch (s.stages.weights[ui]) {  // placed once: no stage asks again
      case StagePlan::Weights::resident: u.home = resident.get(); break;
      case StagePlan::Weights::window: u.home = offloaded.get(); break;
    }
    u.home->place(u, name, master.data());
    grads->add(u, name);
    s.units.push_back(std::move(u));
  }
}

Engine::~Engine() {
  if (!impl_) return;
  Impl& impl = *impl_;
  if (impl.update) impl.update->abandon();  // no landing, no collective: another rank may be gone
  try {
    if (impl.grads) impl.grads->drain();
  } catch (...) {
  }
  try {
    if (impl.update) impl.update->drain();
  } catch (...) {
  }
  try {
    impl.s.dev.synchronize();
  } catch (...) {
  }
  if (impl.s.pinned && impl.s.pinned->capacity() && impl.s.pinned->locked())
    impl.s.dev.unregister_host(impl.s.pinned->slab().iov_base);
}

// ---- the model's side -------------------------------------------------------------------------------

void Engine::expect_step(const StepOptions& o) { impl_->expected = o; }
void Engine::begin_micro_batch(std::int64_t micro) {
  ZINF_CHECK(!impl_->s.layout.layer_major);  // the layer-major order begins them together
  impl_->grads->begin_micro_batch(micro);
  impl_->training_micro = true;
}
void Engine::begin_micro_batches() {
  ZINF_CHECK(impl_->s.layout.layer_major);
  impl_->grads->begin_micro_batches();  // the last one has begun: its forward starts the Update early
  impl_->training_micro = true;
}
void Engine::micro_batch(std::int64_t micro) {
  ZINF_CHECK(impl_->s.layout.layer_major && micro >= 0 && micro < impl_->s.layout.grad_accum);
  impl_->grads->set_micro(micro);
}
// The last micro batch's forward starts the step's Update early: with the states on NVMe its SwapIn
// reads ahead under this forward (into the swapper's buffer_count buffers) instead of waiting for the
// backward; a speculative Update's sub-groups still wait for their gradients (the gate). Nothing
// of the step writes the states before the Update, and the previous step's walk finished first (the
// update worker is serial). An evaluation's forward (no begin_micro_batch) starts nothing.
void Engine::begin_forward() {
  impl_->backward = false;
  if (impl_->training_micro) impl_->start_update_early();
}
void Engine::begin_backward() {
  Impl& impl = *impl_;
  impl.backward = true;
  impl.start_update_early();  // already started by the forward unless the model skipped begin_forward
  impl.training_micro = false;
}

void Engine::Impl::start_update_early() {
  {
    std::lock_guard<std::mutex> lk(s.mu);
    if (s.update_failed) return;  // the next model-facing call reports the error; start nothing behind it
  }
  // The step's last micro batch only (in the layer-major order every micro batch's forward is the
  // last one's).
  if (!s.layout.layer_major && grads->micro() != s.layout.grad_accum - 1) return;
  for (StagePlan::EarlyStart e : s.stages.early) {
    switch (e) {
      case StagePlan::EarlyStart::speculate:
        if (!expected || update->speculating()) break;
        {
          // The step as the trainer expects it, unclipped: the speculative Update assumes it (step()
          // keeps its results only when the decided step is this one, bit for bit).
          const StepOptions& x = *expected;
          assumed = cpu_adam::make_adam_step(x.hyper, x.step, static_cast<float>(1.0 / x.loss_scale));
          update->speculate(*assumed, x.loss_scale, x.gradient_clipping);
          expected.reset();
        }
        return;
      case StagePlan::EarlyStart::swap_in:
        if (update->started_early() || update->speculating()) break;
        update->start_early();
        return;
    }
  }
}

const void* Engine::weights(std::size_t u) {
  Impl& impl = *impl_;
  impl.grads->check();
  impl.update->check();
  // The drain rethrows the pipeline's error; an Update started early for this step (it may have
  // been queued behind the one that failed) is abandoned first, or the drain would wait for a
  // decision this thread was to make.
  impl.s.wait_landed(u, [&] {
    impl.update->abandon();
    impl.update->drain();
  });
  Unit& unit = impl.s.units[u];
  switch (impl.s.stages.weights[u]) {
    case StagePlan::Weights::resident:
      model_waits_for(impl.s.dev, unit.landed);  // the landing's h2d work (its Uploads, the fp32 weights)
      if (unit.gather_pending) {  // the other ranks' parts of its new copy, gathered in the trainer's order of use
        impl.resident->finish_landing(unit);
        model_waits_for(impl.s.dev, impl.s.dev.record(StreamRole::h2d));
      }
      return unit.weights;
    case StagePlan::Weights::window: return impl.window->acquire(u, impl.backward);
  }
  throw Error("offload: unknown weights placement");
}

Precision Engine::weights_precision() const { return impl_->s.stages.weights_precision; }

void Engine::done_with(std::size_t u) {
  switch (impl_->s.stages.weights[u]) {
    case StagePlan::Weights::resident: return;
    case StagePlan::Weights::window: return impl_->window->release(u);
  }
}

float* Engine::grads(std::size_t u) { return impl_->grads->grads(u); }
void Engine::grads_done(std::size_t u) { impl_->grads->grads_done(u); }

// ---- the step: the norm barrier and the decision ----------------------------------------------------

namespace {
// Two steps that update every element identically: every scalar equal bit for bit.
bool same_step(const cpu_adam::AdamStep& a, const cpu_adam::AdamStep& b) {
  auto bits = [](float x) { return std::bit_cast<std::uint32_t>(x); };
  return bits(a.beta1) == bits(b.beta1) && bits(a.one_minus_beta1) == bits(b.one_minus_beta1) &&
         bits(a.beta2) == bits(b.beta2) && bits(a.one_minus_beta2) == bits(b.one_minus_beta2) &&
         bits(a.eps) == bits(b.eps) && bits(a.step_size) == bits(b.step_size) &&
         bits(a.bc2_rsqrt) == bits(b.bc2_rsqrt) && bits(a.decay) == bits(b.decay) && a.apply_decay == b.apply_decay &&
         a.decoupled == b.decoupled && bits(a.grad_scale) == bits(b.grad_scale);
}
}  // namespace

StepOutcome Engine::step(const StepOptions& o) {
  Impl& impl = *impl_;
  try {
    impl.grads->drain();  // the barrier: every gradient is in its Update buffer
  } catch (...) {
    impl.update->abandon();  // an early-started Update or a speculation must not wait forever
    throw;
  }
  const auto t0 = Clock::now();
  double sumsq = 0;
  bool finite = true;
  // Every unit's blocks, one wait for the device; those the speculative Update summed already as they are.
  const auto parts = impl.grads->block_sums([&](std::size_t u, std::vector<double>& sums) {
    return impl.update->known_sums(u, sums);
  });
  if (impl.s.stages.norm_sum == StagePlan::NormSum::local) {
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
    std::vector<std::size_t> counts(static_cast<std::size_t>(impl.s.layout.world), 0);
    auto blocks = [](std::size_t a, std::size_t b) {
      return (b - a + cpu_adam::kNormBlock - 1) / cpu_adam::kNormBlock;
    };
    for (std::size_t ui = 0; ui < impl.s.units.size(); ++ui) {
      mine.insert(mine.end(), parts[ui].begin(), parts[ui].end());
      const Unit& u = impl.s.units[ui];
      for (std::size_t r = 0; r < counts.size(); ++r) counts[r] += blocks(u.bounds[r], u.bounds[r + 1]);
    }
    std::vector<double> all;
    for (auto c : counts) all.resize(all.size() + c);
    std::size_t at = 0;
    for (std::size_t r = 0; r < static_cast<std::size_t>(impl.s.layout.rank); ++r) at += counts[r];
    std::copy(mine.begin(), mine.end(), all.begin() + static_cast<std::ptrdiff_t>(at));
    impl.s.front_comm->allgatherv(all.data(), counts, sizeof(double));
    std::vector<std::size_t> next(counts.size(), 0);  // each rank's read position, rank-major
    for (std::size_t r = 1; r < counts.size(); ++r) next[r] = next[r - 1] + counts[r - 1];
    for (auto& u : impl.s.units) {
      double part = 0;
      for (std::size_t r = 0; r < counts.size(); ++r)
        for (std::size_t k = blocks(u.bounds[r], u.bounds[r + 1]); k > 0; --k) part += all[next[r]++];
      sumsq += part;
      finite = finite && std::isfinite(part);
    }
  }
  impl.s.add_host_time(t0, "Norm");
  StepOutcome out;
  out.norm = std::sqrt(sumsq) / o.loss_scale;
  out.finite = finite && std::isfinite(out.norm);
  if (!out.finite) {
    // Skipped: nothing lands. A speculation is undone; the units whose compute copies it rewrote
    // are held back until they are rebuilt (UpdatePipeline::settle), the others stay current.
    impl.assumed.reset();
    impl.update->decide(std::nullopt);
    return out;
  }
  double combined = o.loss_scale;  // DeepSpeed: loss_scale × max(1, (norm + 1e-6) / clip)
  if (o.gradient_clipping > 0) {
    const double coef = (out.norm + 1e-6) / o.gradient_clipping;
    if (coef > 1) combined *= coef;
  }
  const cpu_adam::AdamStep st = cpu_adam::make_adam_step(o.hyper, o.step, static_cast<float>(1.0 / combined));
  const bool as_assumed = impl.assumed && same_step(st, *impl.assumed);
  impl.assumed.reset();
  {
    std::lock_guard<std::mutex> lk(impl.s.mu);
    ++impl.s.applied;
  }
  impl.update->launch(st, as_assumed);
  return out;
}

void Engine::synchronize() {
  Impl& impl = *impl_;
  // A pipeline started for a step that never came finishes unchanged: a speculation is abandoned
  // (its states restored without a landing or a collective, so a rank may do this alone).
  impl.update->abandon();
  impl.assumed.reset();
  impl.grads->drain();
  impl.update->drain();
  for (auto& u : impl.s.units)  // every compute copy whole again (every rank calls this at the same point)
    if (u.gather_pending) impl.resident->finish_landing(u);
  impl.s.dev.synchronize();
}

// ---- checkpoints ----------------------------------------------------------------------------------

bool Engine::states_partitioned() const { return impl_->s.layout.shard_states; }

void Engine::read_master(std::size_t u, float* dst) { read_states(u, dst, nullptr, nullptr); }

void Engine::read_states(std::size_t ui, float* master, float* m, float* v) {
  synchronize();
  Impl& impl = *impl_;
  Unit& u = impl.s.units[ui];
  impl.states->read(u, master, m, v);
  if (impl.s.stages.state_read == StagePlan::StateRead::whole) return;
  const auto counts = u.counts_in(0, u.n);  // every rank's shard, gathered into the whole unit
  for (float* p : {master, m, v})
    if (p) impl.s.front_comm->allgatherv(p, counts, 4);
}

void Engine::write_states(std::size_t ui, const float* master, const float* m, const float* v) {
  synchronize();
  Impl& impl = *impl_;
  Unit& u = impl.s.units[ui];
  impl.states->write(u, master, m, v);
  u.home->rebuild(u, master);  // the compute copy, exactly as the Update would write it
  std::lock_guard<std::mutex> lk(impl.s.mu);
  ++impl.s.applied;  // every window slot is stale now; all units are current at the new version
  for (auto& other : impl.s.units) other.version = impl.s.applied;
}

// ---- reports ---------------------------------------------------------------------------------------

BusyTimes Engine::take_times() {
  Impl& impl = *impl_;
  std::lock_guard<std::mutex> lk(impl.s.times_mu);
  BusyTimes t = impl.s.times;
  ++impl.s.times_window;
  // Stream work as the device measured it where it ran; the model's compute too when its ops are
  // stream work (otherwise the trainer reports the host time it spent in them).
  t.h2d += impl.s.dev.take_busy(StreamRole::h2d);
  t.d2h += impl.s.dev.take_busy(StreamRole::d2h);
  if (impl.s.dev.ops_stream_ordered()) t.compute += impl.s.dev.take_busy(StreamRole::compute);
  for (const nvme::DiskUse& d : impl.s.disks.take())
    t.disks.push_back({d.name, d.busy, d.read, d.write, static_cast<double>(d.read_bytes),
                       static_cast<double>(d.write_bytes)});
  impl.s.times = BusyTimes{};
  return t;
}

void Engine::add_compute_time(double sec) { impl_->s.add_time(&BusyTimes::compute, sec); }
std::size_t Engine::pinned_capacity() const { return impl_->s.pinned->capacity(); }
std::size_t Engine::pinned_peak() const { return impl_->s.pinned->peak(); }
TierBytes Engine::held_bytes() const { return impl_->held; }
std::int64_t Engine::rollbacks() const { return impl_->update->rollbacks(); }
SpeculationCounts Engine::speculation_counts() const {
  const UpdatePipeline& u = *impl_->update;
  return {u.speculated(), u.rollbacks(), u.restored(), u.landed()};
}

const StepGraph& Engine::dataflow() const { return impl_->s.graph; }

std::vector<std::string> Engine::unclaimed_handoffs() const {
  const EngineState& s = impl_->s;
  std::vector<std::string> out;
  for (std::size_t i = 0; i < s.graph.edges.size(); ++i) {
    const DataflowEdge& e = s.graph.edges[i];
    if (e.engine && !s.claimed[i])
      out.push_back(s.graph.nodes[static_cast<std::size_t>(e.from)].name + " -> " +
                    s.graph.nodes[static_cast<std::size_t>(e.to)].name + " (" + handoff_name(e.handoff) + ")");
  }
  return out;
}

std::string Engine::describe() const {
  Impl& impl = *impl_;
  std::string d = describe_placement(impl.s.layout, impl.s.pinned->capacity());
  nvme::TensorStore* stores[] = {impl.states->store(), impl.offloaded ? impl.offloaded->store() : nullptr};
  if (stores[0]) d += "; optimizer store: " + stores[0]->description();
  if (stores[1]) d += "; param store: " + stores[1]->description();
  for (auto* st : impl.stores)
    for (const auto& line : st->stale_report()) d += "; stale swap directory " + line;
  return d;
}

}  // namespace zinf::offload
