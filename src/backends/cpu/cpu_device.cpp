// cpu_device.cpp — the CPU device (zinf/device.h): host memory under a budget, one worker thread
// per stream role running an in-order queue, events as completion flags. In async mode the model's
// ops are stream work (the StreamOps backend enqueues them here); with a jitter seed every job on
// every stream waits a seeded random time first.
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "zinf/backends/cpu.h"
#include "zinf/device.h"
#include "zinf/serial_worker.h"
#include "zinf/backends/sysinfo.h"

namespace zinf {

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
    at_ = std::chrono::steady_clock::now();
    done_ = true;
    cv_.notify_all();
  }
  std::chrono::steady_clock::time_point at() {  // when the stream reached it
    wait();
    std::lock_guard<std::mutex> lk(mu_);
    return at_;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::chrono::steady_clock::time_point at_;
};

// A stream: an in-order queue served by one worker thread, with its own jitter lane and the job
// time it spent inside busy marks. `depth` (marks open, in stream order) is touched by the worker
// only; marks from several host threads on one stream nest.
//
// With a trace, each job inside marks is also a span named by the label of the mark its pushing
// thread had open on this stream (`labels`, per thread), and its time is counted under `busy_mu` with
// the span, so that take_busy (which closes the window under the same lock) and the trace agree.
struct Stream {
  Stream(const JitterSpec& j, std::uint64_t lane) : jitter(j, lane), worker([this] { jitter.delay(); }) {}
  // A job whose run time is the stream's work (copies, launches); waits are pushed directly.
  void push_work(std::function<void()> fn) {
    BusyLabel label{"work", -1};
    if (trace.load(std::memory_order_acquire)) label = open_label();
    worker.push([this, label, fn = std::move(fn)] {
      if (depth == 0) return fn();
      const auto t0 = std::chrono::steady_clock::now();
      struct Count {  // also when fn throws
        Stream& s;
        std::chrono::steady_clock::time_point t0;
        BusyLabel label;
        ~Count() {
          const auto t1 = std::chrono::steady_clock::now();
          const std::int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count();
          Trace* t = s.trace.load(std::memory_order_acquire);
          if (!t) {
            s.busy_ns += ns;
            return;
          }
          std::lock_guard<std::mutex> lk(s.busy_mu);
          s.busy_ns += ns;
          t->span(s.track, label.name, label.unit, t0, t1, s.window);
        }
      } count{*this, t0, label};
      fn();
    });
  }
  BusyLabel open_label() {
    std::lock_guard<std::mutex> lk(labels_mu);
    auto it = labels.find(std::this_thread::get_id());
    return it == labels.end() || it->second.empty() ? BusyLabel{"work", -1} : it->second.back();
  }
  void mark(const BusyLabel& l, bool open) {
    std::lock_guard<std::mutex> lk(labels_mu);
    auto& open_here = labels[std::this_thread::get_id()];
    if (open) {
      open_here.push_back(l);
    } else if (!open_here.empty()) {
      open_here.pop_back();
    }
  }
  double take_busy() {
    if (!trace.load(std::memory_order_acquire)) return 1e-9 * static_cast<double>(busy_ns.exchange(0));
    std::lock_guard<std::mutex> lk(busy_mu);
    ++window;
    return 1e-9 * static_cast<double>(busy_ns.exchange(0));
  }
  Jitter jitter;
  int depth = 0;
  std::atomic<std::int64_t> busy_ns{0};
  std::atomic<Trace*> trace{nullptr};  // set before any mark (Device::trace_to)
  int track = 0;                       // under busy_mu
  std::mutex busy_mu;                  // with a trace: busy_ns, window and the spans together
  std::int64_t window = 0;             // under busy_mu: take_busy calls so far
  std::mutex labels_mu;                // with a trace: each pushing thread's open marks
  std::unordered_map<std::thread::id, std::vector<BusyLabel>> labels;
  SerialWorker worker;  // last: its thread starts after the rest exists
};

class CpuDevice final : public Device {
 public:
  CpuDevice(std::size_t budget, const CpuDeviceOptions& o) : budget_(budget), opts_(o) {
    for (int i = 0; i < kStreamRoles; ++i)
      streams_[i] = std::make_unique<Stream>(o.jitter, static_cast<std::uint64_t>(i) + 1);
  }
  ~CpuDevice() override {
    for (auto& s : streams_) s.reset();
  }
  std::string name() const override {
    std::string n = "cpu (budget " + format_bytes(budget_);
    if (opts_.async) n += ", async";
    if (opts_.jitter.enabled())
      n += ", jitter seed " + std::to_string(opts_.jitter.seed) + " up to " + std::to_string(opts_.jitter.max_us) +
           " us";
    return n + ")";
  }

  void* allocate(std::size_t bytes, const std::string& what) override {
    std::lock_guard<std::mutex> lk(mu_);
    if (in_use_ + bytes > budget_) throw over_budget_error(what, bytes, in_use_, budget_);
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
  // An empty copy is a no-op in stream order (an empty shard's buffers may be null, and memcpy must
  // not be handed a null pointer even for zero bytes).
  void copy_to_device(void* dst, const void* src, std::size_t n, StreamRole s) override {
    stream(s).push_work([=] {
      if (n != 0) std::memcpy(dst, src, n);
    });
  }
  void copy_to_host(void* dst, const void* src, std::size_t n, StreamRole s) override {
    stream(s).push_work([=] {
      if (n != 0) std::memcpy(dst, src, n);
    });
  }
  void launch(StreamRole s, std::function<void()> fn) override { stream(s).push_work(std::move(fn)); }
  // An opaque handle per stream (its queue), so that a stream-ordered communicator can name the
  // stream it enqueues on, as NCCL does with a cudaStream_t.
  void* native_stream(StreamRole s) override { return &stream(s); }
  EventHandle record(StreamRole s) override {
    auto e = std::make_shared<CpuEvent>();
    stream(s).worker.push([e] { e->fire(); });
    return e;
  }
  void wait_event(StreamRole s, EventHandle e) override {
    ZINF_CHECK(e != nullptr);
    stream(s).worker.push([e] { e->wait(); });
  }
  double elapsed_seconds(const EventHandle& a, const EventHandle& b) override {
    auto* x = dynamic_cast<CpuEvent*>(a.get());
    auto* y = dynamic_cast<CpuEvent*>(b.get());
    ZINF_CHECK(x && y);
    return std::chrono::duration<double>(y->at() - x->at()).count();
  }
  void synchronize(StreamRole s) override { stream(s).worker.drain(); }
  void synchronize() override {
    std::exception_ptr first;
    for (auto& s : streams_) {
      try {
        s->worker.drain();
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    if (first) std::rethrow_exception(first);
  }
  bool ops_stream_ordered() const override { return opts_.async; }
  JitterSpec jitter() const override { return opts_.jitter; }
  // Without async mode the model's ops run on the caller's thread, not on the compute stream: marks
  // there would only wake its worker, so they are not pushed (the caller measures that time).
  void busy_begin(StreamRole s, const BusyLabel& what) override {
    if (s == StreamRole::compute && !opts_.async) return;
    Stream* st = &stream(s);
    if (st->trace.load(std::memory_order_acquire)) st->mark(what, true);
    st->worker.push([st] { ++st->depth; });
  }
  void busy_end(StreamRole s, const BusyLabel& what) override {
    if (s == StreamRole::compute && !opts_.async) return;
    Stream* st = &stream(s);
    if (st->trace.load(std::memory_order_acquire)) st->mark(what, false);
    st->worker.push([st] { --st->depth; });
  }
  double take_busy(StreamRole s) override { return stream(s).take_busy(); }
  void trace_to(Trace* t) override {
    for (int i = 0; i < kStreamRoles; ++i) {
      Stream& st = *streams_[i];
      std::lock_guard<std::mutex> lk(st.busy_mu);
      if (t) st.track = t->track(Trace::Group::device, to_string(static_cast<StreamRole>(i)));
      st.trace.store(t, std::memory_order_release);
    }
  }

 private:
  Stream& stream(StreamRole s) { return *streams_[static_cast<int>(s)]; }
  std::size_t budget_;
  CpuDeviceOptions opts_;
  mutable std::mutex mu_;
  std::unordered_map<void*, std::size_t> sizes_;
  std::size_t in_use_ = 0, peak_ = 0;
  std::unique_ptr<Stream> streams_[kStreamRoles];
};

}  // namespace

std::unique_ptr<Device> make_cpu_device(std::size_t budget_bytes, const CpuDeviceOptions& opts) {
  return std::make_unique<CpuDevice>(budget_bytes, opts);
}

CpuDeviceOptions cpu_device_options_from_env(CpuDeviceOptions o) {
  auto number = [](const char* name, const char* v) {
    char* end = nullptr;
    errno = 0;
    const unsigned long long x = std::strtoull(v, &end, 10);
    if (!*v || *end || errno || v[0] == '-')
      throw Error(std::string("environment variable ") + name + "=" + v + " is not a non-negative integer");
    return static_cast<std::uint64_t>(x);
  };
  if (const char* v = std::getenv("ZINF_DEVICE_ASYNC"); v && *v) o.async = number("ZINF_DEVICE_ASYNC", v) != 0;
  if (const char* v = std::getenv("ZINF_JITTER_SEED"); v && *v) o.jitter.seed = number("ZINF_JITTER_SEED", v);
  if (const char* v = std::getenv("ZINF_JITTER_US"); v && *v) {
    const std::uint64_t us = number("ZINF_JITTER_US", v);
    if (us < 1 || us > 1'000'000)
      throw Error(std::string("environment variable ZINF_JITTER_US=") + v + " must be in 1..1000000");
    o.jitter.max_us = static_cast<int>(us);
  }
  return o;
}

}  // namespace zinf
