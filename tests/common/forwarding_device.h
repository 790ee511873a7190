// forwarding_device.h — a Device that passes every call to another one and lets a test look at each
// call on the way (which thread made it, which host memory it names). The CPU device runs the whole
// engine, so what a GPU would refuse or get wrong silently (a worker thread that never selected its
// GPU, a copy from memory that is not page-locked) is checked here instead.
//
// With pageable_copies(true) it also copies as CUDA does where the host memory is not registered:
// a copy to the device reads its source when called (cudaMemcpyAsync stages pageable memory at once,
// not in stream order), and a copy to the host returns only once done. A handoff that relies on
// stream order for pageable memory then reads stale data here too.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "zinf/device.h"

namespace zinf::test {

class ForwardingDevice : public Device {
 public:
  explicit ForwardingDevice(std::unique_ptr<Device> inner) : in_(std::move(inner)) {}

  std::string name() const override { return in_->name(); }
  void* allocate(std::size_t bytes, const std::string& what) override {
    seen("allocate");
    return in_->allocate(bytes, what);
  }
  void free(void* p) override {
    seen("free");
    in_->free(p);
  }
  std::size_t budget() const override { return in_->budget(); }
  std::size_t in_use() const override { return in_->in_use(); }
  std::size_t peak() const override { return in_->peak(); }
  void copy_to_device(void* dst, const void* src, std::size_t bytes, StreamRole s) override {
    seen("copy_to_device");
    if (host_side("copy_to_device", src, bytes) || !pageable_) return in_->copy_to_device(dst, src, bytes, s);
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src), static_cast<const char*>(src) + bytes);
    in_->copy_to_device(dst, staged->data(), bytes, s);
    in_->launch(s, [staged] {});  // the staged copy lives until the stream has read it
  }
  void copy_to_host(void* dst, const void* src, std::size_t bytes, StreamRole s) override {
    seen("copy_to_host");
    const bool registered = host_side("copy_to_host", dst, bytes);
    in_->copy_to_host(dst, src, bytes, s);
    if (!registered && pageable_) in_->synchronize(s);
  }
  // Pageable copies as CUDA makes them (see the top of this file).
  void pageable_copies(bool on) { pageable_ = on; }
  void launch(StreamRole s, std::function<void()> fn) override {
    seen("launch");
    in_->launch(s, std::move(fn));
  }
  void register_host(void* p, std::size_t bytes) override {
    seen("register_host");
    {
      std::lock_guard<std::mutex> lk(mu_);
      registered_[static_cast<const char*>(p)] = bytes;
    }
    in_->register_host(p, bytes);
  }
  void unregister_host(void* p) override {
    seen("unregister_host");
    {
      std::lock_guard<std::mutex> lk(mu_);
      registered_.erase(static_cast<const char*>(p));
    }
    in_->unregister_host(p);
  }
  void bind_thread() override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      bound_.insert(std::this_thread::get_id());
    }
    in_->bind_thread();
  }
  void* native_stream(StreamRole s) override { return in_->native_stream(s); }
  EventHandle record(StreamRole s) override {
    seen("record");
    return in_->record(s);
  }
  void wait_event(StreamRole s, EventHandle e) override {
    seen("wait_event");
    in_->wait_event(s, std::move(e));
  }
  EventHandle record_timed(StreamRole s) override {
    seen("record_timed");
    return in_->record_timed(s);
  }
  double elapsed_seconds(const EventHandle& a, const EventHandle& b) override { return in_->elapsed_seconds(a, b); }
  void synchronize(StreamRole s) override {
    seen("synchronize");
    syncs_[static_cast<int>(s)]++;
    in_->synchronize(s);
  }
  void synchronize() override {
    seen("synchronize");
    in_->synchronize();
  }
  bool ops_stream_ordered() const override { return in_->ops_stream_ordered(); }
  JitterSpec jitter() const override { return in_->jitter(); }
  void busy_begin(StreamRole s, const BusyLabel& what) override { in_->busy_begin(s, what); }
  void busy_end(StreamRole s, const BusyLabel& what) override { in_->busy_end(s, what); }
  void trace_to(Trace* t) override { in_->trace_to(t); }
  double take_busy(StreamRole s) override { return in_->take_busy(s); }

  // Calls made by a thread other than the one that made this device before that thread called
  // bind_thread(), by call ("copy_to_device: 3").
  std::map<std::string, int> unbound_calls() const {
    std::lock_guard<std::mutex> lk(mu_);
    return unbound_;
  }
  // Host memory named by a copy outside every range registered with register_host, by call.
  std::map<std::string, int> unregistered_copies() const {
    std::lock_guard<std::mutex> lk(mu_);
    return unregistered_;
  }
  // synchronize(s) calls so far (the whole-device synchronize() not counted).
  int syncs(StreamRole s) const { return syncs_[static_cast<int>(s)].load(); }
  // Threads that called bind_thread().
  std::size_t bound_threads() const {
    std::lock_guard<std::mutex> lk(mu_);
    return bound_.size();
  }

 private:
  void seen(const char* what) {
    if (std::this_thread::get_id() == owner_) return;  // the device was made for this thread
    std::lock_guard<std::mutex> lk(mu_);
    if (!bound_.count(std::this_thread::get_id())) ++unbound_[what];
  }
  // Whether [p, p + bytes) lies in registered memory; counts the call in unregistered_ where not.
  bool host_side(const char* what, const void* p, std::size_t bytes) {
    const char* c = static_cast<const char*>(p);
    std::lock_guard<std::mutex> lk(mu_);
    auto it = registered_.upper_bound(c);
    if (it != registered_.begin()) {
      --it;
      if (c + bytes <= it->first + it->second) return true;
    }
    ++unregistered_[what];
    return false;
  }

  std::unique_ptr<Device> in_;
  const std::thread::id owner_ = std::this_thread::get_id();
  mutable std::mutex mu_;
  std::set<std::thread::id> bound_;
  std::map<const char*, std::size_t> registered_;
  std::map<std::string, int> unbound_, unregistered_;
  std::atomic<int> syncs_[kStreamRoles] = {};
  bool pageable_ = false;
};

}  // namespace zinf::test
