// zinf/serial_worker.h — one thread running submitted jobs in order (a CPU device stream, the offload
// engine's reduce and update workers). The first exception a job throws is kept and rethrown by the
// next drain() or check(); later jobs still run, so events recorded after a failure still fire.
// An optional hook runs on the worker before each job (the jitter of zinf/jitter.h), and another once
// when its thread starts, before any job (a device binding the thread: Device::bind_thread); an
// exception from that one is kept like a job's.
// Thread-safe: push/drain/check from any thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace zinf {

class SerialWorker {
 public:
  explicit SerialWorker(std::function<void()> before_job = {}, std::function<void()> on_start = {})
      : before_(std::move(before_job)), start_(std::move(on_start)), thread_([this] { loop(); }) {}
  ~SerialWorker() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  SerialWorker(const SerialWorker&) = delete;
  SerialWorker& operator=(const SerialWorker&) = delete;

  void push(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      queue_.push_back(std::move(fn));
      ++pending_;
    }
    cv_.notify_all();
  }
  // Waits until every job pushed so far has run, then rethrows the first error, if any.
  void drain() {
    std::unique_lock<std::mutex> lk(mu_);
    idle_.wait(lk, [&] { return pending_ == 0; });
    rethrow_locked();
  }
  // Rethrows the first error without waiting.
  void check() {
    std::lock_guard<std::mutex> lk(mu_);
    rethrow_locked();
  }

 private:
  void rethrow_locked() {
    if (err_) {
      auto e = err_;
      err_ = nullptr;
      std::rethrow_exception(e);
    }
  }
  void loop() {
    if (start_) {
      try {
        start_();
      } catch (...) {
        std::lock_guard<std::mutex> lk(mu_);
        if (!err_) err_ = std::current_exception();
      }
    }
    while (true) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        fn = std::move(queue_.front());
        queue_.pop_front();
      }
      try {
        if (before_) before_();
        fn();
      } catch (...) {
        std::lock_guard<std::mutex> lk(mu_);
        if (!err_) err_ = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lk(mu_);
        --pending_;
      }
      idle_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_, idle_;
  std::deque<std::function<void()>> queue_;
  std::size_t pending_ = 0;
  bool stop_ = false;
  std::exception_ptr err_;
  std::function<void()> before_, start_;
  std::thread thread_;  // last: starts after every other member exists
};

}  // namespace zinf
