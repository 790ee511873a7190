// device_cpu.cpp — the CPU device (zinf/device.h): host memory under a budget, one worker thread
// per stream role running an in-order queue, events as completion flags.
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "zinf/device.h"
#include "zinf/serial_worker.h"
#include "zinf/sysinfo.h"

namespace zinf {

const char* to_string(StreamRole r) {
  switch (r) {
    case StreamRole::compute: return "compute";
    case StreamRole::h2d: return "h2d";
    case StreamRole::d2h: return "d2h";
  }
  return "?";
}

namespace {

class CpuEvent final : public DeviceEvent {
 public:
  bool done() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return done_;
  }
  void wait() override {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return done_; });
  }
  void fire() {
    std::lock_guard<std::mutex> lk(mu_);
    done_ = true;
    cv_.notify_all();
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
};

// A stream: an in-order queue served by one worker thread.
using Stream = SerialWorker;

class CpuDevice final : public Device {
 public:
  explicit CpuDevice(std::size_t budget) : budget_(budget) {
    for (int i = 0; i < kStreamRoles; ++i) streams_[i] = std::make_unique<Stream>();
  }
  ~CpuDevice() override {
    for (auto& s : streams_) s.reset();
  }
  std::string name() const override { return "cpu (budget " + format_bytes(budget_) + ")"; }

  void* allocate(std::size_t bytes, const std::string& what) override {
    std::lock_guard<std::mutex> lk(mu_);
    if (in_use_ + bytes > budget_)
      throw DeviceMemoryError("device memory budget exceeded allocating " + what + " (" + format_bytes(bytes) +
                                  "): " + format_bytes(in_use_) + " of " + format_bytes(budget_) + " already in use",
                              "raise device.memory_budget, lower the micro batch, enable model.activation_checkpointing, "
                              "or offload (see `zinf plan`)");
    void* p = std::aligned_alloc(64, (std::max<std::size_t>(bytes, 1) + 63) / 64 * 64);
    if (!p) throw DeviceMemoryError("host allocation of " + format_bytes(bytes) + " for " + what + " failed");
    sizes_[p] = bytes;
    in_use_ += bytes;
    peak_ = std::max(peak_, in_use_);
    return p;
  }
  void free(void* p) override {
    if (!p) return;
    std::lock_guard<std::mutex> lk(mu_);
    auto it = sizes_.find(p);
    ZINF_CHECK(it != sizes_.end());
    in_use_ -= it->second;
    sizes_.erase(it);
    std::free(p);
  }
  std::size_t budget() const override { return budget_; }
  std::size_t in_use() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return in_use_;
  }
  std::size_t peak() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return peak_;
  }
  void copy_to_device(void* dst, const void* src, std::size_t n, StreamRole s) override {
    stream(s).push([=] { std::memcpy(dst, src, n); });
  }
  void copy_to_host(void* dst, const void* src, std::size_t n, StreamRole s) override {
    stream(s).push([=] { std::memcpy(dst, src, n); });
  }
  void launch(StreamRole s, std::function<void()> fn) override { stream(s).push(std::move(fn)); }
  EventHandle record(StreamRole s) override {
    auto e = std::make_shared<CpuEvent>();
    stream(s).push([e] { e->fire(); });
    return e;
  }
  void wait_event(StreamRole s, EventHandle e) override {
    stream(s).push([e] { e->wait(); });
  }
  void synchronize(StreamRole s) override { stream(s).drain(); }
  void synchronize() override {
    std::exception_ptr first;
    for (auto& s : streams_) {
      try {
        s->drain();
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    if (first) std::rethrow_exception(first);
  }

 private:
  Stream& stream(StreamRole s) { return *streams_[static_cast<int>(s)]; }
  std::size_t budget_;
  mutable std::mutex mu_;
  std::unordered_map<void*, std::size_t> sizes_;
  std::size_t in_use_ = 0, peak_ = 0;
  std::unique_ptr<Stream> streams_[kStreamRoles];
};

}  // namespace

std::unique_ptr<Device> make_cpu_device(std::size_t budget_bytes) { return std::make_unique<CpuDevice>(budget_bytes); }

}  // namespace zinf
