// cuda_device.cu — the CUDA device (zinf/device.h): the caching allocator over cudaMalloc within the
// budget, one non-blocking stream per role (the default stream is never used), events as the only
// cross-stream synchronisation, async copies, host registration of the pinned pool.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <mutex>
#include <string>
#include <vector>

#include "cuda/caching_allocator.h"
#include "cuda/cuda.h"
#include "cuda/cuda_check.cuh"
#include "cuda/device_flags.cuh"
#include "zinf/backends/gpu.h"
#include "zinf/device.h"
#include "zinf/device_memory.h"
#include "zinf/error.h"

namespace zinf {
namespace {

// An event the host may wait on. Untimed events (every handoff) block the waiting thread in the
// driver (cudaEventBlockingSync) instead of spinning on a core: the host threads that wait beside
// cpu_adam's Update (the Reduce worker on a landing buffer, the trainer on a batch slot) would
// otherwise take a core from it. Timed events (profiling) keep the default.
class CudaEvent final : public DeviceEvent {
 public:
  explicit CudaEvent(cudaStream_t s, bool timed = false) {
    ZINF_CUDA(
        cudaEventCreateWithFlags(&ev_, timed ? cudaEventDefault : cudaEventBlockingSync | cudaEventDisableTiming));
    ZINF_CUDA(cudaEventRecord(ev_, s));
  }
  ~CudaEvent() override { cudaEventDestroy(ev_); }
  bool done() const override { return cudaEventQuery(ev_) == cudaSuccess; }
  void wait() override { ZINF_CUDA(cudaEventSynchronize(ev_)); }
  cudaEvent_t get() const { return ev_; }

 private:
  cudaEvent_t ev_ = nullptr;
};

class CudaDevice final : public Device {
 public:
  CudaDevice(int index, std::size_t budget) : index_(index) {
    ZINF_CUDA(cudaSetDevice(index));
    ZINF_CUDA(cuda::request_blocking_sync());  // before the context exists: waiting threads sleep
    if (budget == 0) {  // auto: the free memory less a reserve for cuBLAS, NCCL and module images
      std::size_t free_b = 0, total_b = 0;
      ZINF_CUDA(cudaMemGetInfo(&free_b, &total_b));
      budget = static_cast<std::size_t>(cuda_auto_budget(free_b, total_b));
    }
    alloc_ = std::make_unique<cuda::CachingAllocator>(
        budget,
        [](std::size_t n) -> void* {
          void* p = nullptr;
          return cudaMalloc(&p, n) == cudaSuccess ? p : (cudaGetLastError(), nullptr);
        },
        [](void* p) { cudaFree(p); });
    for (auto& s : streams_) ZINF_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaDeviceProp prop{};
    ZINF_CUDA(cudaGetDeviceProperties(&prop, index));
    name_ = std::string("cuda:") + std::to_string(index) + " " + prop.name;
  }
  ~CudaDevice() override {
    for (auto& s : streams_) {
      cudaStreamSynchronize(s);
      cudaStreamDestroy(s);
    }
    destroy_marks();
    alloc_.reset();
  }
  std::string name() const override { return name_ + " (budget " + format_bytes(alloc_->budget()) + ")"; }
  void* allocate(std::size_t bytes, const std::string& what) override { return alloc_->allocate(bytes, what); }
  void free(void* p) override { alloc_->free(p); }
  std::size_t budget() const override { return alloc_->budget(); }
  std::size_t in_use() const override { return alloc_->in_use(); }
  std::size_t peak() const override { return alloc_->peak(); }
  void copy_to_device(void* dst, const void* src, std::size_t n, StreamRole s) override {
    ZINF_CUDA(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, stream(s)));
  }
  void copy_to_host(void* dst, const void* src, std::size_t n, StreamRole s) override {
    ZINF_CUDA(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, stream(s)));
  }
  void launch(StreamRole s, std::function<void()> fn) override {
    auto* job = new Job{this, std::move(fn)};
    ZINF_CUDA(cudaLaunchHostFunc(stream(s), &CudaDevice::run_job, job));
  }
  void register_host(void* p, std::size_t bytes) override {
    // Mapped: the device's own Update writes parameter homes in pinned memory through the device
    // address (cudaHostGetDevicePointer); portable: any GPU of the process may copy from it.
    ZINF_CUDA(cudaHostRegister(p, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable));
  }
  void unregister_host(void* p) override { cudaHostUnregister(p); }
  void bind_thread() override { ZINF_CUDA(cudaSetDevice(index_)); }
  void* native_stream(StreamRole s) override { return stream(s); }
  EventHandle record(StreamRole s) override { return std::make_shared<CudaEvent>(stream(s)); }
  EventHandle record_timed(StreamRole s) override { return std::make_shared<CudaEvent>(stream(s), true); }
  double elapsed_seconds(const EventHandle& a, const EventHandle& b) override {
    auto* x = dynamic_cast<CudaEvent*>(a.get());
    auto* y = dynamic_cast<CudaEvent*>(b.get());
    ZINF_CHECK(x && y);
    ZINF_CUDA(cudaEventSynchronize(y->get()));
    float ms = 0;
    ZINF_CUDA(cudaEventElapsedTime(&ms, x->get(), y->get()));
    return ms / 1e3;
  }
  void wait_event(StreamRole s, EventHandle e) override {
    auto* ce = dynamic_cast<CudaEvent*>(e.get());
    ZINF_CHECK(ce != nullptr);
    ZINF_CUDA(cudaStreamWaitEvent(stream(s), ce->get(), 0));
  }
  void synchronize(StreamRole s) override {
    ZINF_CUDA(cudaStreamSynchronize(stream(s)));
    rethrow();
  }
  void synchronize() override {
    for (auto& st : streams_) ZINF_CUDA(cudaStreamSynchronize(st));
    rethrow();
  }
  bool ops_stream_ordered() const override { return true; }  // every op is a kernel on the compute stream

  // Busy marks: a pair of timing events per marked interval, read once the end event has completed.
  // Marks from several host threads on one stream (the trainer's Fetch and the Update's Upload on
  // h2d) merge into one interval from the first begin to the last end, named by every label in it.
  // With a trace, take_busy records each interval it counts as a span, its times from the events'
  // distance to a reference event recorded (with the host's clock) when the trace was attached.
  void busy_begin(StreamRole s, const BusyLabel& what) override {
    std::lock_guard<std::mutex> lk(mu_);
    Marks& m = marks_[static_cast<int>(s)];
    if (trace_) m.name(what);
    if (m.depth++ > 0) return;
    m.open = timing_event();
    ZINF_CUDA(cudaEventRecord(m.open, stream(s)));
  }
  void busy_end(StreamRole s, const BusyLabel& /*what*/) override {
    std::lock_guard<std::mutex> lk(mu_);
    Marks& m = marks_[static_cast<int>(s)];
    ZINF_CHECK(m.depth > 0);
    if (--m.depth > 0) return;
    cudaEvent_t end = timing_event();
    ZINF_CUDA(cudaEventRecord(end, stream(s)));
    m.pending.push_back({m.open, end, std::move(m.label), m.unit});
    m.open = nullptr;
    m.label.clear();
    m.unit = -1;
  }
  double take_busy(StreamRole s) override {
    std::lock_guard<std::mutex> lk(mu_);
    Marks& m = marks_[static_cast<int>(s)];
    double ms_total = 0;
    std::vector<Interval> later;
    for (auto& iv : m.pending) {
      if (cudaEventQuery(iv.end) != cudaSuccess) {  // still running (or failed: synchronize reports it)
        later.push_back(std::move(iv));
        continue;
      }
      float ms = 0;
      ZINF_CUDA(cudaEventElapsedTime(&ms, iv.begin, iv.end));
      ms_total += ms;
      if (trace_) {  // where: from the reference event (float milliseconds); how long: `ms`, as counted
        float from_ref = 0;
        ZINF_CUDA(cudaEventElapsedTime(&from_ref, ref_event_, iv.begin));
        auto t0 =
            ref_time_ + std::chrono::round<Trace::Clock::duration>(std::chrono::duration<double, std::milli>(from_ref));
        // A stream's intervals follow each other: a start that rounding put inside the previous
        // interval moves to its end, so the spans never overlap and each covers `ms`, as counted.
        t0 = std::max(t0, m.last_end);
        const auto t1 = t0 + std::chrono::round<Trace::Clock::duration>(std::chrono::duration<double, std::milli>(ms));
        m.last_end = t1;
        trace_->span(m.track, iv.label.empty() ? std::string("busy") : iv.label, iv.unit, t0, t1, m.window);
      }
      spare_.push_back(iv.begin);
      spare_.push_back(iv.end);
    }
    m.pending.swap(later);
    ++m.window;
    return 1e-3 * ms_total;
  }
  void trace_to(Trace* t) override {
    synchronize();
    std::lock_guard<std::mutex> lk(mu_);
    trace_ = t;
    if (!t) return;
    if (!ref_event_) ZINF_CUDA(cudaEventCreate(&ref_event_));
    ZINF_CUDA(cudaEventRecord(ref_event_, stream(StreamRole::compute)));
    ZINF_CUDA(cudaEventSynchronize(ref_event_));
    ref_time_ = Trace::Clock::now();
    for (int i = 0; i < kStreamRoles; ++i)
      marks_[i].track = t->track(Trace::Group::device, to_string(static_cast<StreamRole>(i)));
  }

 private:
  struct Interval {
    cudaEvent_t begin = nullptr, end = nullptr;
    std::string label;
    std::int64_t unit = -1;
  };
  struct Marks {
    int depth = 0;
    cudaEvent_t open = nullptr;
    std::string label;  // the names of the marks in the open interval, "+"-joined; its unit when one
    std::int64_t unit = -1;
    std::vector<Interval> pending;
    int track = 0;
    std::int64_t window = 0;              // take_busy calls so far
    Trace::Clock::time_point last_end{};  // the end of the last span recorded
    void name(const BusyLabel& what) {
      if (label.empty()) {
        label = what.name;
        unit = what.unit;
      } else if (label.find(what.name) == std::string::npos) {
        label += std::string("+") + what.name;
      }
    }
  };
  cudaEvent_t timing_event() {  // under mu_
    if (!spare_.empty()) {
      cudaEvent_t e = spare_.back();
      spare_.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    ZINF_CUDA(cudaEventCreate(&e));
    return e;
  }
  void destroy_marks() {
    for (auto& m : marks_) {
      if (m.open) cudaEventDestroy(m.open);
      for (auto& iv : m.pending) cudaEventDestroy(iv.begin), cudaEventDestroy(iv.end);
    }
    for (auto e : spare_) cudaEventDestroy(e);
    if (ref_event_) cudaEventDestroy(ref_event_);
  }
  struct Job {
    CudaDevice* dev;
    std::function<void()> fn;
  };
  static void CUDART_CB run_job(void* p) {
    auto* job = static_cast<Job*>(p);
    try {
      job->fn();
    } catch (...) {  // a driver callback cannot throw: keep the first error for synchronize()
      std::lock_guard<std::mutex> lk(job->dev->mu_);
      if (!job->dev->err_) job->dev->err_ = std::current_exception();
    }
    delete job;
  }
  void rethrow() {
    std::lock_guard<std::mutex> lk(mu_);
    if (err_) {
      auto e = err_;
      err_ = nullptr;
      std::rethrow_exception(e);
    }
  }
  cudaStream_t stream(StreamRole s) const { return streams_[static_cast<int>(s)]; }

  int index_;
  std::string name_;
  std::unique_ptr<cuda::CachingAllocator> alloc_;
  cudaStream_t streams_[kStreamRoles] = {};
  std::mutex mu_;
  std::exception_ptr err_;
  Marks marks_[kStreamRoles];
  std::vector<cudaEvent_t> spare_;
  Trace* trace_ = nullptr;  // under mu_
  cudaEvent_t ref_event_ = nullptr;
  Trace::Clock::time_point ref_time_{};  // the host's clock when ref_event_ completed
};

}  // namespace

std::unique_ptr<Device> cuda::make_cuda_device(int index, std::size_t budget_bytes) {
  // Which GPUs exist, without a context: the device reads its free memory once its own context is made.
  const cuda::GpuQuery q = cuda::query_gpus(kNoOwnGpu);
  if (q.gpus.empty())
    throw Error("CUDA device: " + q.status, "run on a machine with an NVIDIA GPU and driver, or use device.type cpu");
  if (index < 0 || index >= static_cast<int>(q.gpus.size()))
    throw ConfigError("CUDA device " + std::to_string(index) + " does not exist (" + q.status + ")");
  return std::make_unique<CudaDevice>(index, budget_bytes);
}

}  // namespace zinf
