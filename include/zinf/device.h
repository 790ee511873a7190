// zinf/device.h — the device seam (shared/DESIGN.md §5): memory within a budget, async copies
// between pinned host memory and the device, streams named by role, events, synchronisation.
//
// The CPU device is always built: its "device memory" is host memory charged against a configured
// budget, its streams are in-order queues each served by one worker thread, and a "launch" runs a
// host function on the stream's worker. The CUDA device (issue 8) implements the same calls with
// real streams; the default stream is never used. Work is always passed an explicit stream role.
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

#include "zinf/error.h"

namespace zinf {

enum class StreamRole { compute = 0, h2d = 1, d2h = 2 };
constexpr int kStreamRoles = 3;
const char* to_string(StreamRole r);

class DeviceMemoryError : public Error {
 public:
  using Error::Error;
};

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

  // The native stream handle for kernels (cudaStream_t on the CUDA device; nullptr on the CPU device).
  virtual void* native_stream(StreamRole /*s*/) { return nullptr; }

  virtual EventHandle record(StreamRole s) = 0;
  virtual void wait_event(StreamRole s, EventHandle e) = 0;  // the stream waits, the host does not
  virtual void synchronize(StreamRole s) = 0;
  virtual void synchronize() = 0;
};

// The CPU device with a memory budget in bytes.
std::unique_ptr<Device> make_cpu_device(std::size_t budget_bytes);
// The CUDA device `index` with a memory budget (0: the GPU's free memory). Throws zinf::Error when
// this build has no CUDA or no GPU is visible. `launch` enqueues host code in stream order
// (cudaLaunchHostFunc: it must not call CUDA); kernels go on the streams through the op backends.
std::unique_ptr<Device> make_cuda_device(int index, std::size_t budget_bytes);

// RAII device allocation.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Device& d, std::size_t bytes, const std::string& what) : dev_(&d), p_(d.allocate(bytes, what)), n_(bytes) {}
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      dev_ = o.dev_;
      p_ = o.p_;
      n_ = o.n_;
      o.dev_ = nullptr;
      o.p_ = nullptr;
      o.n_ = 0;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { reset(); }
  void reset() {
    if (dev_ && p_) dev_->free(p_);
    dev_ = nullptr;
    p_ = nullptr;
    n_ = 0;
  }
  template <class T = void>
  T* as() const {
    return static_cast<T*>(p_);
  }
  std::size_t size() const { return n_; }

 private:
  Device* dev_ = nullptr;
  void* p_ = nullptr;
  std::size_t n_ = 0;
};

}  // namespace zinf
