// engine.cpp — the offload engine (zinf/offload/engine.h).
//
// Reading guide. A unit's life in one step:
//   forward   weights(u): resident → its buffer; windowed → a slot, fetched (or prefetched) from the
//             param home once u's previous update has landed (versions below)
//   backward  grads(u): a zeroed fp32 device buffer (resident, or a grad slot); grads_done(u):
//             GradOut+Reduce — round to 16 bits, through pinned landing buckets, into the Update's
//             source buffer (host or device); with GA > 1 accumulate in fp32
//   step      barrier (all reduces done) → norm over units in order → overflow/clip decision →
//             Update pipeline: per unit, per sub-group: fused cpu_adam pass, compute copy to its home
//             (device via a pinned upload slot, pinned host, or NVMe); then the unit "lands":
//             version[u] = applied_, which is what the next forward's weights(u) waits for.
// Every buffer is fixed in count and size and allocated in the constructor.
#include "zinf/offload/engine.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <future>
#include <optional>
#include <mutex>
#include <thread>

#include "zinf/cpu_adam/convert.h"
#include "zinf/cpu_adam/host_threads.h"
#include "zinf/error.h"
#include "zinf/jitter.h"
#include "zinf/pinned.h"
#include "zinf/nvme/swapper.h"
#include "zinf/offload/placement.h"
#include "zinf/serial_worker.h"

namespace zinf::offload {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

constexpr std::size_t kChunkAlign = 4096;  // elements: sub-group and bucket boundaries (16 KiB of fp32)

std::size_t round_up(std::size_t x, std::size_t a) { return (x + a - 1) / a * a; }

using Worker = SerialWorker;

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using HostMem = std::unique_ptr<char, FreeDeleter>;
HostMem host_alloc(std::size_t bytes) {
  void* p = std::aligned_alloc(64, round_up(std::max<std::size_t>(bytes, 64), 64));
  if (!p) throw Error("host allocation of " + std::to_string(bytes) + " bytes failed");
  return HostMem(static_cast<char*>(p));
}

}  // namespace

struct Engine::Impl {
  EngineConfig c;
  Device& dev;
  const bool mixed;
  const std::size_t cb;  // bytes of the compute copy
  const cpu_adam::HalfType half;
  const bool opt_off, param_off;
  std::size_t max_window_unit = 0, max_np = 0, bucket = 0, sg = 0;
  cpu_adam::HostThreads pool;
  std::unique_ptr<DeviceKernels> kern;       // the engine's work on device memory
  DeviceBuffer gradout_stage;                // device: one bucket rounded to 16 bits before it leaves
  std::unique_ptr<PinnedPool> pinned;  // declared first among holders: outlives every PinnedBuffer

  struct Unit {
    std::size_t n = 0;
    bool windowed = false, grad_windowed = false;
    DeviceBuffer dparam, dwork, dmaster, dm, dv, dgrad, dgrad16, dgradacc;
    HostMem hmaster, hm, hv, hgrad;
    PinnedBuffer hparam;  // offload_param cpu: the home of the compute copy
    std::vector<std::size_t> chunks;  // sub-group starts (elements)
    std::size_t chunk_len(std::size_t ci) const { return (ci + 1 < chunks.size() ? chunks[ci + 1] : n) - chunks[ci]; }
    std::vector<nvme::TensorStore::Id> sg_ids;
    nvme::TensorStore::Id param_id = 0;
    std::int64_t version = 0;   // updates landed
    int grad_slot = -1;         // under mu: the grad window slot this micro batch's gradient lives in
    bool reducing = false;      // under mu: a GradOut/Reduce of this unit still reads its device gradient
    EventHandle fetched;        // the last Fetch of this unit has read its home (h2d)
  };
  std::vector<Unit> units;

  struct Slot {  // a window slot for one unit's compute copy (+ fp32 working weights when mixed)
    DeviceBuffer param, work;
    PinnedBuffer staging;  // offload_param nvme: read target before the h2d copy
    int unit = -1;
    std::int64_t version = -1;
    int users = 0;
    std::uint64_t last_use = 0;
    EventHandle ready;     // h2d: the Fetch into this slot is complete
    EventHandle released;  // compute: the model's last read of this slot is complete
  };
  std::vector<Slot> slots;
  struct GradSlot {
    DeviceBuffer grad;
    bool busy = false;
  };
  std::vector<GradSlot> gslots;

  std::vector<PinnedBuffer> landing;   // 2 × bucket × cb
  std::vector<PinnedBuffer> upload;    // 2 × sub-group × cb (param none, optimizer offloaded; param nvme)
  std::vector<EventHandle> upload_ev;
  HostMem reduce_scratch;                    // bucket × 4: fp32 of a landed bucket (GA > 1)
  std::unique_ptr<nvme::TensorStore> ostore, pstore;
  std::unique_ptr<nvme::Swapper> swapper;

  Jitter reduce_jitter, update_jitter;  // the device's jitter, one lane per host worker
  std::unique_ptr<Worker> reduce_worker, update_worker;
  // The barrier's decision, for an Update pipeline started early (NVMe: sub-group reads overlap the
  // backward): the AdamStep, or nothing when the step is skipped.
  using Decision = std::optional<cpu_adam::AdamStep>;
  std::unique_ptr<std::promise<Decision>> decision;
  void decide(Decision d) {
    if (decision) {
      decision->set_value(d);
      decision.reset();
    }
  }
  std::mutex mu;
  std::condition_variable cv;
  std::int64_t applied = 0;  // updates launched (target version)
  bool update_failed = false;  // the Update pipeline threw: nobody may wait for a landing
  std::int64_t micro = 0;
  bool backward = false;
  std::uint64_t tick = 0;
  std::vector<bool> grad_zeroed;

  // busy times (seconds)
  std::mutex tmu;
  BusyTimes times;
  void add(double BusyTimes::*field, double s) {
    std::lock_guard<std::mutex> lk(tmu);
    times.*field += s;
  }

  bool exact() const { return c.overlap == Overlap::exact; }

  Impl(const EngineConfig& cfg, Device& d)
      : c(cfg),
        dev(d),
        mixed(cfg.precision != Precision::fp32),
        cb(cfg.precision == Precision::fp32 ? 4 : 2),
        half(cfg.precision == Precision::bf16 ? cpu_adam::HalfType::bf16 : cpu_adam::HalfType::fp16),
        opt_off(cfg.optimizer != OffloadDevice::none),
        param_off(cfg.param != OffloadDevice::none),
        pool(cfg.host_threads, cfg.pin_threads) {}

  // ---- helpers --------------------------------------------------------------------------------------
  // Host ⇄ device copies that complete before returning (the source may be a temporary).
  void h2d_sync(void* dst, const void* src, std::size_t bytes) {
    dev.copy_to_device(dst, src, bytes, StreamRole::h2d);
    dev.synchronize(StreamRole::h2d);
  }
  void d2h_sync(void* dst, const void* src, std::size_t bytes) {
    dev.copy_to_host(dst, src, bytes, StreamRole::d2h);
    dev.synchronize(StreamRole::d2h);
  }
  // Work enqueued on a stream, counted as that stream's busy time (measured by the device).
  void timed_on(StreamRole r, const std::function<void()>& enqueue) {
    BusyScope busy(dev, r);
    enqueue();
  }
  // The compute copy of a device fp32 range, on the device.
  void dev_to_compute(const float* s, void* d, std::size_t n, StreamRole r) {
    if (mixed) kern->to_half(s, d, n, half, r); else kern->copy(d, s, n * 4, r);
  }
  void to_half(const float* s, void* d, std::size_t n) {
    auto* o = static_cast<std::uint16_t*>(d);
    pool.parallel_for(n, 1 << 16, [&](std::size_t b, std::size_t e) {
      if (half == cpu_adam::HalfType::fp16) cpu_adam::fp32_to_fp16(s + b, o + b, e - b); else cpu_adam::fp32_to_bf16(s + b, o + b, e - b);
    });
  }
  void from_half(const void* s, float* d, std::size_t n) {
    const auto* i = static_cast<const std::uint16_t*>(s);
    pool.parallel_for(n, 1 << 16, [&](std::size_t b, std::size_t e) {
      if (half == cpu_adam::HalfType::fp16) cpu_adam::fp16_to_fp32(i + b, d + b, e - b); else cpu_adam::bf16_to_fp32(i + b, d + b, e - b);
    });
  }
  void add_into(float* acc, const float* x, std::size_t n) {
    pool.parallel_for(n, 1 << 16, [&](std::size_t b, std::size_t e) {
      for (std::size_t i = b; i < e; ++i) acc[i] += x[i];
    });
  }
  // The compute copy (cb bytes per element) of an fp32 range.
  void to_compute(const float* s, void* d, std::size_t n) {
    if (mixed) to_half(s, d, n); else std::memcpy(d, s, n * 4);
  }
  // The buffer and type the Update reads for unit u.
  std::pair<const void*, cpu_adam::GradType> grad_source(Unit& u) {
    const cpu_adam::GradType g16 = half == cpu_adam::HalfType::bf16 ? cpu_adam::GradType::bf16 : cpu_adam::GradType::fp16;
    if (!opt_off) {
      if (c.grad_accum > 1) return {u.dgradacc.as<float>(), cpu_adam::GradType::fp32};
      if (mixed) return {u.dgrad16.as<void>(), g16};
      return {u.dgrad.as<float>(), cpu_adam::GradType::fp32};
    }
    if (c.grad_accum > 1 || !mixed) return {u.hgrad.get(), cpu_adam::GradType::fp32};
    return {u.hgrad.get(), g16};
  }
  std::size_t gsize() const { return (c.grad_accum > 1 || !mixed) ? 4 : 2; }

  // ---- windows ---------------------------------------------------------------------------------------
  void wait_landed(std::size_t u) {
    {
      std::unique_lock<std::mutex> lk(mu);
      cv.wait(lk, [&] { return units[u].version == applied || update_failed; });
      if (!update_failed) return;
    }
    update_worker->drain();  // rethrows the pipeline's error
    throw Error("offload: the parameter update failed earlier");
  }
  // Runs an Update pipeline on the update worker; a failure wakes everyone waiting for a landing.
  void push_update(std::function<void()> job) {
    update_worker->push([this, job = std::move(job)] {
      try {
        job();
      } catch (...) {
        {
          std::lock_guard<std::mutex> lk(mu);
          update_failed = true;
        }
        cv.notify_all();
        throw;
      }
    });
  }
  int find_slot(std::size_t u) {
    std::lock_guard<std::mutex> lk(mu);
    for (std::size_t i = 0; i < slots.size(); ++i)
      if (slots[i].unit == static_cast<int>(u) && slots[i].version == units[u].version) return static_cast<int>(i);
    return -1;
  }
  // Starts bringing unit u into a free slot; returns the slot or −1 when every slot is in use.
  int fetch(std::size_t u) {
    int best = -1;
    for (std::size_t i = 0; i < slots.size(); ++i) {
      if (slots[i].users > 0) continue;
      if (best < 0 || slots[i].last_use < slots[static_cast<std::size_t>(best)].last_use) best = static_cast<int>(i);
    }
    if (best < 0) return -1;
    Slot& s = slots[static_cast<std::size_t>(best)];
    if (s.ready) s.ready->wait();  // a previous fetch into this slot must be finished
    // The model may still be reading the slot's previous unit: the h2d stream waits for the compute
    // stream's event recorded at done_with before it overwrites the slot.
    if (s.released) dev.wait_event(StreamRole::h2d, s.released);
    Unit& un = units[u];
    s.unit = static_cast<int>(u);
    {
      std::lock_guard<std::mutex> lk(mu);
      s.version = un.version;
    }
    s.last_use = ++tick;
    const std::size_t bytes = un.n * cb;
    const bool from_nvme = c.param == OffloadDevice::nvme;
    void* src = from_nvme ? s.staging.data() : un.hparam.data();
    void* dst = s.param.as<void>();
    float* work = mixed ? s.work.as<float>() : nullptr;
    const std::size_t n = un.n;
    const auto pid = un.param_id;
    if (from_nvme)  // Fetch: NVMe → pinned (in stream order, before the copy) …
      dev.launch(StreamRole::h2d, [this, src, bytes, pid] { pstore->read(pid, src, 0, bytes)->wait(); });
    timed_on(StreamRole::h2d, [&] {  // … → device
      dev.copy_to_device(dst, src, bytes, StreamRole::h2d);
      if (work) kern->from_half(dst, work, n, half, StreamRole::h2d);  // fp32 working weights for the model
    });
    s.ready = dev.record(StreamRole::h2d);
    un.fetched = s.ready;
    if (!exact()) s.ready->wait();
    return best;
  }
  void prefetch_after(std::size_t u) {
    if (!exact() || !param_off) return;
    for (int k = 1; k <= c.prefetch_depth; ++k) {
      const long next = backward ? static_cast<long>(u) - k : static_cast<long>(u) + k;
      if (next < 0 || next >= static_cast<long>(units.size())) break;
      const std::size_t v = static_cast<std::size_t>(next);
      if (!units[v].windowed) continue;
      if (find_slot(v) >= 0) continue;
      {
        std::lock_guard<std::mutex> lk(mu);
        if (units[v].version != applied) break;  // its update has not landed yet: fetch on demand
      }
      if (fetch(v) < 0) break;
    }
  }

  // ---- GradOut + Reduce ------------------------------------------------------------------------------
  void reduce_unit(std::size_t ui, float* dgrad, std::int64_t mb) {
    Unit& u = units[ui];
    const StreamRole r = StreamRole::d2h;
    if (!opt_off) {  // the Update reads device buffers: round (and accumulate) in place on the device
      timed_on(r, [&] {
        if (mixed) {
          kern->to_half(u.dgrad.as<float>(), u.dgrad16.as<void>(), u.n, half, r);
          if (c.grad_accum > 1) kern->from_half(u.dgrad16.as<void>(), u.dgrad.as<float>(), u.n, half, r);
        }
        if (c.grad_accum > 1) {
          if (mb == 0) kern->copy(u.dgradacc.as<float>(), u.dgrad.as<float>(), u.n * 4, r);
          else kern->add(u.dgradacc.as<float>(), u.dgrad.as<float>(), u.n, r);
        }
      });
      dev.synchronize(r);
      return;
    }
    // Bucket by bucket: rounded on the device, then through the pinned landing buffers. The copies
    // run ahead of the host's Reduce by as many buckets as there are landing buffers: bucket kb+L
    // is enqueued only after the host has finished with bucket kb's buffer, and the host waits for
    // each bucket's event. The one device staging buffer is reused in d2h stream order.
    const std::size_t L = landing.size(), nb = (u.n + bucket - 1) / bucket;
    std::vector<EventHandle> landed(L);
    std::size_t enqueued = 0;
    auto enqueue = [&](std::size_t kb) {
      const std::size_t o = kb * bucket, len = std::min(bucket, u.n - o);
      timed_on(r, [&] {  // GradOut: the 16-bit gradient leaves the device
        dev_to_compute(dgrad + o, gradout_stage.as<void>(), len, r);
        dev.copy_to_host(landing[kb % L].data(), gradout_stage.as<void>(), len * cb, r);
      });
      landed[kb % L] = dev.record(r);
    };
    for (std::size_t kb = 0; kb < nb; ++kb) {
      while (enqueued < nb && enqueued < kb + L) enqueue(enqueued++);
      const std::size_t o = kb * bucket, len = std::min(bucket, u.n - o);
      PinnedBuffer& land = landing[kb % L];
      landed[kb % L]->wait();
      auto t0 = Clock::now();
      char* dst = u.hgrad.get() + o * gsize();
      if (c.grad_accum == 1) {
        std::memcpy(dst, land.data(), len * cb);
      } else {
        float* acc = reinterpret_cast<float*>(dst);
        float* g = reinterpret_cast<float*>(reduce_scratch.get());
        if (mixed) from_half(land.data(), g, len); else std::memcpy(g, land.data(), len * 4);
        if (mb == 0) std::memcpy(acc, g, len * 4); else add_into(acc, g, len);
      }
      add(&BusyTimes::host, since(t0));
    }
    dev.synchronize(r);  // an error on the d2h stream surfaces here (events carry none)
  }

  // Walks unit u's NVMe sub-groups with one (pageable) staging buffer of master|m|v:
  // fn(o, len, padded_len, buf) for each, in order.
  void for_each_subgroup(Unit& u, const std::function<void(std::size_t, std::size_t, std::size_t, float*)>& fn) {
    const std::size_t cap = 12 * round_up(std::min(sg, u.n), 1024);
    PinnedPool p(cap, false);
    PinnedBuffer b = p.acquire(cap);
    for (std::size_t ci = 0; ci < u.chunks.size(); ++ci) fn(u.chunks[ci], u.chunk_len(ci), round_up(u.chunk_len(ci), 1024), static_cast<float*>(b.data()));
  }

  // ---- the Update ------------------------------------------------------------------------------------
  void update_chunk(Unit& u, std::size_t o, std::size_t len, float* master, float* m, float* v,
                    const cpu_adam::AdamStep& st, void* param_out) {
    auto [g, gt] = grad_source(u);
    cpu_adam::UpdateChunk ch;
    ch.n = len;
    ch.grad = static_cast<const char*>(g) + o * (gt == cpu_adam::GradType::fp32 ? 4 : 2);
    ch.grad_type = gt;
    ch.master = master;
    ch.m = m;
    ch.v = v;
    ch.param16 = mixed ? param_out : nullptr;
    ch.param16_type = half;
    if (!opt_off) {  // the states live on the device: the device's fused Update
      kern->adam_update(st, ch, StreamRole::d2h);
      if (!mixed && param_out != master) kern->copy(param_out, master, len * 4, StreamRole::d2h);
      dev.synchronize(StreamRole::d2h);
      return;
    }
    cpu_adam::adam_update(pool, st, ch);
    if (!mixed && param_out != master) std::memcpy(param_out, master, len * 4);
  }
  // Where the Update writes unit u's compute copy for [o, o+len): directly into its home when the
  // home is host-visible, else into a pinned upload slot that land_chunk() moves on.
  void* param_target(Unit& u, std::size_t o, int slot_k) {
    if (!u.windowed && !opt_off) return static_cast<char*>(u.dparam.as<void>()) + o * cb;  // the device's own Update writes it
    if (u.windowed && u.fetched) u.fetched->wait();  // no Fetch may still be reading the home we overwrite
    if (u.windowed && c.param == OffloadDevice::cpu) return static_cast<char*>(u.hparam.data()) + o * cb;
    PinnedBuffer& up = upload[static_cast<std::size_t>(slot_k)];
    if (upload_ev[static_cast<std::size_t>(slot_k)]) upload_ev[static_cast<std::size_t>(slot_k)]->wait();
    return up.data();
  }
  std::vector<nvme::IoHandle> param_writes;
  void land_chunk(Unit& u, std::size_t o, std::size_t len, int slot_k) {
    if ((!u.windowed && !opt_off) || (u.windowed && c.param == OffloadDevice::cpu)) return;
    void* src = upload[static_cast<std::size_t>(slot_k)].data();
    if (u.windowed) {  // offload_param nvme: the compute copy goes home to NVMe
      param_writes.push_back(pstore->write(u.param_id, src, o * cb, len * cb));
      upload_ev[static_cast<std::size_t>(slot_k)] = nullptr;
      param_writes.back()->wait();  // the slot is reused next; sub-group reads keep the disk busy meanwhile
      param_writes.clear();
      return;
    }
    char* dst = static_cast<char*>(u.dparam.as<void>()) + o * cb;  // Upload: pinned → device
    const std::size_t bytes = len * cb;
    timed_on(StreamRole::h2d, [&] { dev.copy_to_device(dst, src, bytes, StreamRole::h2d); });
    upload_ev[static_cast<std::size_t>(slot_k)] = dev.record(StreamRole::h2d);
  }
  void land_unit(std::size_t ui) {
    Unit& u = units[ui];
    for (auto& e : upload_ev)
      if (e) e->wait();
    if (!u.windowed && mixed) {  // the CPU device's fp32 working weights follow the new 16-bit copy
      timed_on(StreamRole::h2d, [&] { kern->from_half(u.dparam.as<void>(), u.dwork.as<float>(), u.n, half, StreamRole::h2d); });
      dev.synchronize(StreamRole::h2d);
    }
    {
      std::lock_guard<std::mutex> lk(mu);
      u.version = applied;
    }
    cv.notify_all();
  }
  void run_update(const cpu_adam::AdamStep& st) {
    std::promise<Decision> p;
    p.set_value(st);
    run_update(p.get_future().share());
  }
  void run_update(std::shared_future<Decision> fut) {
    int k = 0;
    if (c.optimizer != OffloadDevice::nvme && !fut.get()) return;
    if (c.optimizer != OffloadDevice::nvme) {
      const cpu_adam::AdamStep st = *fut.get();
      for (std::size_t ui = 0; ui < units.size(); ++ui) {
        Unit& u = units[ui];
        for (std::size_t ci = 0; ci < u.chunks.size(); ++ci) {
          const std::size_t o = u.chunks[ci], len = u.chunk_len(ci);
          // fp32 with the optimizer on the device and no separate master: the compute copy is the master
          float* base_m = opt_off ? reinterpret_cast<float*>(u.hmaster.get())
                                  : (u.dmaster.size() ? u.dmaster.as<float>() : u.dparam.as<float>());
          float* base_a = opt_off ? reinterpret_cast<float*>(u.hm.get()) : u.dm.as<float>();
          float* base_b = opt_off ? reinterpret_cast<float*>(u.hv.get()) : u.dv.as<float>();
          const int slot_k = k++ % 2;
          void* out = param_target(u, o, slot_k);
          const auto t0 = Clock::now();
          update_chunk(u, o, len, base_m + o, base_a + o, base_b + o, st, out);
          add(&BusyTimes::host, since(t0));
          land_chunk(u, o, len, slot_k);
        }
        land_unit(ui);
      }
      return;
    }
    // NVMe: the swapper streams each sub-group's master|m|v: read ahead, update, write behind.
    struct Item {
      std::size_t unit, o, len;
    };
    std::vector<Item> meta;
    std::vector<nvme::SwapItem> items;
    for (std::size_t ui = 0; ui < units.size(); ++ui) {
      Unit& u = units[ui];
      for (std::size_t ci = 0; ci < u.chunks.size(); ++ci) {
        const std::size_t o = u.chunks[ci], len = u.chunk_len(ci);
        meta.push_back({ui, o, len});
        items.push_back({u.sg_ids[ci], 0, 12 * round_up(len, 1024), true, true});
      }
    }
    swapper->run(items, [&](std::size_t i, void* buf, std::size_t) {
      const Decision& d = fut.get();  // reads ahead meanwhile; blocks only until the barrier decides
      if (!d) return;                 // skipped step: the states go back unchanged
      const cpu_adam::AdamStep& st = *d;
      const Item& it = meta[i];
      Unit& u = units[it.unit];
      const std::size_t pl = round_up(it.len, 1024);
      float* f = static_cast<float*>(buf);
      const int slot_k = k++ % 2;
      void* out = param_target(u, it.o, slot_k);
      const auto t0 = Clock::now();
      update_chunk(u, it.o, it.len, f, f + pl, f + 2 * pl, st, out);
      add(&BusyTimes::host, since(t0));
      land_chunk(u, it.o, it.len, slot_k);
      if (it.o + it.len == u.n) land_unit(it.unit);
    }, exact() ? -1 : 0);
  }
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
  return in;
}

std::size_t Engine::device_bytes(const EngineConfig& c) {
  return make_plan(plan_input(c)).totals[static_cast<int>(Tier::device)];
}
std::size_t Engine::pinned_bytes(const EngineConfig& c) { return make_plan(plan_input(c)).pinned_pool; }

// ---- construction ------------------------------------------------------------------------------------

Engine::Engine(const EngineConfig& cfg, Device& dev, const InitFn& init) {
  ZINF_CHECK(!cfg.units.empty() && cfg.persistent.size() == cfg.units.size());
  impl_ = std::make_unique<Impl>(cfg, dev);
  Impl& m = *impl_;
  m.kern = cfg.kernels ? cfg.kernels(dev, m.pool) : host_kernels(dev, m.pool);
  const EngineConfig& c = m.c;
  const Plan plan = make_plan(plan_input(c));
  const std::size_t need_device = plan.totals[static_cast<int>(Tier::device)];
  if (need_device > dev.budget() - dev.in_use())
    throw DeviceMemoryError("the offload plan needs " + std::to_string(need_device) + " bytes of device memory for states and windows, " +
                                std::to_string(dev.budget() - dev.in_use()) + " are left in the budget of " + std::to_string(dev.budget()),
                            "offload more (offload_optimizer / offload_param), raise device.memory_budget, or see `zinf plan`");
  m.pinned = std::make_unique<PinnedPool>(plan.pinned_pool, c.pin_memory);
  if (m.pinned->capacity()) dev.register_host(m.pinned->slab().iov_base, m.pinned->capacity());  // CUDA: one copy, no bounce

  std::size_t max_unit = 0;
  for (std::size_t u = 0; u < c.units.size(); ++u) {
    max_unit = std::max(max_unit, c.units[u]);
    if (m.param_off && !c.persistent[u]) m.max_window_unit = std::max(m.max_window_unit, c.units[u]);
    if (!c.persistent[u]) m.max_np = std::max(m.max_np, c.units[u]);
  }
  m.bucket = std::min(round_up(std::max<std::size_t>(c.reduce_bucket_size, 1), kChunkAlign), round_up(max_unit, kChunkAlign));
  m.sg = std::min(round_up(std::max<std::size_t>(c.sub_group_size, 1), kChunkAlign), round_up(max_unit, kChunkAlign));
  if (c.optimizer == OffloadDevice::nvme) m.ostore = std::make_unique<nvme::TensorStore>(c.optimizer_store, c.optimizer_faults);
  if (c.param == OffloadDevice::nvme) m.pstore = std::make_unique<nvme::TensorStore>(c.param_store);

  const std::size_t cb = m.cb;
  std::vector<float> tmp(max_unit);
  std::vector<char> tmp16(max_unit * cb);
  for (std::size_t ui = 0; ui < c.units.size(); ++ui) {
    Impl::Unit u;
    u.n = c.units[ui];
    u.windowed = m.param_off && !c.persistent[ui];
    u.grad_windowed = m.opt_off && !c.persistent[ui];  // with the optimizer off the device, gradients only pass through
    const std::string nm = "unit " + std::to_string(ui);
    for (std::size_t o = 0; o < u.n; o += m.sg) u.chunks.push_back(o);
    if (u.chunks.empty()) u.chunks.push_back(0);
    init(ui, tmp.data());
    // optimizer states
    if (!m.opt_off) {
      if (m.mixed || m.param_off) u.dmaster = DeviceBuffer(dev, u.n * 4, nm + " master");
      u.dm = DeviceBuffer(dev, u.n * 4, nm + " adam.m");
      u.dv = DeviceBuffer(dev, u.n * 4, nm + " adam.v");
      m.kern->zero(u.dm.as<void>(), u.n * 4, StreamRole::h2d);
      m.kern->zero(u.dv.as<void>(), u.n * 4, StreamRole::h2d);
    } else if (c.optimizer == OffloadDevice::cpu) {
      u.hmaster = host_alloc(u.n * 4);
      u.hm = host_alloc(u.n * 4);
      u.hv = host_alloc(u.n * 4);
      std::memcpy(u.hmaster.get(), tmp.data(), u.n * 4);
      std::memset(u.hm.get(), 0, u.n * 4);
      std::memset(u.hv.get(), 0, u.n * 4);
    }
    // the compute copy's home
    if (!u.windowed) {
      u.dparam = DeviceBuffer(dev, u.n * cb, nm + (m.mixed ? " param16" : " param"));
      if (m.mixed) u.dwork = DeviceBuffer(dev, u.n * 4, nm + " fp32 working weights");
      m.to_compute(tmp.data(), tmp16.data(), u.n);  // on the host, then up
      m.h2d_sync(u.dparam.as<void>(), tmp16.data(), u.n * cb);
      if (m.mixed) m.kern->from_half(u.dparam.as<void>(), u.dwork.as<float>(), u.n, m.half, StreamRole::h2d);
    }
    if (!m.opt_off && u.dmaster.size()) m.h2d_sync(u.dmaster.as<void>(), tmp.data(), u.n * 4);
    dev.synchronize(StreamRole::h2d);
    if (u.windowed && c.param == OffloadDevice::cpu) {
      u.hparam = m.pinned->acquire(u.n * cb);
      m.to_compute(tmp.data(), u.hparam.data(), u.n);
    }
    // gradients
    if (!m.opt_off) {
      u.dgrad = DeviceBuffer(dev, u.n * 4, nm + " grad");
      if (m.mixed) u.dgrad16 = DeviceBuffer(dev, u.n * 2, nm + " grad16");
      if (c.grad_accum > 1) u.dgradacc = DeviceBuffer(dev, u.n * 4, nm + " grad32");
    } else {
      if (!u.grad_windowed) u.dgrad = DeviceBuffer(dev, u.n * 4, nm + " grad");
      u.hgrad = host_alloc(u.n * m.gsize());
    }
    m.units.push_back(std::move(u));
    Impl::Unit& uu = m.units.back();
    if (uu.windowed && c.param == OffloadDevice::nvme) uu.param_id = m.pstore->add(nm + ".param", uu.n * cb);
    if (c.optimizer == OffloadDevice::nvme)
      for (std::size_t ci = 0; ci < uu.chunks.size(); ++ci) {
        const std::size_t len = uu.chunk_len(ci);
        uu.sg_ids.push_back(m.ostore->add(nm + ".sg" + std::to_string(ci), 12 * round_up(len, 1024)));
      }
    // Initial contents on NVMe, through one pinned block.
    const bool param_on_nvme = uu.windowed && c.param == OffloadDevice::nvme;
    if (param_on_nvme || c.optimizer == OffloadDevice::nvme) {
      const std::size_t bytes = std::max(param_on_nvme ? uu.n * cb : 0,
                                         c.optimizer == OffloadDevice::nvme ? 12 * round_up(std::min(m.sg, uu.n), 1024) : 0);
      PinnedPool init_pool(round_up(bytes, 4096), false);  // pageable: used once, at start
      PinnedBuffer b = init_pool.acquire(bytes);
      if (param_on_nvme) {
        m.to_compute(tmp.data(), b.data(), uu.n);
        m.pstore->write(uu.param_id, b.data())->wait();
      }
      if (c.optimizer == OffloadDevice::nvme)
        for (std::size_t ci = 0; ci < uu.chunks.size(); ++ci) {
          const std::size_t o = uu.chunks[ci], len = uu.chunk_len(ci);
          const std::size_t pl = round_up(len, 1024);
          std::memset(b.data(), 0, 12 * pl);
          std::memcpy(b.data(), tmp.data() + o, len * 4);
          m.ostore->write(uu.sg_ids[ci], b.data())->wait();
        }
    }
  }
  // windows and staging
  if (m.param_off) {
    const int nslots = std::max(2, 1 + c.prefetch_depth);
    for (int i = 0; i < nslots; ++i) {
      Impl::Slot s;
      s.param = DeviceBuffer(dev, m.max_window_unit * cb, "param window slot " + std::to_string(i));
      if (m.mixed) s.work = DeviceBuffer(dev, m.max_window_unit * 4, "fp32 working weights slot " + std::to_string(i));
      if (c.param == OffloadDevice::nvme) s.staging = m.pinned->acquire(m.max_window_unit * cb);
      m.slots.push_back(std::move(s));
    }
  }
  if (m.opt_off) {
    for (int i = 0; i < 2 && m.max_np > 0; ++i) {
      Impl::GradSlot g;
      g.grad = DeviceBuffer(dev, m.max_np * 4, "grad window slot " + std::to_string(i));
      m.gslots.push_back(std::move(g));
    }
    for (int i = 0; i < 2; ++i) m.landing.push_back(m.pinned->acquire(m.bucket * cb));
    m.gradout_stage = DeviceBuffer(dev, m.bucket * cb, "grad out staging");
    if (c.grad_accum > 1) m.reduce_scratch = host_alloc(m.bucket * 4);
  }
  if (m.opt_off || c.param == OffloadDevice::nvme)
    for (int i = 0; i < 2; ++i) m.upload.push_back(m.pinned->acquire(m.sg * cb));
  m.upload_ev.resize(2);
  if (c.optimizer == OffloadDevice::nvme)
    m.swapper = std::make_unique<nvme::Swapper>(*m.ostore, *m.pinned, m.exact() ? c.optimizer_buffer_count : 1,
                                                12 * round_up(m.sg, 1024));
  m.grad_zeroed.assign(m.units.size(), false);
  m.reduce_jitter = Jitter(dev.jitter(), 11);
  m.update_jitter = Jitter(dev.jitter(), 12);
  m.reduce_worker = std::make_unique<Worker>([&m] { m.reduce_jitter.delay(); });
  m.update_worker = std::make_unique<Worker>([&m] { m.update_jitter.delay(); });
}

Engine::~Engine() {
  if (!impl_) return;
  impl_->decide(std::nullopt);
  try {
    impl_->reduce_worker->drain();
  } catch (...) {
  }
  try {
    impl_->update_worker->drain();
  } catch (...) {
  }
  try {
    impl_->dev.synchronize();
  } catch (...) {
  }
  if (impl_->pinned && impl_->pinned->capacity()) impl_->dev.unregister_host(impl_->pinned->slab().iov_base);
}

// ---- model side ---------------------------------------------------------------------------------------

void Engine::begin_micro_batch(std::int64_t micro) {
  impl_->micro = micro;
  std::fill(impl_->grad_zeroed.begin(), impl_->grad_zeroed.end(), false);
}
void Engine::begin_forward() { impl_->backward = false; }
void Engine::begin_backward() {
  Impl& m = *impl_;
  m.backward = true;
  if (m.exact() && m.c.optimizer == OffloadDevice::nvme && m.micro == m.c.grad_accum - 1 && !m.decision) {
    m.decision = std::make_unique<std::promise<Impl::Decision>>();
    auto fut = m.decision->get_future().share();
    m.push_update([&m, fut] { m.run_update(fut); });  // SwapIn of the first sub-groups starts now
  }
}

const float* Engine::weights(std::size_t u) {
  Impl& m = *impl_;
  m.reduce_worker->check();
  m.update_worker->check();
  m.wait_landed(u);
  Impl::Unit& un = m.units[u];
  if (!un.windowed) return m.mixed ? un.dwork.as<float>() : un.dparam.as<float>();
  int s = m.find_slot(u);
  if (s < 0) s = m.fetch(u);
  if (s < 0) throw Error("offload: no free parameter window slot for unit " + std::to_string(u));
  Impl::Slot& slot = m.slots[static_cast<std::size_t>(s)];
  model_waits_for(m.dev, slot.ready);  // the model reads the slot after the Fetch's copies
  ++slot.users;
  slot.last_use = ++m.tick;
  m.prefetch_after(u);
  return m.mixed ? slot.work.as<float>() : slot.param.as<float>();
}

void Engine::done_with(std::size_t u) {
  Impl& m = *impl_;
  if (!m.units[u].windowed) return;
  const int s = m.find_slot(u);
  if (s < 0) return;
  Impl::Slot& slot = m.slots[static_cast<std::size_t>(s)];
  if (slot.users > 0 && --slot.users == 0)
    slot.released = m.dev.record(StreamRole::compute);  // behind the model's last read of the slot
}

float* Engine::grads(std::size_t u) {
  Impl& m = *impl_;
  Impl::Unit& un = m.units[u];
  float* g;
  {
    std::unique_lock<std::mutex> lk(m.mu);
    // The previous micro batch's GradOut/Reduce of this unit may still read its buffer (and, for a
    // windowed gradient, still hold its slot): the Reduce worker clears `reducing` when it is done.
    m.cv.wait(lk, [&] { return !un.reducing; });
    if (un.grad_windowed) {
      if (un.grad_slot < 0) {
        int free_slot = -1;
        m.cv.wait(lk, [&] {
          for (std::size_t i = 0; i < m.gslots.size(); ++i)
            if (!m.gslots[i].busy) return (free_slot = static_cast<int>(i)) >= 0;
          return false;
        });
        m.gslots[static_cast<std::size_t>(free_slot)].busy = true;
        un.grad_slot = free_slot;
      }
      g = m.gslots[static_cast<std::size_t>(un.grad_slot)].grad.as<float>();
    } else {
      g = un.dgrad.as<float>();
    }
  }
  if (!m.grad_zeroed[u]) {
    m.kern->zero(g, un.n * 4, StreamRole::compute);
    // A model whose ops are compute-stream work is ordered behind the zeros already; one that runs
    // on the host must see them now.
    if (!m.dev.ops_stream_ordered()) m.dev.synchronize(StreamRole::compute);
    m.grad_zeroed[u] = true;
  }
  return g;
}

void Engine::grads_done(std::size_t u) {
  Impl& m = *impl_;
  Impl::Unit& un = m.units[u];
  const std::int64_t mb = m.micro;
  float* g;
  {
    std::lock_guard<std::mutex> lk(m.mu);
    ZINF_CHECK(!un.grad_windowed || un.grad_slot >= 0);  // grads(u) came first
    g = un.grad_windowed ? m.gslots[static_cast<std::size_t>(un.grad_slot)].grad.as<float>() : un.dgrad.as<float>();
    un.reducing = true;
  }
  m.dev.wait_event(StreamRole::d2h, m.dev.record(StreamRole::compute));  // the gradient is complete
  auto job = [&m, u, g, mb] {
    struct Release {  // also on an exception, so nobody waits forever on the buffer
      Impl& m;
      std::size_t u;
      ~Release() {
        Impl::Unit& x = m.units[u];
        {
          std::lock_guard<std::mutex> lk(m.mu);
          if (x.grad_windowed && x.grad_slot >= 0) {
            m.gslots[static_cast<std::size_t>(x.grad_slot)].busy = false;
            x.grad_slot = -1;
          }
          x.reducing = false;
        }
        m.cv.notify_all();
      }
    } release{m, u};
    m.reduce_unit(u, g, mb);
  };
  if (m.exact()) m.reduce_worker->push(job); else job();
}

// ---- the step ------------------------------------------------------------------------------------------

StepOutcome Engine::step(const StepOptions& o) {
  Impl& m = *impl_;
  try {
    m.reduce_worker->drain();  // the barrier: every gradient is in its Update buffer
  } catch (...) {
    m.decide(std::nullopt);  // an early-started Update must not wait forever
    throw;
  }
  const auto t0 = Clock::now();
  double sumsq = 0;
  bool finite = true;
  for (auto& u : m.units) {  // units in order, 64 Ki blocks in order: the same sum on every placement
    auto [g, gt] = m.grad_source(u);
    const auto s = m.opt_off ? cpu_adam::sum_squares(m.pool, g, gt, u.n) : m.kern->sum_squares(g, gt, u.n, StreamRole::d2h);
    sumsq += s.sum;
    finite = finite && s.finite;
  }
  m.add(&BusyTimes::host, since(t0));
  StepOutcome out;
  out.norm = std::sqrt(sumsq) / o.loss_scale;
  out.finite = finite && std::isfinite(out.norm);
  if (!out.finite) {
    m.decide(std::nullopt);
    return out;
  }
  double combined = o.loss_scale;  // DeepSpeed: loss_scale × max(1, (norm + 1e-6) / clip)
  if (o.gradient_clipping > 0) {
    const double coef = (out.norm + 1e-6) / o.gradient_clipping;
    if (coef > 1) combined *= coef;
  }
  const cpu_adam::AdamStep st = cpu_adam::make_adam_step(o.hyper, o.step, static_cast<float>(1.0 / combined));
  {
    std::lock_guard<std::mutex> lk(m.mu);
    ++m.applied;
  }
  if (m.decision)
    m.decide(st);
  else if (m.exact())
    m.push_update([&m, st] { m.run_update(st); });
  else
    m.run_update(st);
  return out;
}

void Engine::synchronize() {
  impl_->decide(std::nullopt);  // a pipeline started for a step that never came: let it finish unchanged
  impl_->reduce_worker->drain();
  impl_->update_worker->drain();
  impl_->dev.synchronize();
}

void Engine::read_master(std::size_t ui, float* dst) {
  synchronize();
  Impl& m = *impl_;
  Impl::Unit& u = m.units[ui];
  if (m.c.optimizer == OffloadDevice::cpu) {
    std::memcpy(dst, u.hmaster.get(), u.n * 4);
  } else if (m.c.optimizer == OffloadDevice::none) {
    m.d2h_sync(dst, u.dmaster.size() ? u.dmaster.as<void>() : u.dparam.as<void>(), u.n * 4);
  } else {
    std::size_t ci = 0;
    m.for_each_subgroup(u, [&](std::size_t o, std::size_t len, std::size_t pl, float* buf) {
      m.ostore->read(u.sg_ids[ci++], buf, 0, 4 * pl)->wait();  // the master part only
      std::memcpy(dst + o, buf, len * 4);
    });
  }
}

void Engine::read_states(std::size_t ui, float* master, float* mm, float* vv) {
  synchronize();
  Impl& m = *impl_;
  Impl::Unit& u = m.units[ui];
  const std::size_t bytes = u.n * 4;
  if (m.c.optimizer == OffloadDevice::cpu) {
    std::memcpy(master, u.hmaster.get(), bytes);
    std::memcpy(mm, u.hm.get(), bytes);
    std::memcpy(vv, u.hv.get(), bytes);
  } else if (m.c.optimizer == OffloadDevice::none) {
    m.d2h_sync(master, u.dmaster.size() ? u.dmaster.as<void>() : u.dparam.as<void>(), bytes);
    m.d2h_sync(mm, u.dm.as<void>(), bytes);
    m.d2h_sync(vv, u.dv.as<void>(), bytes);
  } else {
    std::size_t ci = 0;
    m.for_each_subgroup(u, [&](std::size_t o, std::size_t len, std::size_t pl, float* f) {
      m.ostore->read(u.sg_ids[ci++], f)->wait();
      std::memcpy(master + o, f, len * 4);
      std::memcpy(mm + o, f + pl, len * 4);
      std::memcpy(vv + o, f + 2 * pl, len * 4);
    });
  }
}

void Engine::write_states(std::size_t ui, const float* master, const float* mm, const float* vv) {
  synchronize();
  Impl& m = *impl_;
  Impl::Unit& u = m.units[ui];
  const std::size_t bytes = u.n * 4;
  if (m.c.optimizer == OffloadDevice::cpu) {
    std::memcpy(u.hmaster.get(), master, bytes);
    std::memcpy(u.hm.get(), mm, bytes);
    std::memcpy(u.hv.get(), vv, bytes);
  } else if (m.c.optimizer == OffloadDevice::none) {
    if (u.dmaster.size()) m.h2d_sync(u.dmaster.as<void>(), master, bytes);
    m.h2d_sync(u.dm.as<void>(), mm, bytes);
    m.h2d_sync(u.dv.as<void>(), vv, bytes);
  } else {
    std::size_t ci = 0;
    m.for_each_subgroup(u, [&](std::size_t o, std::size_t len, std::size_t pl, float* f) {
      std::memset(f, 0, 12 * pl);
      std::memcpy(f, master + o, len * 4);
      std::memcpy(f + pl, mm + o, len * 4);
      std::memcpy(f + 2 * pl, vv + o, len * 4);
      m.ostore->write(u.sg_ids[ci++], f)->wait();
    });
  }
  // The compute copy, rebuilt from the master exactly as the Update would write it.
  if (!u.windowed) {
    std::vector<char> c16(u.n * m.cb);
    m.to_compute(master, c16.data(), u.n);
    m.h2d_sync(u.dparam.as<void>(), c16.data(), u.n * m.cb);
    if (m.mixed) m.kern->from_half(u.dparam.as<void>(), u.dwork.as<float>(), u.n, m.half, StreamRole::h2d);
    m.dev.synchronize(StreamRole::h2d);
  } else if (m.c.param == OffloadDevice::cpu) {
    m.to_compute(master, u.hparam.data(), u.n);
  } else {
    PinnedPool p(round_up(u.n * m.cb, 4096), false);
    PinnedBuffer b = p.acquire(u.n * m.cb);
    m.to_compute(master, b.data(), u.n);
    m.pstore->write(u.param_id, b.data())->wait();
  }
  {
    std::lock_guard<std::mutex> lk(m.mu);
    ++m.applied;  // every window slot is stale now; all units are current at the new version
    for (auto& other : m.units) other.version = m.applied;
  }
}

BusyTimes Engine::take_times() {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lk(m.tmu);
  BusyTimes t = m.times;
  // Stream work as the device measured it where it ran; the model's compute too when its ops are
  // stream work (otherwise the trainer reports the host time it spent in them).
  t.h2d += m.dev.take_busy(StreamRole::h2d);
  t.d2h += m.dev.take_busy(StreamRole::d2h);
  if (m.dev.ops_stream_ordered()) t.compute += m.dev.take_busy(StreamRole::compute);
  if (m.ostore) {
    t.nvme_read += m.ostore->take_busy(false);
    t.nvme_write += m.ostore->take_busy(true);
  }
  if (m.pstore) {
    t.nvme_read += m.pstore->take_busy(false);
    t.nvme_write += m.pstore->take_busy(true);
  }
  m.times = BusyTimes{};
  return t;
}

void Engine::add_compute_time(double s) { impl_->add(&BusyTimes::compute, s); }
std::size_t Engine::pinned_capacity() const { return impl_->pinned->capacity(); }
std::size_t Engine::pinned_peak() const { return impl_->pinned->peak(); }

std::string Engine::describe() const {
  const Impl& m = *impl_;
  std::string s = "offload_optimizer=" + std::string(to_string(m.c.optimizer)) +
                  " offload_param=" + std::string(to_string(m.c.param)) + ", overlap " +
                  (m.c.overlap == Overlap::exact ? "exact" : "none") + ", pinned pool " +
                  std::to_string(m.pinned->capacity()) + " bytes";
  if (m.ostore) s += "; optimizer store: " + m.ostore->description();
  if (m.pstore) s += "; param store: " + m.pstore->description();
  for (const auto* st : {m.ostore.get(), m.pstore.get()})
    if (st)
      for (const auto& line : st->stale_report()) s += "; stale swap directory " + line;
  return s;
}

}  // namespace zinf::offload
