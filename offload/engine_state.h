// engine_state.h — what the offload engine's stages share (internal to zinf_offload): the layer
// units and their buffers, the sub-group layout of optimizer states, the landing versions, and the
// host-side helpers. Each stage lives in its own file:
//
//   param_window.cpp      Fetch and the parameter window (slots, prefetch)
//   gradient_path.cpp     the gradient path: device gradient buffers, GradOut, landing buffers, Reduce
//   update_pipeline.cpp   the update pipeline: SwapIn, Update, Upload, SwapOut
//   optimizer_states.cpp  where master, m, v live: device, host memory or NVMe (one class per tier)
//   param_homes.cpp       where each unit's compute copy lives: device, pinned host or NVMe
//   engine.cpp            the front the model and the trainer call; construction; the norm barrier
//   resolve.cpp           the placement resolved once into each stage's variant (StagePlan)
//
// Locking: `mu` guards the fields marked "under mu" and the landing versions; `cv` is notified when
// a unit lands, a gradient buffer is released or the Update fails.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "compute_format.h"
#include "resolve.h"
#include "subgroup_layout.h"
#include "zinf/comm.h"
#include "zinf/cpu_adam/adam.h"
#include "zinf/cpu_adam/convert.h"
#include "zinf/cpu_adam/host_threads.h"
#include "zinf/device.h"
#include "zinf/error.h"
#include "zinf/nvme/store.h"
#include "zinf/offload/buffer_specs.h"
#include "zinf/offload/collectives.h"
#include "zinf/offload/dataflow.h"
#include "zinf/offload/engine.h"
#include "zinf/offload/engine_kernels.h"
#include "zinf/pinned.h"
#include "zinf/serial_worker.h"

namespace zinf::offload::detail {

class ParamHome;  // tiers.h

using Clock = std::chrono::steady_clock;
inline double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
inline std::size_t round_up(std::size_t x, std::size_t a) { return (x + a - 1) / a * a; }

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using HostMem = std::unique_ptr<char, FreeDeleter>;
inline HostMem host_alloc(std::size_t bytes) {
  void* p = std::aligned_alloc(64, round_up(std::max<std::size_t>(bytes, 64), 64));
  if (!p) throw Error("host allocation of " + std::to_string(bytes) + " bytes failed");
  return HostMem(static_cast<char*>(p));
}

// Where a stage's host work runs, decided once from the overlap: on the stage's own worker thread
// (Overlap::exact), or inline on the calling thread (Overlap::none), where an error throws at once.
// push() always queues on the worker (work that must run behind the caller, whatever the overlap).
// `on_error` runs on the worker when one of its jobs throws (before the error is kept for drain()).
class HostQueue {
 public:
  HostQueue(bool threaded, std::function<void()> before_job, std::function<void()> on_start,
            std::function<void()> on_error = {})
      : threaded_(threaded), on_error_(std::move(on_error)), worker_(std::move(before_job), std::move(on_start)) {}
  void run(std::function<void()> job) {
    if (threaded_)
      push(std::move(job));
    else
      job();
  }
  void push(std::function<void()> job) {
    if (!on_error_) return worker_.push(std::move(job));
    worker_.push([this, job = std::move(job)] {
      try {
        job();
      } catch (...) {
        on_error_();
        throw;
      }
    });
  }
  void drain() { worker_.drain(); }  // every job pushed so far has run; rethrows the first error
  void check() { worker_.check(); }  // rethrows the first error without waiting

 private:
  const bool threaded_;
  const std::function<void()> on_error_;
  SerialWorker worker_;  // last: its thread starts after the rest exists
};

// A unit's version while a discarded speculative Update's rewrite of its compute copy is undone
// (UpdatePipeline::settle sets it, restore() gives the unit its version back): no landing matches it.
inline constexpr std::int64_t kRestoring = std::numeric_limits<std::int64_t>::min();

// A layer unit: a flat range of `n` parameters, split into sub-groups for the Update. Its place in
// the layout (which buffers it has, the ranges this rank keeps) is the UnitLayout the buffer specs
// were made from.
//
// Data parallelism: this rank keeps the optimizer states of state_range, the reduced gradient of
// grad_range and, in its home, the compute copy of param_range — each either its shard (by the
// ZeRO stage, see shard_of) or the whole unit. Offsets stay global everywhere (sub-group starts,
// bucket offsets); a buffer holding a range is indexed from its start.
struct Unit : UnitLayout {
  std::size_t index = 0;            // its position in forward order (the specs' unit number)
  std::vector<std::size_t> bounds;  // shard boundaries of every rank: rank r owns [bounds[r], bounds[r+1])
  std::vector<std::size_t> chunks;  // sub-group starts (elements, within state_range)
  std::size_t chunk_len(std::size_t ci) const {
    return (ci + 1 < chunks.size() ? chunks[ci + 1] : state_range.hi) - chunks[ci];
  }
  // Elements of [o, o+len) in each rank's shard.
  std::vector<std::size_t> counts_in(std::size_t o, std::size_t len) const {
    std::vector<std::size_t> c(bounds.size() - 1);
    for (std::size_t r = 0; r + 1 < bounds.size(); ++r) {
      const std::size_t a = std::max(o, bounds[r]), b = std::min(o + len, bounds[r + 1]);
      c[r] = b > a ? b - a : 0;
    }
    return c;
  }

  // The compute copy (param_homes.cpp): resident on the device (param16, or fp32 in fp32 runs) with
  // fp32 working weights for 16-bit runs; or its home in pinned memory or on NVMe.
  ParamHome* home = nullptr;  // the tier of its compute copy: the resident or the windowed units' home
  const void* weights = nullptr;  // a resident unit's for the model: its fp32 working weights or compute copy
  DeviceBuffer param, work;
  PinnedBuffer pinned_home;
  nvme::TensorStore::Id nvme_param = 0;
  EventHandle fetched;  // h2d: the last Fetch of this unit has read its home

  // Its optimizer states are their tier's own (optimizer_states.cpp: DeviceStates, HostStates, NvmeStates).

  // Gradients: the buffers are the gradient path's own (GradientPath::UnitGrads); what the Update
  // and the trainer share with it is here, under mu.
  // Under mu: the Reduce of the step's last micro batch has finished, so the Update's input is final
  // (set by the Reduce worker, cleared when the last micro batch begins; the speculative Update waits
  // for it — the mutex hands the host gradient over from the Reduce worker to the update worker).
  bool reduced = false;

  std::int64_t version = 0;  // under mu: updates landed (kRestoring: being rebuilt, see below)
  // A resident unit's landing on the device: recorded on h2d behind its last Upload and its fp32
  // working weights (set by land_unit before the version; read by the trainer after it). The model's
  // stream waits for it in weights(u); the update worker goes on to the next unit meanwhile.
  EventHandle landed;
  // A resident unit whose landed compute copy still holds only this rank's fresh part, to be
  // gathered by the trainer (ParamHome::finish_landing; set by land_unit, cleared by the trainer).
  bool gather_pending = false;
};

// What every stage shares.
struct EngineState {
  EngineConfig config;
  Device& dev;
  // Every buffer the engine allocates, and the layout they come from (buffer_specs.h): the stages
  // allocate what these say, and `zinf plan` sums the same list.
  const BufferSpecs buffers;
  // The placement, decided once from config.plan (buffer_specs.h): the sizes, ranges and tiers the
  // stages allocate and index by (world and rank, the effective sizes, the compute copy's width).
  const Layout& layout;
  // What each stage does on this placement, resolved once from the layout (resolve.h): the stages
  // choose their strategies by it when they are made and never ask which tier they are on.
  const StagePlan stages;
  const cpu_adam::HalfType half;  // the 16-bit type of the compute copy (mixed runs)
  // The step of this placement as a graph (zinf/offload/dataflow.h). Every stage claims, when it is
  // made, each edge it hands over, with the handoff it uses: a handoff the graph lacks stops the
  // construction (claim), and Engine::unclaimed_handoffs lists the graph's engine edges no stage
  // claimed, so the graph and the code that orders the buffers are held to each other.
  const StepGraph graph;
  std::vector<char> claimed;  // per edge of `graph`
  // Communicators (null with one rank), one per thread that runs collectives, made in this order on
  // every rank: the trainer's thread (norm parts, checkpoints), the Reduce worker, the Update worker,
  // and the trainer's Fetch; the `d` ones for device memory (all issued by the trainer's thread when
  // ordered_collectives).
  std::unique_ptr<Comm> front_comm, reduce_comm, reduce_dcomm, update_comm, update_dcomm, fetch_comm, fetch_dcomm;
  // A stream-ordered device transport (NCCL): every device collective is issued by the trainer's
  // thread (the Reduce of device gradients at grads_done, gathers at Fetch and at first use after a
  // landing) and runs through `order`, so every rank runs them in one order.
  const bool ordered_collectives;
  CollectiveOrder order;
  cpu_adam::HostThreads threads;
  const std::unique_ptr<const ComputeFormat> format;  // the compute copy's number format (compute_format.h)
  std::unique_ptr<EngineKernels> kern;  // the engine's own work on device memory
  std::unique_ptr<PinnedPool> pinned;   // declared before every holder of a PinnedBuffer
  std::vector<Unit> units;

  std::mutex mu;
  std::condition_variable cv;
  std::int64_t applied = 0;    // under mu: updates launched (the version a landed unit has)
  bool update_failed = false;  // under mu: the Update threw; nobody may wait for a landing

  std::mutex times_mu;
  BusyTimes times;  // host and (synchronous device) compute time; streams are measured by the device
  std::int64_t times_window = 0;  // under times_mu: take_times calls so far (the trace's window)

  std::atomic<std::uint64_t> host_bytes{0};  // host memory held (alloc_host), for Engine::held_bytes

  // The disks under the NVMe stores, one meter per disk: the optimizer and parameter stores share one
  // when their folders are on one drive.
  nvme::DiskMeters disks;

  EngineState(const EngineConfig& cfg, Device& d)
      : config(cfg),
        dev(d),
        buffers(cfg.plan),
        layout(buffers.layout()),
        stages(resolve_stages(layout, cfg)),
        half(cfg.plan.precision == Precision::bf16 ? cpu_adam::HalfType::bf16 : cpu_adam::HalfType::fp16),
        graph(step_graph(layout)),
        claimed(graph.edges.size(), 0),
        ordered_collectives(resolve_ordered_collectives(layout, cfg)),
        threads(cfg.host_threads, cfg.pin_threads),
        format(make_compute_format(layout, threads, half)) {
    disks.trace_to(cfg.trace);
    for (nvme::StoreOptions* o : {&config.optimizer_store, &config.param_store})
      if (!o->disks) o->disks = &disks;
    // How the stores' transfers are named on their queue tracks in a trace: the supernodes they are.
    config.optimizer_store.queue = "optimizer states", config.optimizer_store.read_span = "SwapIn",
    config.optimizer_store.write_span = "SwapOut";
    config.param_store.queue = "parameters", config.param_store.read_span = "Fetch read",
    config.param_store.write_span = "param write";
  }

  // The stage calling this hands over the edge from `from` to `to` with `h` (construction only).
  void claim(const char* from, const char* to, Handoff h) {
    const int e = graph.edge(from, to, h);
    if (e < 0)
      throw Error(std::string("offload engine: the step graph has no ") + handoff_name(h) + " handoff from " + from +
                  " to " + to + " for " + graph.placement);
    claimed[static_cast<std::size_t>(e)] = 1;
  }

  bool exact() const { return layout.exact; }
  bool parallel() const { return layout.parallel; }

  // The spec of `what` for unit `u` (kShared: a shared buffer); null when the engine has none.
  const BufferSpec* find(Buffer what, std::size_t u = kShared) const { return buffers.find(what, u); }
  // The spec of a buffer the caller must have, on the tier it allocates it on.
  const BufferSpec& spec(Buffer what, std::size_t u, Tier where) const {
    const BufferSpec* b = buffers.find(what, u);
    ZINF_CHECK(b && b->tier == where);
    return *b;
  }
  // Host memory for the engine's own buffers, counted.
  HostMem alloc_host(std::size_t bytes) {
    host_bytes += bytes;
    return host_alloc(bytes);
  }

  void add_time(double BusyTimes::*field, double s) {
    std::lock_guard<std::mutex> lk(times_mu);
    times.*field += s;
  }
  // Host busy time from t0 to now: `what` (static storage) on unit `unit`, also a span on the calling
  // thread's trace track, counted in the same window as the time.
  void add_host_time(Clock::time_point t0, const char* what, std::int64_t unit = -1) {
    const Clock::time_point t1 = Clock::now();
    std::lock_guard<std::mutex> lk(times_mu);
    times.host += std::chrono::duration<double>(t1 - t0).count();
    if (config.trace) config.trace->span(config.trace->this_thread_track(), what, unit, t0, t1, times_window);
  }
  // Names the calling worker's trace track.
  void name_thread(const char* name) {
    if (config.trace) config.trace->name_this_thread(name);
  }

  // Host ⇄ device copies that complete before returning (the source may be a temporary).
  void h2d_sync(void* dst, const void* src, std::size_t bytes) {
    dev.copy_to_device(dst, src, bytes, StreamRole::h2d);
    dev.synchronize(StreamRole::h2d);
  }
  void d2h_sync(void* dst, const void* src, std::size_t bytes) {
    dev.copy_to_host(dst, src, bytes, StreamRole::d2h);
    dev.synchronize(StreamRole::d2h);
  }
  // Host arithmetic on the host threads (chunked, so the result does not depend on the count).
  void add_into(float* acc, const float* x, std::size_t n) { add_fp32(threads, acc, x, n); }
  // The compute copy (compute_bytes per element) of an fp32 range, on the host.
  void to_compute(const float* s, void* d, std::size_t n) { format->from_fp32(s, d, n); }

  // Blocks until unit u's latest update has landed; rethrows when the Update failed (`rethrow` drains
  // the update worker, which holds the error).
  void wait_landed(std::size_t u, const std::function<void()>& rethrow) {
    {
      std::unique_lock<std::mutex> lk(mu);
      cv.wait(lk, [&] { return units[u].version == applied || update_failed; });
      if (!update_failed) return;
    }
    rethrow();
    throw Error("offload: the parameter update failed earlier");
  }
};

}  // namespace zinf::offload::detail
