// gradient_path.cpp — the gradient path: GradOut and Reduce (gradient_path.h).
#include "gradient_path.h"

namespace zinf::offload::detail {

GradientPath::GradientPath(EngineState& s) : state_(s), jitter_(s.dev.jitter(), 11) {
  auto on_start = [this] {
    state_.dev.bind_thread();
    state_.name_thread("Reduce worker");
  };
  worker_ = std::make_unique<SerialWorker>([this] { jitter_.delay(); }, on_start);
}

void GradientPath::add(Unit& u, const std::string& name) {
  // Partitioned gradients, or the optimizer off the device: a block's gradient has no buffer of its
  // own (it passes through the gradient slots).
  if (const BufferSpec* b = state_.find(Buffer::grad, u.index))
    u.grad = DeviceBuffer(state_.dev, b->bytes, name + " grad");
  if (const BufferSpec* b = state_.find(Buffer::grad16, u.index))
    u.grad16 = DeviceBuffer(state_.dev, b->bytes, name + " grad16");
  if (const BufferSpec* b = state_.find(Buffer::grad_sum, u.index))
    u.grad_sum = DeviceBuffer(state_.dev, b->bytes, name + " grad32");
  if (const BufferSpec* b = state_.find(Buffer::host_grad, u.index))
    u.host_grad = state_.alloc_host(b->bytes);  // the reduced gradient this rank keeps
}

void GradientPath::allocate_shared() {
  zeroed_.assign(state_.units.size(), false);
  sums_.assign(state_.units.size(), {});
  summed_step_.assign(state_.units.size(), 0);
  if (const BufferSpec* b = state_.find(Buffer::grad_slot)) {  // see Unit::grad_windowed
    const BufferSpec* half = state_.find(Buffer::grad16_slot);
    for (std::uint64_t i = 0; i < b->count; ++i) {
      GradSlot g;
      g.grad = DeviceBuffer(state_.dev, b->bytes, "grad window slot " + std::to_string(i));
      if (half) g.grad16 = DeviceBuffer(state_.dev, half->bytes, "grad16 window slot " + std::to_string(i));
      slots_.push_back(std::move(g));
    }
  }
  if (const BufferSpec* b = state_.find(Buffer::grad_landing))
    for (std::uint64_t i = 0; i < b->count; ++i) landing_.push_back(state_.pinned->acquire(b->bytes));
  if (const BufferSpec* b = state_.find(Buffer::grad_out_staging))
    gradout_stage_ = DeviceBuffer(state_.dev, b->bytes, "grad out staging");
  if (const BufferSpec* b = state_.find(Buffer::reduce_scratch)) reduce_scratch_ = state_.alloc_host(b->bytes);
}

void GradientPath::allocate_comm_scratch() {
  const BufferSpec* b = state_.find(Buffer::comm_receive);
  if (!b) return;
  if (b->tier == Tier::host)
    host_recv_ = state_.alloc_host(b->bytes);
  else
    device_recv_ = DeviceBuffer(state_.dev, b->bytes, "gradient receive scratch");
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
    if (!state_.layout.shard_grads) state_.order.run(c, state_.dev, r, [&](void* st) { c.allgatherv(g, counts, 4, st); });
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
  if (!state_.layout.shard_grads) c.allgatherv(g, counts, 4);
}

void GradientPath::begin_micro_batch(std::int64_t micro) {
  micro_ = micro;
  std::fill(zeroed_.begin(), zeroed_.end(), false);
  if (micro == 0) ++step_;  // sums the worker made for an earlier step no longer count
  if (micro + 1 == state_.layout.grad_accum) {  // every Reduce of the previous step is done (the barrier)
    std::lock_guard<std::mutex> lk(state_.mu);
    for (auto& u : state_.units) u.reduced = false;
  }
}

float* GradientPath::grads(std::size_t u) {
  Unit& unit = state_.units[u];
  float* g;
  {
    std::unique_lock<std::mutex> lk(state_.mu);
    // The previous micro batch's GradOut/Reduce of this unit may still read its buffer (and, for a
    // windowed gradient, still hold its slot): the Reduce worker clears `reducing` when it is done.
    state_.cv.wait(lk, [&] { return !unit.reducing; });
    if (unit.grad_windowed) {
      if (unit.grad_slot < 0) {
        int free_slot = -1;
        state_.cv.wait(lk, [&] {
          for (std::size_t i = 0; i < slots_.size(); ++i)
            if (!slots_[i].busy) return (free_slot = static_cast<int>(i)) >= 0;
          return false;
        });
        slots_[static_cast<std::size_t>(free_slot)].busy = true;
        unit.grad_slot = free_slot;
      }
      g = slots_[static_cast<std::size_t>(unit.grad_slot)].grad.as<float>();
    } else {
      g = unit.grad.as<float>();
    }
  }
  if (!zeroed_[u]) {
    state_.kern->zero(g, unit.n * 4, StreamRole::compute);
    // A model whose ops are compute-stream work is ordered behind the zeros already; one that runs
    // on the host must see them now.
    if (!state_.dev.ops_stream_ordered()) state_.dev.synchronize(StreamRole::compute);
    zeroed_[u] = true;
  }
  return g;
}

void GradientPath::grads_done(std::size_t u) {
  Unit& unit = state_.units[u];
  const std::int64_t mb = micro_;
  float* g;
  {
    std::lock_guard<std::mutex> lk(state_.mu);
    ZINF_CHECK(!unit.grad_windowed || unit.grad_slot >= 0);  // grads(u) came first
    g = unit.grad_windowed ? slots_[static_cast<std::size_t>(unit.grad_slot)].grad.as<float>() : unit.grad.as<float>();
    unit.reducing = true;
  }
  // The gradient is complete at this point of the compute stream: d2h waits for it before reading
  // it. Whoever enqueues the d2h work enqueues the wait, just before it: were the trainer to enqueue
  // it here for a worker's later GradOut, d2h (one FIFO) would hold every GradOut behind the waits
  // for all the units the trainer has reached since — the whole backward, enqueued far ahead.
  EventHandle complete = state_.dev.record(StreamRole::compute);
  // The optimizer on the device with a stream-ordered transport: the Reduce's collectives are
  // issued here, on the trainer's thread, in its order (zinf/offload/collectives.h); the worker then
  // only waits for the stream and frees the buffer.
  const bool issue_here = state_.ordered_collectives && !state_.layout.optimizer_offloaded;
  if (issue_here) {
    state_.dev.wait_event(StreamRole::d2h, std::move(complete));
    try {
      enqueue_on_device(unit, g, mb);
    } catch (...) {
      release(u);
      throw;
    }
  }
  const std::uint64_t step = step_;
  auto job = [this, u, g, mb, issue_here, step, complete = std::move(complete)]() mutable {
    {
      struct Release {  // also on an exception, so nobody waits forever on the buffer
        GradientPath& p;
        std::size_t u;
        ~Release() { p.release(u); }
      } release{*this, u};
      if (issue_here) {
        state_.dev.synchronize(StreamRole::d2h);
      } else if (device_accum()) {  // summed on the device; the sum leaves it after the last micro batch
        state_.dev.wait_event(StreamRole::d2h, std::move(complete));
        enqueue_on_device(state_.units[u], g, mb);
        if (mb + 1 == state_.layout.grad_accum) grad_out_sum(state_.units[u]);
        state_.dev.synchronize(StreamRole::d2h);  // d2h has read the gradient: release() may hand it back
      } else {
        state_.dev.wait_event(StreamRole::d2h, std::move(complete));
        grad_out_and_reduce(u, g, mb);
      }
    }  // the device gradient (and its slot) is free again: the backward may go on while the host sums
    if (mb + 1 == state_.layout.grad_accum) {
      if (state_.layout.optimizer_offloaded && !state_.layout.speculative) {  // the norm's part, off the barrier
        const auto t0 = Clock::now();
        auto [grad, type] = update_input(state_.units[u]);
        sums_[u] = cpu_adam::sum_squares_parts(state_.threads, grad, type, state_.units[u].grad_range.len());
        summed_step_[u] = step;
        state_.add_host_time(t0, "Norm part", static_cast<std::int64_t>(u));
      }
      {
        std::lock_guard<std::mutex> lk(state_.mu);
        state_.units[u].reduced = true;
      }
      state_.cv.notify_all();
    }
  };
  if (state_.exact())
    worker_->push(job);
  else
    job();
}

void GradientPath::release(std::size_t u) {
  Unit& x = state_.units[u];
  {
    std::lock_guard<std::mutex> lk(state_.mu);
    if (x.grad_windowed && x.grad_slot >= 0) {
      slots_[static_cast<std::size_t>(x.grad_slot)].busy = false;
      x.grad_slot = -1;
    }
    x.reducing = false;
  }
  state_.cv.notify_all();
}

void GradientPath::drain() { worker_->drain(); }
void GradientPath::check() { worker_->check(); }

void GradientPath::enqueue_on_device(Unit& u, float* grad, std::int64_t mb) {
  const StreamRole r = StreamRole::d2h;  // the Update reads device buffers: round (and accumulate) in place
  void* g16 = nullptr;
  {
    std::lock_guard<std::mutex> lk(state_.mu);  // the slot stays this unit's until the job ends
    g16 = u.grad_windowed ? slots_[static_cast<std::size_t>(u.grad_slot)].grad16.as<void>() : u.grad16.as<void>();
  }
  {
    BusyScope busy(state_.dev, r, {"GradOut", static_cast<std::int64_t>(u.index)});
    if (state_.layout.mixed) {
      state_.kern->to_half(grad, g16, u.n, state_.half, r);
      if (fp32_sum()) state_.kern->from_half(g16, grad, u.n, state_.half, r);
    }
  }
  if (state_.parallel())
    for (std::size_t o = 0; o < u.n; o += state_.layout.bucket)
      reduce_bucket(u, o, std::min(state_.layout.bucket, u.n - o), grad + o, true);
  // A small unit's shard may be empty on this rank (ZeRO stage ≥ 2): nothing of it to keep.
  if (fp32_sum() && u.grad_range.len()) {
    BusyScope busy(state_.dev, r, {"GradOut", static_cast<std::int64_t>(u.index)});
    const float* kept = grad + u.grad_range.lo;
    if (mb == 0)
      state_.kern->copy(u.grad_sum.as<float>(), kept, u.grad_range.len() * 4, r);
    else
      state_.kern->add(u.grad_sum.as<float>(), kept, u.grad_range.len(), r);
  }
}

void GradientPath::grad_out_and_reduce(std::size_t ui, float* grad, std::int64_t mb) {
  Unit& u = state_.units[ui];
  const StreamRole r = StreamRole::d2h;
  if (!state_.layout.optimizer_offloaded) {
    enqueue_on_device(u, grad, mb);
    state_.dev.synchronize(r);
    return;
  }
  // The one device staging buffer (16-bit runs) is reused in d2h stream order.
  const std::size_t cb = state_.layout.compute_bytes;
  auto grad_out = [&](std::size_t o, std::size_t len, PinnedBuffer& land) {  // 16 bits in mixed runs
    if (state_.layout.mixed) {  // rounded into the staging buffer (d2h writes, d2h reads: stream order)
      state_.kern->to_half(grad + o, gradout_stage_.as<void>(), len, state_.half, r);
      state_.dev.copy_to_host(land.data(), gradout_stage_.as<void>(), len * cb, r);
    } else {  // fp32: straight from the gradient buffer, no device copy first
      state_.dev.copy_to_host(land.data(), grad + o, len * cb, r);
    }
  };
  // The landing event also says d2h has read the bucket of the gradient buffer; the buffer itself
  // is handed back to compute by release() after the d2h sync at the end.
  auto reduce = [&](std::size_t o, std::size_t len, PinnedBuffer& land) {  // into the Update's input
    if (!fp32_sum()) {
      std::memcpy(u.host_grad.get() + o * host_grad_bytes(), land.data(), len * cb);
    } else if (!state_.parallel()) {  // one rank: straight into the fp32 sum (the whole unit is kept)
      float* acc = reinterpret_cast<float*>(u.host_grad.get()) + (o - u.grad_range.lo);
      const auto* h = static_cast<const std::uint16_t*>(land.data());
      if (mb == 0 && state_.layout.mixed)
        state_.from_half(h, acc, len);
      else if (mb == 0)
        std::memcpy(acc, land.data(), len * 4);
      else if (state_.layout.mixed)
        cpu_adam::accumulate_half(state_.threads, h, acc, len, state_.half);
      else
        state_.add_into(acc, static_cast<const float*>(land.data()), len);
    } else {
      float* g = reinterpret_cast<float*>(reduce_scratch_.get());
      if (state_.layout.mixed)
        state_.from_half(land.data(), g, len);
      else
        std::memcpy(g, land.data(), len * 4);
      if (state_.parallel()) reduce_bucket(u, o, len, g, false);
      // The part of the bucket this rank keeps, summed over micro batches in fp32.
      const std::size_t a = std::max(o, u.grad_range.lo), b = std::min(o + len, u.grad_range.hi);
      if (b > a) {
        float* acc = reinterpret_cast<float*>(u.host_grad.get()) + (a - u.grad_range.lo);
        if (mb == 0)
          std::memcpy(acc, g + (a - o), (b - a) * 4);
        else
          state_.add_into(acc, g + (a - o), b - a);
      }
    }
  };
  through_landing(u, u.n, grad_out, reduce);
  state_.dev.synchronize(r);  // an error on the d2h stream surfaces here (events carry none)
}

void GradientPath::grad_out_sum(Unit& u) {
  through_landing(
      u, u.n,
      [&](std::size_t o, std::size_t len, PinnedBuffer& land) {  // after the sum's last add, in d2h stream order
        state_.dev.copy_to_host(land.data(), u.grad_sum.as<float>() + o, len * 4, StreamRole::d2h);
      },
      [&](std::size_t o, std::size_t len, PinnedBuffer& land) {
        std::memcpy(reinterpret_cast<float*>(u.host_grad.get()) + o, land.data(), len * 4);
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

std::pair<const void*, cpu_adam::GradType> GradientPath::update_input(Unit& u) const {
  const cpu_adam::GradType g16 =
      state_.half == cpu_adam::HalfType::bf16 ? cpu_adam::GradType::bf16 : cpu_adam::GradType::fp16;
  if (!state_.layout.optimizer_offloaded) {
    if (fp32_sum()) return {u.grad_sum.as<float>(), cpu_adam::GradType::fp32};
    if (state_.layout.mixed) return {u.grad16.as<void>(), g16};
    return {u.grad.as<float>(), cpu_adam::GradType::fp32};
  }
  if (fp32_sum() || !state_.layout.mixed) return {u.host_grad.get(), cpu_adam::GradType::fp32};
  return {u.host_grad.get(), g16};
}

std::vector<std::vector<double>> GradientPath::block_sums(
    const std::function<bool(std::size_t, std::vector<double>&)>& known) {
  std::vector<EngineKernels::NormInput> in;
  for (auto& u : state_.units) {
    auto [g, type] = update_input(u);
    in.push_back({g, type, u.grad_range.len()});
  }
  if (!state_.layout.optimizer_offloaded) {  // one wait for every unit; a rank's empty shards have no blocks
    std::vector<EngineKernels::NormInput> kept;
    for (const auto& x : in)
      if (x.n) kept.push_back(x);
    auto sums = state_.kern->block_sums(kept, StreamRole::d2h);
    std::vector<std::vector<double>> out(in.size());
    for (std::size_t i = 0, k = 0; i < in.size(); ++i)
      if (in[i].n) out[i] = std::move(sums[k++]);
    return out;
  }
  std::vector<std::vector<double>> out(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (known && known(i, out[i])) continue;
    if (summed_step_[i] == step_)  // the worker's, for this step (it is drained: the barrier)
      out[i] = sums_[i];
    else
      out[i] = cpu_adam::sum_squares_parts(state_.threads, in[i].g, in[i].t, in[i].n);
  }
  return out;
}

}  // namespace zinf::offload::detail
