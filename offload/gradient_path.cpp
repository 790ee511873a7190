// gradient_path.cpp — the gradient path: GradOut and Reduce (gradient_path.h).
#include "gradient_path.h"

namespace zinf::offload::detail {

// ---- the routes -----------------------------------------------------------------------------------------

class GradientPath::Route {
 public:
  explicit Route(GradientPath& p) : p_(p), s_(p.state_) {}
  virtual ~Route() = default;
  // At grads_done, on the trainer's thread: what must be issued there (nothing but for ordered collectives).
  virtual void on_trainer(Unit&, float*, std::int64_t, EventHandle&) {}
  // On the Reduce worker (or inline): GradOut and Reduce of the micro batch's gradient `g`, complete
  // at `complete` on the compute stream; d2h has read `g` when this returns.
  virtual void on_worker(Unit& u, float* g, std::int64_t micro, EventHandle complete) = 0;
  // After the step's last micro batch of unit u, on the worker: the norm's part, when the host sums it.
  virtual void norm_part(Unit&, std::uint64_t) {}
  virtual std::vector<std::vector<double>> block_sums(const std::function<bool(std::size_t, std::vector<double>&)>& known) = 0;
  // The receive scratch of the cross-rank reduction (several ranks), on the tier this route reduces on.
  virtual void allocate_receive(const BufferSpec& b) = 0;

 protected:
  GradientPath& p_;
  EngineState& s_;
};

// The optimizer on the device: the Update reads device buffers, so the gradient is rounded (and
// summed, and reduced across ranks) in place on d2h; one wait for the device gives every norm part.
class GradientPath::DeviceRoute : public Route {
 public:
  explicit DeviceRoute(GradientPath& p) : Route(p) {
    s_.claim("GradOut(u)", "Norm", Handoff::host_wait);
    s_.claim("GradOut(u)", "Update(g)", Handoff::stream_order);  // the device Update stream is d2h's queue
    s_.claim("Forward(u)", "Update(g)", Handoff::event);         // `complete`, waited on before the Update
  }
  void on_worker(Unit& u, float* g, std::int64_t micro, EventHandle complete) override {
    p_.enqueue_on_device(u, g, micro, std::move(complete));
    s_.dev.synchronize(StreamRole::d2h);
  }
  std::vector<std::vector<double>> block_sums(const std::function<bool(std::size_t, std::vector<double>&)>&) override {
    std::vector<EngineKernels::NormInput> in, nonempty;
    for (auto& u : s_.units) {
      auto [g, type] = p_.update_input(u);
      in.push_back({g, type, u.grad_range.len()});
    }
    for (const auto& x : in)  // a rank's empty shards have no blocks
      if (x.n) nonempty.push_back(x);
    auto sums = s_.kern->block_sums(nonempty, StreamRole::d2h);
    std::vector<std::vector<double>> out(in.size());
    for (std::size_t i = 0, k = 0; i < in.size(); ++i)
      if (in[i].n) out[i] = std::move(sums[k++]);
    return out;
  }
  void allocate_receive(const BufferSpec& b) override {
    p_.device_recv_ = DeviceBuffer(s_.dev, b.bytes, "gradient receive scratch");
  }
};

// The same with a stream-ordered transport: the Reduce's collectives are issued at grads_done, on the
// trainer's thread, in its order (zinf/offload/collectives.h); the worker then only waits for the
// stream and frees the buffer.
class GradientPath::OrderedDeviceRoute : public DeviceRoute {
 public:
  using DeviceRoute::DeviceRoute;
  void on_trainer(Unit& u, float* g, std::int64_t micro, EventHandle& complete) override {
    p_.enqueue_on_device(u, g, micro, std::move(complete));
  }
  void on_worker(Unit&, float*, std::int64_t, EventHandle) override { s_.dev.synchronize(StreamRole::d2h); }
};

// The optimizer off the device: the Update's input in host memory, whose norm parts the Reduce worker
// sums as each unit's last micro batch is in (under the backward, not at the barrier) — unless the
// speculative Update sums them itself.
class GradientPath::HostInput : public Route {
 public:
  explicit HostInput(GradientPath& p) : Route(p) {
    s_.claim("GradOut(u)", "Reduce(u)", Handoff::host_wait);       // the landing events (through_landing)
    s_.claim("Reduce(u)", "GradOut(u)", Handoff::enqueued_after);  // a landing buffer refilled after it is read
    s_.claim("Reduce(u)", "Norm", Handoff::host_wait);
    s_.claim("Reduce(u)", "Update(g)", s_.stages.reduce_to_update);
  }
  void norm_part(Unit& u, std::uint64_t step) override {
    if (s_.stages.host_norm == StagePlan::HostNorm::barrier) return;
    const auto t0 = Clock::now();
    auto [grad, type] = p_.update_input(u);
    p_.sums_[u.index] = cpu_adam::sum_squares_parts(s_.threads, grad, type, u.grad_range.len());
    p_.summed_step_[u.index] = step;
    s_.add_host_time(t0, "Norm part", static_cast<std::int64_t>(u.index));
  }
  std::vector<std::vector<double>> block_sums(
      const std::function<bool(std::size_t, std::vector<double>&)>& known) override {
    std::vector<std::vector<double>> out(s_.units.size());
    for (std::size_t i = 0; i < out.size(); ++i) {
      if (known && known(i, out[i])) continue;
      if (p_.summed_step_[i] == p_.step_) {  // the worker's, for this step (it is drained: the barrier)
        out[i] = p_.sums_[i];
      } else {
        auto [g, type] = p_.update_input(s_.units[i]);
        out[i] = cpu_adam::sum_squares_parts(s_.threads, g, type, s_.units[i].grad_range.len());
      }
    }
    return out;
  }
  void allocate_receive(const BufferSpec& b) override { p_.host_recv_ = s_.alloc_host(b.bytes); }
};

// device_accum (the optimizer off the device, one rank, GA > 1): each micro batch is rounded and summed
// on the device; after the last, the fp32 sum leaves it through the landing buffers.
class GradientPath::AccumRoute : public HostInput {
 public:
  using HostInput::HostInput;
  void on_worker(Unit& u, float* g, std::int64_t micro, EventHandle complete) override {
    p_.enqueue_on_device(u, g, micro, std::move(complete));
    if (micro + 1 == s_.layout.grad_accum) p_.grad_out_sum(u);
    s_.dev.synchronize(StreamRole::d2h);  // d2h has read the gradient: release() may hand it back
  }
};

// GradOut bucket by bucket through the landing buffers (16 bits in mixed runs, rounded into the one
// device staging buffer in d2h stream order; fp32 straight from the gradient buffer), then the Reduce
// into the Update's input. The landing event also says d2h has read the bucket of the gradient buffer;
// the buffer itself is handed back to compute by release() after the d2h sync at the end.
class GradientPath::HostRoute : public HostInput {
 public:
  // The Reduce of one landed bucket [o, o+len) of micro batch `micro` into unit u's host gradient.
  // (An enum, not a member-function pointer: GCC's -Wmaybe-uninitialized misreads a call through one
  // inside the sanitizers' builds.)
  using Reduce = StagePlan::HostReduce;
  explicit HostRoute(GradientPath& p) : HostInput(p), reduce_(s_.stages.host_reduce) {}

  void on_worker(Unit& u, float* g, std::int64_t micro, EventHandle complete) override {
    const StreamRole r = StreamRole::d2h;
    s_.dev.wait_event(r, std::move(complete));
    p_.through_landing(
        u, u.n,
        [&](std::size_t o, std::size_t len, PinnedBuffer& land) {
          s_.format->grad_out(s_.dev, *s_.kern, g + o, p_.gradout_stage_.as<void>(), land.data(), len, r);
        },
        [&](std::size_t o, std::size_t len, PinnedBuffer& land) {
          switch (reduce_) {
            case Reduce::copy: copy(u, o, len, land, micro); break;
            case Reduce::sum_one_rank: sum_one_rank(u, o, len, land, micro); break;
            case Reduce::sum_across_ranks: sum_across_ranks(u, o, len, land, micro); break;
          }
        });
    s_.dev.synchronize(r);  // an error on the d2h stream surfaces here (events carry none)
  }

 private:
  // The landed bucket as fp32 into `dst`.
  void widen(const PinnedBuffer& land, float* dst, std::size_t len) { s_.format->to_fp32(land.data(), dst, len); }
  // GA 1, one rank: the landed gradient is the Update's input as it is.
  void copy(Unit& u, std::size_t o, std::size_t len, const PinnedBuffer& land, std::int64_t) {
    const std::size_t cb = s_.layout.compute_bytes;
    std::memcpy(p_.host_input(u) + o * cb, land.data(), len * cb);
  }
  // One rank, GA > 1: straight into the fp32 sum (the whole unit is kept).
  void sum_one_rank(Unit& u, std::size_t o, std::size_t len, const PinnedBuffer& land, std::int64_t micro) {
    float* acc = reinterpret_cast<float*>(p_.host_input(u)) + (o - u.grad_range.lo);
    if (micro == 0)
      widen(land, acc, len);
    else
      s_.format->add_to(land.data(), acc, len);
  }
  // Several ranks: the bucket reduced across them, then the part this rank keeps summed over micro
  // batches in fp32.
  void sum_across_ranks(Unit& u, std::size_t o, std::size_t len, const PinnedBuffer& land, std::int64_t micro) {
    float* g = reinterpret_cast<float*>(p_.reduce_scratch_.get());
    widen(land, g, len);
    p_.reduce_bucket(u, o, len, g, false);
    const std::size_t a = std::max(o, u.grad_range.lo), b = std::min(o + len, u.grad_range.hi);
    if (b <= a) return;
    // (With streaming, GA 1: the ring slot holds this rank's kept range, as host_grad would.)
    float* acc = reinterpret_cast<float*>(p_.host_input(u)) + (a - u.grad_range.lo);
    if (micro == 0)
      std::memcpy(acc, g + (a - o), (b - a) * 4);
    else
      s_.add_into(acc, g + (a - o), b - a);
  }
  Reduce reduce_;
};

// The route of the placement (StagePlan::route). Each route claims the handoffs of the step graph it
// makes; these the path makes on every route: grads_done records `complete` on compute and the d2h
// work waits for it; release() hands the device gradient back once d2h is synchronized; drain() is
// the barrier.
std::unique_ptr<GradientPath::Route> GradientPath::make_route() {
  state_.claim("Backward(u)", "GradOut(u)", Handoff::event);
  state_.claim("GradOut(u)", "Backward(u)", Handoff::host_wait);
  switch (state_.stages.route) {
    case StagePlan::Route::device: return std::make_unique<DeviceRoute>(*this);
    case StagePlan::Route::ordered_device: return std::make_unique<OrderedDeviceRoute>(*this);
    case StagePlan::Route::accum: return std::make_unique<AccumRoute>(*this);
    case StagePlan::Route::host: return std::make_unique<HostRoute>(*this);
  }
  throw Error("offload: unknown gradient route");
}

GradientPath::~GradientPath() = default;

GradientPath::GradientPath(EngineState& s) : state_(s), jitter_(s.dev.jitter(), 11) {
  auto on_start = [this] {
    state_.dev.bind_thread();
    state_.name_thread("Reduce worker");
  };
  route_ = make_route();
  if (s.layout.streaming) stream_ = std::make_unique<GradientStream>(s);
  worker_ = std::make_unique<HostQueue>(s.exact(), [this] { jitter_.delay(); }, on_start);
}


void GradientPath::add(Unit& u, const std::string& name) {
  if (of_.size() <= u.index) of_.resize(u.index + 1);
  // Partitioned gradients, or the optimizer off the device: a block's gradient has no buffer of its
  // own (it passes through the gradient slots).
  if (const BufferSpec* b = state_.find(Buffer::grad, u.index))
    of(u).grad = DeviceBuffer(state_.dev, b->bytes, name + " grad");
  if (const BufferSpec* b = state_.find(Buffer::grad16, u.index))
    of(u).grad16 = DeviceBuffer(state_.dev, b->bytes, name + " grad16");
  if (of(u).grad.size()) {  // its own buffers: a slot only it takes (the shared ones: allocate_shared)
    of(u).slots = {slots_.size()};
    slots_.push_back({of(u).grad.as<float>(), of(u).grad16.as<void>(), false});
    // Layer-major: two buffers, or one per micro batch for the unit the tied head shares (no 16-bit
    // rounding buffer beside them: the optimizer is off the device and the micro batches sum on the host).
    const BufferSpec* b = state_.find(Buffer::grad, u.index);
    for (std::uint64_t i = 1; i < b->count; ++i) {
      of(u).more.emplace_back(state_.dev, b->bytes, name + " grad " + std::to_string(i));
      of(u).slots.push_back(slots_.size());
      slots_.push_back({of(u).more.back().as<float>(), nullptr, false});
    }
  }
  if (const BufferSpec* b = state_.find(Buffer::grad_sum, u.index))
    of(u).grad_sum = DeviceBuffer(state_.dev, b->bytes, name + " grad32");
  if (const BufferSpec* b = state_.find(Buffer::host_grad, u.index))
    of(u).host_grad = state_.alloc_host(b->bytes);  // the reduced gradient this rank keeps
  if (stream_) stream_->add(u, name);
  // The Update's input, as the placement has it (StagePlan::input).
  const void* in = nullptr;
  switch (state_.stages.input) {
    case StagePlan::Input::grad: in = of(u).grad.as<void>(); break;
    case StagePlan::Input::grad16: in = of(u).grad16.as<void>(); break;
    case StagePlan::Input::grad_sum: in = of(u).grad_sum.as<void>(); break;
    case StagePlan::Input::host_grad: in = of(u).host_grad.get(); break;
    case StagePlan::Input::ring: break;  // a ring slot, or read back: GradientStream::input
  }
  of(u).input = {in, state_.stages.input_type};
}

void GradientPath::allocate_shared() {
  open_.assign(state_.units.size(),
               std::vector<int>(static_cast<std::size_t>(std::max<std::int64_t>(1, state_.layout.grad_accum)), -1));
  failed_step_.assign(state_.units.size(), 0);
  sums_.assign(state_.units.size(), {});
  summed_step_.assign(state_.units.size(), 0);
  std::vector<std::size_t> shared;  // the gradient slots of the units without buffers of their own
  if (const BufferSpec* b = state_.find(Buffer::grad_slot)) {  // see Unit::grad_windowed
    const BufferSpec* half = state_.find(Buffer::grad16_slot);
    for (std::uint64_t i = 0; i < b->count; ++i) {
      slot_memory_.emplace_back(state_.dev, b->bytes, "grad window slot " + std::to_string(i));
      GradSlot g{slot_memory_.back().as<float>(), nullptr, false};
      if (half) {
        slot_memory_.emplace_back(state_.dev, half->bytes, "grad16 window slot " + std::to_string(i));
        g.grad16 = slot_memory_.back().as<void>();
      }
      shared.push_back(slots_.size());
      slots_.push_back(g);
    }
  }
  for (auto& g : of_)
    if (g.slots.empty()) g.slots = shared;
  if (const BufferSpec* b = state_.find(Buffer::grad_landing))
    for (std::uint64_t i = 0; i < b->count; ++i) landing_.push_back(state_.pinned->acquire(b->bytes));
  if (const BufferSpec* b = state_.find(Buffer::grad_out_staging))
    gradout_stage_ = DeviceBuffer(state_.dev, b->bytes, "grad out staging");
  if (const BufferSpec* b = state_.find(Buffer::reduce_scratch)) reduce_scratch_ = state_.alloc_host(b->bytes);
  if (stream_) stream_->allocate();
}

void GradientPath::allocate_comm_scratch() {
  if (const BufferSpec* b = state_.find(Buffer::comm_receive)) route_->allocate_receive(*b);
}

// The reduction of one bucket [o, o+len) of unit u across ranks, in place in `g` (the bucket's fp32
// contributions of this rank): each rank's part of the bucket goes to the rank that owns it
// (all-to-all), which sums the contributions in rank order; without partitioned gradients the sums
// are then all-gathered, so every rank holds the whole reduced bucket.
void GradientPath::reduce_bucket(Unit& u, std::size_t o, std::size_t len, float* g, bool on_device) {
  const auto counts = u.counts_in(o, len);
  const StreamRole r = StreamRole::d2h;
  if (on_device) {
    Comm& c = *state_.reduce_dcomm;
    {
      BusyScope busy(state_.dev, r, {"Reduce", static_cast<std::int64_t>(u.index)});
      reduce_scatter_ordered(c, state_.dev, *state_.kern, r, g, counts, device_recv_.as<float>(), &state_.order);
    }
    if (state_.stages.reduced == StagePlan::Reduced::whole)
      state_.order.run(c, state_.dev, r, [&](void* st) { c.allgatherv(g, counts, 4, st); });
    return;
  }
  // Host memory: the same reduction with the sum spread over the host threads.
  const std::size_t mine = counts[static_cast<std::size_t>(state_.layout.rank)];
  const std::vector<std::size_t> recv_counts(counts.size(), mine);
  const std::size_t first =
      std::max(o, u.bounds[static_cast<std::size_t>(state_.layout.rank)]) - o;  // my part within the bucket
  const auto W = static_cast<std::size_t>(state_.layout.world);
  Comm& c = *state_.reduce_comm;
  float* recv = reinterpret_cast<float*>(host_recv_.get());
  c.alltoallv(g, counts, recv, recv_counts, 4);
  if (mine) {
    float* dst = g + first;
    state_.threads.parallel_for(mine, 1 << 16, [&](std::size_t b, std::size_t e) {
      for (std::size_t i = b; i < e; ++i) {
        float acc = recv[i];
        for (std::size_t k = 1; k < W; ++k) acc += recv[k * mine + i];  // rank order
        dst[i] = acc;
      }
    });
  }
  if (state_.stages.reduced == StagePlan::Reduced::whole) c.allgatherv(g, counts, 4);
}

void GradientPath::begin_micro_batch(std::int64_t micro) {
  micro_ = micro;
  // A gradient asked for but never done (a pass that ended in an error) does not carry over into a new
  // step: its slot is freed, and the next request takes (and zeroes) one afresh.
  if (micro == 0)
    for (auto& open : open_)
      for (int& slot : open)
        if (slot >= 0) release(std::exchange(slot, -1));
  if (micro == 0) ++step_;  // sums the worker made for an earlier step no longer count
  if (micro + 1 == state_.layout.grad_accum) {  // every Reduce of the previous step is done (the barrier)
    std::lock_guard<std::mutex> lk(state_.mu);
    for (auto& u : state_.units) u.reduced = false;
  }
}

void GradientPath::begin_micro_batches() {
  for (std::int64_t m = 0; m < state_.layout.grad_accum; ++m) begin_micro_batch(m);  // the last one too
  micro_ = 0;
}

float* GradientPath::grads(std::size_t u) {
  Unit& unit = state_.units[u];
  int& open = open_[u][static_cast<std::size_t>(micro_)];
  if (open >= 0) return slots_[static_cast<std::size_t>(open)].grad;  // asked for again in this micro batch
  {
    // The first free one of the slots it may take (UnitGrads::slots). A slot an earlier micro batch
    // of this unit (or another unit) used is busy until its GradOut/Reduce has read it (release).
    std::unique_lock<std::mutex> lk(state_.mu);
    int free_slot = -1;
    state_.cv.wait(lk, [&] {
      for (std::size_t i : of(unit).slots)
        if (!slots_[i].busy) return (free_slot = static_cast<int>(i)) >= 0;
      return false;
    });
    slots_[static_cast<std::size_t>(free_slot)].busy = true;
    open = free_slot;
  }
  float* g = slots_[static_cast<std::size_t>(open)].grad;
  state_.kern->zero(g, unit.n * 4, StreamRole::compute);
  // A model whose ops are compute-stream work is ordered behind the zeros already; one that runs
  // on the host must see them now.
  if (!state_.dev.ops_stream_ordered()) state_.dev.synchronize(StreamRole::compute);
  return g;
}

void GradientPath::grads_done(std::size_t u) {
  Unit& unit = state_.units[u];
  const std::int64_t mb = micro_;
  const int slot = std::exchange(open_[u][static_cast<std::size_t>(mb)], -1);  // now the job's
  ZINF_CHECK(slot >= 0);  // grads(u) came first
  float* g = slots_[static_cast<std::size_t>(slot)].grad;
  // The gradient is complete at this point of the compute stream: d2h waits for it before reading
  // it. Whoever enqueues the d2h work enqueues the wait, just before it: were the trainer to enqueue
  // it here for a worker's later GradOut, d2h (one FIFO) would hold every GradOut behind the waits
  // for all the units the trainer has reached since — the whole backward, enqueued far ahead.
  EventHandle complete = state_.dev.record(StreamRole::compute);
  try {
    route_->on_trainer(unit, g, mb, complete);
  } catch (...) {
    release(slot);
    throw;
  }
  const std::uint64_t step = step_;
  auto job = [this, u, slot, g, mb, step, complete = std::move(complete)]() mutable {
    const bool last = mb + 1 == state_.layout.grad_accum;
    // With streaming the Reduce writes into a ring slot: taken by the first micro batch that writes
    // the Update's input (the last with device_accum, which sums on the device; every one otherwise,
    // the first taking it) and held until the unit is reduced.
    const bool accum = state_.stages.route == StagePlan::Route::accum;
    const bool ring = stream_ && (!accum || last);
    struct Release {  // also on an exception, so nobody waits forever on the buffer
      GradientPath& p;
      int slot;
      ~Release() { p.release(slot); }
    };
    if (ring && failed_step_[u] == step) {  // an earlier micro batch of u failed: its ring slot is gone
      Release release{*this, slot};
      return;
    }
    if (ring && (accum || mb == 0)) stream_->acquire(state_.units[u]);  // the ring slot the Reduce writes into
    try {
      {
        Release release{*this, slot};
        route_->on_worker(state_.units[u], g, mb, std::move(complete));
      }  // the device gradient (and its slot) is free again: the backward may go on while the host sums
      if (last) {
        if (stream_) stream_->written(state_.units[u]);  // the NVMe copy, before the unit is reduced
        route_->norm_part(state_.units[u], step);
      }
    } catch (...) {
      if (ring) {
        failed_step_[u] = step;
        stream_->failed(state_.units[u]);  // its ring slot, and the speculation's wait
      }
      throw;
    }
    if (last) {
      {
        std::lock_guard<std::mutex> lk(state_.mu);
        state_.units[u].reduced = true;
        if (stream_) stream_->reduced_locked(state_.units[u]);
      }
      state_.cv.notify_all();
    }
  };
  worker_->run(std::move(job));
}

void GradientPath::release(int slot) {
  {
    std::lock_guard<std::mutex> lk(state_.mu);
    slots_[static_cast<std::size_t>(slot)].busy = false;
  }
  state_.cv.notify_all();
}

void* GradientPath::grad16_of(const float* grad) const {
  for (const GradSlot& s : slots_)  // fixed once allocate_shared has run
    if (s.grad == grad) return s.grad16;
  return nullptr;
}

void GradientPath::drain() { worker_->drain(); }
void GradientPath::check() { worker_->check(); }

void GradientPath::enqueue_on_device(Unit& u, float* grad, std::int64_t mb, EventHandle complete) {
  const StreamRole r = StreamRole::d2h;  // the Update reads device buffers: round (and accumulate) in place
  state_.dev.wait_event(r, std::move(complete));
  void* g16 = grad16_of(grad);  // the slot stays this unit's until the job ends
  using Action = StagePlan::DeviceAction;
  for (Action a : state_.stages.device_actions) {
    switch (a) {
      case Action::gradout_fp32: {
        BusyScope busy(state_.dev, r, {"GradOut", static_cast<std::int64_t>(u.index)});  // nothing to round
        break;
      }
      case Action::gradout16:
      case Action::gradout16_widen: {
        BusyScope busy(state_.dev, r, {"GradOut", static_cast<std::int64_t>(u.index)});
        state_.kern->to_half(grad, g16, u.n, state_.half, r);
        if (a == Action::gradout16_widen) state_.kern->from_half(g16, grad, u.n, state_.half, r);
        break;
      }
      case Action::reduce:
        for (std::size_t o = 0; o < u.n; o += state_.layout.bucket)
          reduce_bucket(u, o, std::min(state_.layout.bucket, u.n - o), grad + o, true);
        break;
      case Action::sum: {
        // A small unit's shard may be empty on this rank (ZeRO stage ≥ 2): nothing of it to keep.
        if (!u.grad_range.len()) break;
        BusyScope busy(state_.dev, r, {"GradOut", static_cast<std::int64_t>(u.index)});
        const float* mine = grad + u.grad_range.lo;
        if (mb == 0)
          state_.kern->copy(of(u).grad_sum.as<float>(), mine, u.grad_range.len() * 4, r);
        else
          state_.kern->add(of(u).grad_sum.as<float>(), mine, u.grad_range.len(), r);
        break;
      }
    }
  }
}

void GradientPath::grad_out_sum(Unit& u) {
  through_landing(
      u, u.n,
      [&](std::size_t o, std::size_t len, PinnedBuffer& land) {  // after the sum's last add, in d2h stream order
        state_.dev.copy_to_host(land.data(), of(u).grad_sum.as<float>() + o, len * 4, StreamRole::d2h);
      },
      [&](std::size_t o, std::size_t len, PinnedBuffer& land) {
        std::memcpy(reinterpret_cast<float*>(host_input(u)) + o, land.data(), len * 4);
      });
}

void GradientPath::through_landing(const Unit& u, std::size_t n, const BucketFn& out, const BucketFn& in) {
  const StreamRole r = StreamRole::d2h;
  const std::size_t L = landing_.size(), nb = (n + state_.layout.bucket - 1) / state_.layout.bucket;
  auto range = [&](std::size_t kb) { return std::pair{kb * state_.layout.bucket, std::min(state_.layout.bucket, n - kb * state_.layout.bucket)}; };
  std::vector<EventHandle> landed(L);
  std::size_t enqueued = 0;
  for (std::size_t kb = 0; kb < nb; ++kb) {
    for (; enqueued < nb && enqueued < kb + L; ++enqueued) {
      const auto [o, len] = range(enqueued);
      {
        BusyScope busy(state_.dev, r, {"GradOut", static_cast<std::int64_t>(u.index)});
        out(o, len, landing_[enqueued % L]);
      }
      // landing buffer enqueued % L: written by d2h, read below by this thread — handed over by this
      // event; it is refilled (bucket enqueued + L) only after this thread has read it.
      landed[enqueued % L] = state_.dev.record(r);
    }
    const auto [o, len] = range(kb);
    landed[kb % L]->wait();
    const auto t0 = Clock::now();
    in(o, len, landing_[kb % L]);
    state_.add_host_time(t0, "Reduce", static_cast<std::int64_t>(u.index));
  }
}

std::pair<const void*, cpu_adam::GradType> GradientPath::update_input(const Unit& u) const {
  if (state_.stages.input == StagePlan::Input::ring) return {stream_->input(u), state_.stages.input_type};
  return of(u).input;
}

std::vector<std::vector<double>> GradientPath::block_sums(
    const std::function<bool(std::size_t, std::vector<double>&)>& known) {
  return route_->block_sums(known);
}

}  // namespace zinf::offload::detail
