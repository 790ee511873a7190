// zinf/device.h — the device seam (docs/design.md, "The device seam"): memory within a budget,
// async copies between pinned host memory and the device, streams named by role, events,
// synchronisation.
//
// The CPU device is always built: its "device memory" is host memory charged against a configured
// budget, its streams are in-order queues each served by one worker thread, and a "launch" runs a
// host function on the stream's worker. The CUDA device implements the same calls with real streams;
// the default stream is never used. Work is always passed an explicit stream role.
//
// Ordering. Whether the model's ops are stream work is a property of the device, stated by
// ops_stream_ordered(), never guessed: on the CUDA device (and the CPU device in async mode) an op
// call only enqueues work on the compute stream, so a buffer the model reads may be overwritten only
// after an event recorded on compute behind that read; on the synchronous CPU device an op has run
// when its call returns. A buffer written on one stream and read on another is handed over by an
// event recorded after the writer and waited on by the reader's stream (wait_event) or, where the
// host itself reads, by the host (DeviceEvent::wait).
//
// The CPU device's async mode runs the model's ops on the compute stream's worker, and its jitter
// (zinf/jitter.h) delays every job on every stream by a seeded random time, so a missing event shows
// up as a changed digest in CI, which has no GPU. The math is the same, so the digests equal the
// synchronous device's bit for bit.
//
// Busy time is measured where the work runs: between busy_begin and busy_end on a stream, the CPU
// device counts its worker's own job time (waits for events and jitter excluded), the CUDA device
// the time between events recorded at the two marks. take_busy returns and resets it. On the
// synchronous CPU device the model's ops are not stream work: its compute marks are ignored.
// Each mark names what it holds (BusyLabel); with a Trace attached (trace_to) the device records
// the busy time it counts as spans on its streams' tracks (zinf/trace.h): the CPU device one span per
// job inside marks, the CUDA device one per interval between its events.
//
// Errors: an allocation over budget throws DeviceMemoryError naming the allocation and the budget
// (never an OOM kill). An exception thrown by work on a stream is kept and rethrown by the next
// synchronize() on that stream (or the device), so it reaches the caller of the step.
// Thread-safety: all calls may be made from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "zinf/error.h"
#include "zinf/jitter.h"
#include "zinf/trace.h"
#include "zinf/types.h"

namespace zinf {

enum class StreamRole { compute = 0, h2d = 1, d2h = 2 };
constexpr int kStreamRoles = 3;
constexpr const char* to_string(StreamRole r) { return enum_name(r, {"compute", "h2d", "d2h"}); }

// What a busy mark holds, as the trace names it: a supernode or the model's pass ("Fetch", "forward")
// with static storage, and the layer unit (-1: none).
struct BusyLabel {
  const char* name = "busy";
  std::int64_t unit = -1;
};

class DeviceMemoryError : public Error {
 public:
  using Error::Error;
};
// What every device says when an allocation would pass its budget: over_budget_error
// (zinf/backends/sysinfo.h).

// An event recorded on a stream; completes when the work enqueued before it has run.
class DeviceEvent {
 public:
  virtual ~DeviceEvent() = default;
  virtual bool done() const = 0;
  virtual void wait() = 0;  // blocks the calling host thread
};
using EventHandle = std::shared_ptr<DeviceEvent>;

class Device {
 public:
  virtual ~Device() = default;
  virtual std::string name() const = 0;

  // Memory. `what` names the allocation in errors ("block.3 activations").
  virtual void* allocate(std::size_t bytes, const std::string& what) = 0;
  virtual void free(void* p) = 0;
  virtual std::size_t budget() const = 0;
  virtual std::size_t in_use() const = 0;
  virtual std::size_t peak() const = 0;

  // Async copies on a stream (h2d for host→device, d2h for device→host by convention).
  virtual void copy_to_device(void* dst, const void* src, std::size_t bytes, StreamRole s) = 0;
  virtual void copy_to_host(void* dst, const void* src, std::size_t bytes, StreamRole s) = 0;
  // Enqueues host code that drives the device (CPU device: runs it on the stream's worker).
  virtual void launch(StreamRole s, std::function<void()> fn) = 0;

  // Page-locks (registers) host memory with the device so copies from it run asynchronously at full
  // speed — the pinned pool's slab. The CPU device needs nothing; the CUDA device calls
  // cudaHostRegister. Pair with unregister_host before the memory is freed.
  virtual void register_host(void* /*p*/, std::size_t /*bytes*/) {}
  virtual void unregister_host(void* /*p*/) {}

  // Makes the calling thread's device calls reach this device: every thread other than the one that
  // made the device calls it before its first device call (the offload engine's workers do, when
  // they start). The CUDA device selects its GPU for the thread (cudaSetDevice: the CUDA runtime's
  // current device is per thread, and a thread that never sets it talks to GPU 0 — another rank's
  // GPU when a node has several). Nothing to do on the CPU device.
  virtual void bind_thread() {}

  // The native stream handle (cudaStream_t on the CUDA device; an opaque handle per stream on the CPU
  // device, for communicators that enqueue on streams). Only a stream-ordered Comm passes it on.
  virtual void* native_stream(StreamRole /*s*/) { return nullptr; }

  virtual EventHandle record(StreamRole s) = 0;
  virtual void wait_event(StreamRole s, EventHandle e) = 0;  // the stream waits, the host does not
  // Profiling: an event that also keeps the time its stream reached it, and the seconds between two
  // such events of one stream (waits for `b`).
  virtual EventHandle record_timed(StreamRole s) { return record(s); }
  virtual double elapsed_seconds(const EventHandle& a, const EventHandle& b) = 0;
  virtual void synchronize(StreamRole s) = 0;
  virtual void synchronize() = 0;

  // True when the model's ops are enqueued on the compute stream (CUDA; the CPU device in async
  // mode); false when they run on the calling thread before the call returns (the CPU device).
  virtual bool ops_stream_ordered() const = 0;
  // The delays this device puts before stream jobs; the offload engine applies the same to its host
  // workers. Off on every device but the jittered CPU device.
  virtual JitterSpec jitter() const { return {}; }

  // Busy time of stream s: work enqueued between busy_begin(s) and busy_end(s). Marks may come from
  // several host threads and nest; the stream is busy while any is open. `what` names the work in a
  // trace; busy_end gets the label its busy_begin got (on the same thread).
  virtual void busy_begin(StreamRole s, const BusyLabel& what = {}) = 0;
  virtual void busy_end(StreamRole s, const BusyLabel& what = {}) = 0;
  // Seconds stream s was busy inside marks completed since the last call; resets the count. Each call
  // closes the stream's trace window (zinf/trace.h).
  virtual double take_busy(StreamRole s) = 0;
  // Records the busy time of the streams into `t` from now on (null: stop). Call before any mark is
  // open, with `t` outliving the device's use of it.
  virtual void trace_to(Trace* /*t*/) {}
};

// Makes the model's next ops see what `e` completes: the compute stream waits for it when the ops
// are stream-ordered, the host waits otherwise (the ops run on the host).
inline void model_waits_for(Device& d, const EventHandle& e) {
  if (!e) return;
  if (d.ops_stream_ordered())
    d.wait_event(StreamRole::compute, e);
  else
    e->wait();
}

// Marks the work enqueued on a stream during a scope as busy time.
class BusyScope {
 public:
  BusyScope(Device& d, StreamRole s, const BusyLabel& what = {}) : device_(d), role_(s), what_(what) {
    device_.busy_begin(role_, what_);
  }
  ~BusyScope() { device_.busy_end(role_, what_); }
  BusyScope(const BusyScope&) = delete;
  BusyScope& operator=(const BusyScope&) = delete;

 private:
  Device& device_;
  StreamRole role_;
  BusyLabel what_;
};

// RAII device allocation.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Device& d, std::size_t bytes, const std::string& what)
      : dev_(&d), ptr_(d.allocate(bytes, what)), bytes_(bytes) {}
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : dev_(std::exchange(o.dev_, nullptr)),
        ptr_(std::exchange(o.ptr_, nullptr)),
        bytes_(std::exchange(o.bytes_, 0)) {}
  // Takes o's allocation; the one this held is freed with `taken` (a self-move keeps it).
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    DeviceBuffer taken(std::move(o));
    std::swap(dev_, taken.dev_);
    std::swap(ptr_, taken.ptr_);
    std::swap(bytes_, taken.bytes_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { reset(); }
  void reset() {
    if (dev_ && ptr_) dev_->free(ptr_);
    dev_ = nullptr;
    ptr_ = nullptr;
    bytes_ = 0;
  }
  template <class T = void>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  std::size_t size() const { return bytes_; }

 private:
  Device* dev_ = nullptr;
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace zinf
