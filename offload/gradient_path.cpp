// gradient_path.cpp — the gradient path: GradOut and Reduce (gradient_path.h).
#include "gradient_path.h"

namespace zinf::offload::detail {

GradientPath::GradientPath(EngineState& s) : s_(s), jitter_(s.dev.jitter(), 11) {
  worker_ = std::make_unique<SerialWorker>([this] { jitter_.delay(); });
}

void GradientPath::add(Unit& u, const std::string& name) {
  if (!s_.optimizer_offloaded) {
    u.grad = DeviceBuffer(s_.dev, u.n * 4, name + " grad");
    if (s_.mixed) u.grad16 = DeviceBuffer(s_.dev, u.n * 2, name + " grad16");
    if (s_.c.grad_accum > 1) u.grad_sum = DeviceBuffer(s_.dev, u.n * 4, name + " grad32");
  } else {
    if (!u.grad_windowed) u.grad = DeviceBuffer(s_.dev, u.n * 4, name + " grad");
    u.host_grad = host_alloc(u.n * host_grad_bytes());
  }
}

void GradientPath::allocate_shared(std::size_t max_unit) {
  zeroed_.assign(s_.units.size(), false);
  if (!s_.optimizer_offloaded) return;
  for (int i = 0; i < 2 && max_unit > 0; ++i) {
    GradSlot g;
    g.grad = DeviceBuffer(s_.dev, max_unit * 4, "grad window slot " + std::to_string(i));
    slots_.push_back(std::move(g));
  }
  for (int i = 0; i < 2; ++i) landing_.push_back(s_.pinned->acquire(s_.bucket * s_.compute_bytes));
  gradout_stage_ = DeviceBuffer(s_.dev, s_.bucket * s_.compute_bytes, "grad out staging");
  if (s_.c.grad_accum > 1) reduce_scratch_ = host_alloc(s_.bucket * 4);
}

void GradientPath::begin_micro_batch(std::int64_t micro) {
  micro_ = micro;
  std::fill(zeroed_.begin(), zeroed_.end(), false);
}

float* GradientPath::grads(std::size_t u) {
  Unit& unit = s_.units[u];
  float* g;
  {
    std::unique_lock<std::mutex> lk(s_.mu);
    // The previous micro batch's GradOut/Reduce of this unit may still read its buffer (and, for a
    // windowed gradient, still hold its slot): the Reduce worker clears `reducing` when it is done.
    s_.cv.wait(lk, [&] { return !unit.reducing; });
    if (unit.grad_windowed) {
      if (unit.grad_slot < 0) {
        int free_slot = -1;
        s_.cv.wait(lk, [&] {
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
    s_.kern->zero(g, unit.n * 4, StreamRole::compute);
    // A model whose ops are compute-stream work is ordered behind the zeros already; one that runs
    // on the host must see them now.
    if (!s_.dev.ops_stream_ordered()) s_.dev.synchronize(StreamRole::compute);
    zeroed_[u] = true;
  }
  return g;
}

void GradientPath::grads_done(std::size_t u) {
  Unit& unit = s_.units[u];
  const std::int64_t mb = micro_;
  float* g;
  {
    std::lock_guard<std::mutex> lk(s_.mu);
    ZINF_CHECK(!unit.grad_windowed || unit.grad_slot >= 0);  // grads(u) came first
    g = unit.grad_windowed ? slots_[static_cast<std::size_t>(unit.grad_slot)].grad.as<float>() : unit.grad.as<float>();
    unit.reducing = true;
  }
  s_.dev.wait_event(StreamRole::d2h, s_.dev.record(StreamRole::compute));  // the gradient is complete
  auto job = [this, u, g, mb] {
    struct Release {  // also on an exception, so nobody waits forever on the buffer
      GradientPath& p;
      std::size_t u;
      ~Release() {
        Unit& x = p.s_.units[u];
        {
          std::lock_guard<std::mutex> lk(p.s_.mu);
          if (x.grad_windowed && x.grad_slot >= 0) {
            p.slots_[static_cast<std::size_t>(x.grad_slot)].busy = false;
            x.grad_slot = -1;
          }
          x.reducing = false;
        }
        p.s_.cv.notify_all();
      }
    } release{*this, u};
    grad_out_and_reduce(u, g, mb);
  };
  if (s_.exact()) worker_->push(job); else job();
}

void GradientPath::drain() { worker_->drain(); }
void GradientPath::check() { worker_->check(); }

void GradientPath::grad_out_and_reduce(std::size_t ui, float* grad, std::int64_t mb) {
  Unit& u = s_.units[ui];
  const StreamRole r = StreamRole::d2h;
  if (!s_.optimizer_offloaded) {  // the Update reads device buffers: round (and accumulate) in place
    {
      BusyScope busy(s_.dev, r);
      if (s_.mixed) {
        s_.kern->to_half(u.grad.as<float>(), u.grad16.as<void>(), u.n, s_.half, r);
        if (s_.c.grad_accum > 1) s_.kern->from_half(u.grad16.as<void>(), u.grad.as<float>(), u.n, s_.half, r);
      }
      if (s_.c.grad_accum > 1) {
        if (mb == 0) s_.kern->copy(u.grad_sum.as<float>(), u.grad.as<float>(), u.n * 4, r);
        else s_.kern->add(u.grad_sum.as<float>(), u.grad.as<float>(), u.n, r);
      }
    }
    s_.dev.synchronize(r);
    return;
  }
  // Bucket by bucket. The GradOut copies run ahead of the Reduce by as many buckets as there are
  // landing buffers: bucket kb+L is enqueued only after the host has finished with bucket kb's
  // buffer, and the host waits for each bucket's event. The one device staging buffer is reused in
  // d2h stream order.
  const std::size_t L = landing_.size(), nb = (u.n + s_.bucket - 1) / s_.bucket, cb = s_.compute_bytes;
  std::vector<EventHandle> landed(L);
  std::size_t enqueued = 0;
  auto grad_out = [&](std::size_t kb) {  // GradOut: the 16-bit gradient leaves the device
    const std::size_t o = kb * s_.bucket, len = std::min(s_.bucket, u.n - o);
    {
      BusyScope busy(s_.dev, r);
      s_.device_to_compute(grad + o, gradout_stage_.as<void>(), len, r);
      s_.dev.copy_to_host(landing_[kb % L].data(), gradout_stage_.as<void>(), len * cb, r);
    }
    landed[kb % L] = s_.dev.record(r);
  };
  for (std::size_t kb = 0; kb < nb; ++kb) {
    while (enqueued < nb && enqueued < kb + L) grad_out(enqueued++);
    const std::size_t o = kb * s_.bucket, len = std::min(s_.bucket, u.n - o);
    PinnedBuffer& land = landing_[kb % L];
    landed[kb % L]->wait();
    const auto t0 = Clock::now();  // Reduce: into the Update's input
    char* dst = u.host_grad.get() + o * host_grad_bytes();
    if (s_.c.grad_accum == 1) {
      std::memcpy(dst, land.data(), len * cb);
    } else {
      float* acc = reinterpret_cast<float*>(dst);
      float* g = reinterpret_cast<float*>(reduce_scratch_.get());
      if (s_.mixed) s_.from_half(land.data(), g, len); else std::memcpy(g, land.data(), len * 4);
      if (mb == 0) std::memcpy(acc, g, len * 4); else s_.add_into(acc, g, len);
    }
    s_.add_time(&BusyTimes::host, since(t0));
  }
  s_.dev.synchronize(r);  // an error on the d2h stream surfaces here (events carry none)
}

std::pair<const void*, cpu_adam::GradType> GradientPath::update_input(Unit& u) const {
  const cpu_adam::GradType g16 = s_.half == cpu_adam::HalfType::bf16 ? cpu_adam::GradType::bf16 : cpu_adam::GradType::fp16;
  if (!s_.optimizer_offloaded) {
    if (s_.c.grad_accum > 1) return {u.grad_sum.as<float>(), cpu_adam::GradType::fp32};
    if (s_.mixed) return {u.grad16.as<void>(), g16};
    return {u.grad.as<float>(), cpu_adam::GradType::fp32};
  }
  if (s_.c.grad_accum > 1 || !s_.mixed) return {u.host_grad.get(), cpu_adam::GradType::fp32};
  return {u.host_grad.get(), g16};
}

cpu_adam::SumSquares GradientPath::sum_squares(Unit& u) {
  auto [g, type] = update_input(u);
  return s_.optimizer_offloaded ? cpu_adam::sum_squares(s_.threads, g, type, u.n)
                                : s_.kern->sum_squares(g, type, u.n, StreamRole::d2h);
}

}  // namespace zinf::offload::detail
