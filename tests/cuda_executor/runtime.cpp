// runtime.cpp — the executor's CUDA runtime: the subset of NVIDIA's runtime API (declared by
// <cuda_runtime_api.h>, implemented here) that the project calls, over host memory.
//
// What it checks as the CUDA rules do (an error code, never a silent success):
//   - copies against where their pointers live: a HostToDevice copy must write device memory and
//     read host memory, a DeviceToDevice copy must stay in device memory, a device range must lie
//     inside one allocation; cudaMemcpyDefault infers the direction;
//   - a freed or unknown pointer given to cudaFree / cudaFreeHost / cudaHostUnregister;
//   - events and streams: destroyed or unknown handles, timing on an event created without it;
//   - a kernel fault (kernel.cpp) is sticky, as on a GPU: every later call returns it.
// Streams are worker threads with a seeded random delay before each item (ZINF_CUDAX_JITTER_US, the
// largest delay in microseconds, default 40; 0 turns jitter off), so work on two streams interleaves
// differently run to run and a missing cudaStreamWaitEvent shows as a wrong result. An async copy
// from pageable memory reads its source before returning and one to pageable memory completes before
// returning, as CUDA's staged copies do; pinned and registered memory is read and written in stream
// order, so a host access before the stream reaches the copy is a real race.
// ZINF_CUDAX_DEVICES sets how many devices it reports (default 1); it records which devices' primary
// contexts the process made or used, by the rules of CUDA 13 (below, "devices and their primary contexts").
// "Device" memory is charged against ZINF_CUDAX_MEMORY_MIB (default 16384), which cudaMemGetInfo
// reports; fresh device allocations are filled with 0xFF bytes (NaN in fp32, bf16 and fp16), so a
// read of memory nothing wrote shows. Device memory lives in an arena closed to host code
// (device_memory.cpp): every stream item that is device work (a kernel, a copy, a memset, a library
// fake's work) runs inside a DeviceAccess scope; host functions and event records do not.
#include <dlfcn.h>
#include <cxxabi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>

#include "cudax/launch.h"
#include "cudax/runtime.h"
#include "internal.h"

namespace zinf::cudax {

namespace {

std::uint64_t env_u64(const char* name, std::uint64_t def) {
  const char* v = std::getenv(name);
  if (!v || !*v) return def;
  char* end = nullptr;
  const unsigned long long x = std::strtoull(v, &end, 10);
  if (end == v || *end) {
    report(std::string(name) + "=" + v + " is not a number; using " + std::to_string(def));
    return def;
  }
  return x;
}

struct Allocation {
  std::size_t size;
  MemKind kind;
};

struct Registry {
  std::mutex mu;
  std::map<std::uintptr_t, Allocation> ranges;  // by base address
  std::size_t device_bytes = 0;
};
Registry& registry() {
  static Registry r;
  return r;
}

std::size_t memory_total() {
  static const std::size_t t = static_cast<std::size_t>(env_u64("ZINF_CUDAX_MEMORY_MIB", 16384)) << 20;
  return t;
}

// The context's sticky error (a kernel fault or a failed stream item).
std::atomic<int> g_sticky{0};
thread_local cudaError_t tl_last = cudaSuccess;

cudaError_t sticky() { return static_cast<cudaError_t>(g_sticky.load()); }
cudaError_t fail(cudaError_t e) {
  tl_last = e;
  return e;
}
// ---- devices and their primary contexts --------------------------------------------------------------

// ZINF_CUDAX_DEVICES (default 1) devices, so that several ranks on one machine each find "their" GPU;
// they share this process's memory registry and budget, as each rank is its own process.
std::atomic<int> g_device_count{0};  // set_device_count's; 0: ZINF_CUDAX_DEVICES
int device_count() {
  if (const int n = g_device_count.load()) return n;
  static const int n = static_cast<int>(std::clamp<std::uint64_t>(env_u64("ZINF_CUDAX_DEVICES", 1), 1, 64));
  return n;
}
thread_local int tl_device = 0;  // the calling thread's current device (0 until it sets one)

// When a device's primary context is made, as the CUDA 13 runtime documents it (cuda_runtime_api.h):
//   - cudaSetDevice(d) makes d's primary context current to the calling thread and initialises it at
//     once (since CUDA 12.0; before, that waited for the first call needing a context);
//   - cudaSetDeviceFlags initialises the current device's (device 0's on a thread that chose none);
//   - every call that needs a context — device, pinned and registered memory and cudaMemGetInfo,
//     copies and memsets, streams, events, host functions, launches, device synchronisation —
//     initialises the calling thread's current device's if it is not yet;
//   - cudaGetDeviceCount, cudaGetDeviceProperties, cudaDeviceGetAttribute, cudaGetDevice, the version
//     queries and the error calls need none and make none.
// A context on a GPU costs that GPU memory, so which devices a process touched matters (a rank should
// touch only its own GPU): every such call records its device here (context_devices, cudax/runtime.h).
std::atomic<std::uint64_t> g_context_devices{0};
void use_context(int d) {
  const std::uint64_t bit = std::uint64_t{1} << d;
  if (!(g_context_devices.load(std::memory_order_relaxed) & bit)) g_context_devices.fetch_or(bit);
}
void use_context() { use_context(tl_device); }

#define ZINF_CUDAX_STICKY()                       \
  do {                                            \
    if (const cudaError_t s_ = sticky()) return s_; \
  } while (0)

// ---- streams ---------------------------------------------------------------------------------------

// One item of a stream's work; `device` when it is device work (it runs with device memory open).
struct Item {
  std::function<cudaError_t()> fn;
  bool device = true;
};

struct Stream {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Item> work;
  bool busy = false;
  bool stop = false;
  unsigned flags = 0;
  std::mt19937_64 rng;
  std::thread worker;

  void run() {
    const std::uint64_t jitter = env_u64("ZINF_CUDAX_JITTER_US", 40);
    // Device memory stays open across consecutive device items and closes when the stream goes idle
    // or reaches a host function: under the arena guard each opening and closing is an mprotect,
    // and a busy stream would otherwise pay two per item.
    std::optional<DeviceAccess> open;
    std::unique_lock<std::mutex> l(mu);
    for (;;) {
      cv.wait(l, [&] { return stop || !work.empty(); });
      if (work.empty()) return;
      Item item = std::move(work.front());
      work.pop_front();
      busy = true;
      const std::uint64_t delay = jitter ? rng() % (jitter + 1) : 0;
      l.unlock();
      if (item.device && !open) open.emplace();
      if (!item.device) open.reset();
      const std::function<cudaError_t()>& fn = item.fn;
      if (delay) std::this_thread::sleep_for(std::chrono::microseconds(delay));
      // After a fault the context is unusable, as on a GPU: later work is dropped.
      if (!sticky()) {
        const cudaError_t e = fn();
        if (e != cudaSuccess) {
          int expected = 0;
          g_sticky.compare_exchange_strong(expected, static_cast<int>(e));
        }
      }
      l.lock();
      if (open && work.empty()) {  // closed before a synchronising host thread can go on
        l.unlock();
        open.reset();
        l.lock();
      }
      busy = false;
      cv.notify_all();
    }
  }
  void drain() {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return work.empty() && !busy; });
  }
};

// The live streams, each held by a shared_ptr so that a drain running beside cudaStreamDestroy on
// another thread keeps its stream alive until it returns.
struct Streams {
  std::mutex mu;
  std::map<Stream*, std::shared_ptr<Stream>> live;
  std::uint64_t created = 0;
};
Streams& streams() {
  static Streams s;
  return s;
}

std::shared_ptr<Stream> find_stream(cudaStream_t s) {
  Streams& ss = streams();
  std::lock_guard<std::mutex> g(ss.mu);
  auto it = ss.live.find(reinterpret_cast<Stream*>(s));
  return it == ss.live.end() ? nullptr : it->second;
}
std::vector<std::shared_ptr<Stream>> live_streams() {
  Streams& ss = streams();
  std::lock_guard<std::mutex> g(ss.mu);
  std::vector<std::shared_ptr<Stream>> v;
  for (auto& [p, sp] : ss.live) v.push_back(sp);
  return v;
}

// The legacy default stream synchronises with every blocking stream (created without
// cudaStreamNonBlocking): its work waits for theirs, then runs on the caller's thread.
void drain_blocking_streams() {
  for (const auto& s : live_streams())
    if (!(s->flags & cudaStreamNonBlocking)) s->drain();
}

// ---- events ---------------------------------------------------------------------------------------

struct Event {
  std::mutex mu;
  std::condition_variable cv;
  std::uint64_t recorded = 0;   // records issued
  std::uint64_t completed = 0;  // records the stream has reached
  std::chrono::steady_clock::time_point when{};
  unsigned flags = 0;
};
// The live events by handle. Work queued on a stream holds its event too, so an event destroyed
// while a record or wait of it is queued lives until that work has run (CUDA defers the release to
// the event's completion in the same way).
struct Events {
  std::mutex mu;
  std::map<Event*, std::shared_ptr<Event>> live;
};
Events& events() {
  static Events e;
  return e;
}
std::shared_ptr<Event> find_event(cudaEvent_t e) {
  Events& es = events();
  std::lock_guard<std::mutex> g(es.mu);
  const auto it = es.live.find(reinterpret_cast<Event*>(e));
  return it == es.live.end() ? nullptr : it->second;
}

struct FuncAttrs {
  std::mutex mu;
  std::unordered_map<const void*, std::size_t> max_dynamic_smem;
};
FuncAttrs& func_attrs() {
  static FuncAttrs f;
  return f;
}

std::string kernel_name(const void* k) {
  Dl_info info{};
  if (dladdr(k, &info) && info.dli_sname) {
    int status = 0;
    char* d = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
    std::string n = status == 0 && d ? d : info.dli_sname;
    std::free(d);
    return n;
  }
  char b[32];
  std::snprintf(b, sizeof b, "at %p", k);
  return b;
}

int g_device_flags = 0;

}  // namespace

// ---- the executor's own interface (cudax/runtime.h, internal.h) ----------------------------------

const char* to_string(MemKind k) {
  switch (k) {
    case MemKind::pageable: return "pageable host memory";
    case MemKind::device: return "device memory";
    case MemKind::pinned: return "pinned host memory";
    case MemKind::registered: return "registered host memory";
  }
  return "?";
}

MemRange where(const void* p) {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  auto it = r.ranges.upper_bound(a);
  if (it == r.ranges.begin()) return {};
  --it;
  if (a >= it->first + std::max<std::size_t>(it->second.size, 1)) return {};
  return MemRange{it->second.kind, reinterpret_cast<const void*>(it->first), it->second.size};
}

bool is_device_range(const void* p, std::size_t bytes) {
  const MemRange m = where(p);
  if (m.kind != MemKind::device) return false;
  const auto off = static_cast<std::size_t>(static_cast<const char*>(p) - static_cast<const char*>(m.base));
  return off + bytes <= m.size;
}

unsigned long seed() {
  static const unsigned long s = static_cast<unsigned long>(env_u64("ZINF_CUDAX_SEED", 1));
  return s;
}

namespace {
std::atomic<int> g_order{-1};
}
void set_order(Order o) { g_order.store(static_cast<int>(o)); }
Order order() {
  if (const int o = g_order.load(); o >= 0) return static_cast<Order>(o);
  static const Order from_env = [] {
    const char* v = std::getenv("ZINF_CUDAX_ORDER");
    const std::string s = v ? v : "fifo";
    if (s == "fifo" || s.empty()) return Order::fifo;
    if (s == "lifo") return Order::lifo;
    if (s == "random") return Order::random;
    report("ZINF_CUDAX_ORDER=" + s + " is not fifo, lifo or random; using fifo");
    return Order::fifo;
  }();
  return from_env;
}

void report(const std::string& line) { std::fprintf(stderr, "cudax: %s\n", line.c_str()); }

void set_last_error(cudaError_t e) { tl_last = e; }

std::uint64_t context_devices() { return g_context_devices.load(); }
void forget_contexts() { g_context_devices.store(0); }
void set_device_count(int n) { g_device_count.store(std::clamp(n, 0, 64)); }

namespace {
// Runs fn in stream order on s; `device`: it is device work, and runs with device memory open.
cudaError_t submit(cudaStream_t s, std::function<cudaError_t()> fn, bool device);
// As enqueue, without opening device memory (host functions and the runtime's own bookkeeping:
// events).
cudaError_t enqueue_host(cudaStream_t s, std::function<cudaError_t()> fn) { return submit(s, std::move(fn), false); }
}  // namespace

cudaError_t enqueue(cudaStream_t s, std::function<cudaError_t()> fn) { return submit(s, std::move(fn), true); }

std::size_t memory_budget() { return memory_total(); }

void describe_device_address(std::uintptr_t a, char* out, std::size_t n) noexcept {
  Registry& r = registry();
  std::unique_lock<std::mutex> l(r.mu, std::try_to_lock);
  if (!l.owns_lock()) {
    std::snprintf(out, n, "the allocation is unknown: the registry was busy");
    return;
  }
  auto it = r.ranges.upper_bound(a);
  if (it != r.ranges.begin()) {
    --it;
    if (it->second.kind == MemKind::device && a < it->first + (it->second.size + 255) / 256 * 256) {
      const std::size_t off = a - it->first;
      std::snprintf(out, n, "byte %zu of the %zu-byte device allocation at %p%s", off, it->second.size,
                    reinterpret_cast<void*>(it->first), off >= it->second.size ? ", past its end" : "");
      return;
    }
  }
  std::snprintf(out, n, "in no live allocation: freed or never allocated device memory");
}

namespace {
cudaError_t submit(cudaStream_t s, std::function<cudaError_t()> fn, bool device) {
  use_context();
  if (const cudaError_t e = sticky()) return e;
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) {
    drain_blocking_streams();
    std::optional<DeviceAccess> open;
    if (device) open.emplace();
    const cudaError_t e = fn();
    open.reset();
    if (e != cudaSuccess) {
      int expected = 0;
      g_sticky.compare_exchange_strong(expected, static_cast<int>(e));
    }
    return e;
  }
  const std::shared_ptr<Stream> st = find_stream(s);
  if (!st) return cudaErrorInvalidResourceHandle;
  {
    std::lock_guard<std::mutex> g(st->mu);
    st->work.push_back(Item{std::move(fn), device});
  }
  st->cv.notify_all();
  return cudaSuccess;
}
}  // namespace

std::size_t max_dynamic_smem(const void* kernel) {
  FuncAttrs& f = func_attrs();
  std::lock_guard<std::mutex> g(f.mu);
  auto it = f.max_dynamic_smem.find(kernel);
  return it == f.max_dynamic_smem.end() ? kDefaultDynamicSmem : it->second;
}

namespace {
struct Counters {
  std::atomic<std::uint64_t> launches{0}, device_allocs{0}, device_frees{0}, pinned_allocs{0}, device_syncs{0},
      stream_syncs{0}, event_syncs{0}, pageable_copies{0}, blocking_copies{0};
};
Counters& counters() {
  static Counters c;
  return c;
}
void count(std::atomic<std::uint64_t> Counters::*which) { (counters().*which).fetch_add(1, std::memory_order_relaxed); }
}  // namespace

ApiCounts api_counts() {
  const Counters& c = counters();
  ApiCounts a;
  a.launches = c.launches.load();
  a.device_allocs = c.device_allocs.load();
  a.device_frees = c.device_frees.load();
  a.pinned_allocs = c.pinned_allocs.load();
  a.device_syncs = c.device_syncs.load();
  a.stream_syncs = c.stream_syncs.load();
  a.event_syncs = c.event_syncs.load();
  a.pageable_copies = c.pageable_copies.load();
  a.blocking_copies = c.blocking_copies.load();
  return a;
}

cudaError_t launch_body(const void* kernel, const LaunchShape& shape, cudaStream_t stream, std::function<void()> body) {
  use_context();
  if (const cudaError_t e = sticky()) return fail(e);
  const dim3 b = shape.block, g = shape.grid;
  const unsigned bd[3] = {b.x, b.y, b.z}, gd[3] = {g.x, g.y, g.z};
  for (int i = 0; i < 3; ++i)
    if (bd[i] == 0 || bd[i] > kMaxBlockDim[i] || gd[i] == 0 || gd[i] > kMaxGridDim[i]) return fail(cudaErrorInvalidConfiguration);
  if (std::uint64_t{b.x} * b.y * b.z > kMaxThreadsPerBlock) return fail(cudaErrorInvalidConfiguration);
  if (shape.dynamic_smem > max_dynamic_smem(kernel) || shape.dynamic_smem > kMaxSmemPerBlockOptin)
    return fail(cudaErrorInvalidValue);
  std::string name = kernel_name(kernel);
  const cudaError_t e = enqueue(stream, [shape, body = std::move(body), name = std::move(name)] {
    return run_grid(shape, body, name);
  });
  if (e != cudaSuccess) return fail(e);
  count(&Counters::launches);
  return cudaSuccess;
}

}  // namespace zinf::cudax

// ---- the CUDA runtime API ---------------------------------------------------------------------------

using namespace zinf::cudax;

extern "C" {

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorHostMemoryAlreadyRegistered: return "part or all of the requested memory range is already mapped";
    case cudaErrorHostMemoryNotRegistered: return "pointer does not correspond to a registered memory region";
    case cudaErrorSetOnActiveProcess: return "cannot set while device is active in this process";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    default: return "unknown error (CUDA executor)";
  }
}
const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    default: return "cudaError (CUDA executor)";
  }
}

cudaError_t cudaGetLastError() {
  if (const cudaError_t s = sticky()) return s;
  const cudaError_t e = tl_last;
  tl_last = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() {
  if (const cudaError_t s = sticky()) return s;
  return tl_last;
}

// ---- device -----------------------------------------------------------------------------------------

cudaError_t cudaGetDeviceCount(int* n) {
  if (!n) return fail(cudaErrorInvalidValue);
  *n = device_count();
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) {
  if (d < 0 || d >= device_count()) return fail(cudaErrorInvalidDevice);
  tl_device = d;
  use_context();
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* d) {
  if (!d) return fail(cudaErrorInvalidValue);
  *d = tl_device;
  return cudaSuccess;
}
cudaError_t cudaSetDeviceFlags(unsigned flags) {
  use_context();
  g_device_flags = static_cast<int>(flags);
  return cudaSuccess;
}
cudaError_t cudaGetDeviceFlags(unsigned* flags) {
  if (!flags) return fail(cudaErrorInvalidValue);
  *flags = static_cast<unsigned>(g_device_flags) | cudaDeviceMapHost;
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* v) {
  if (!v) return fail(cudaErrorInvalidValue);
  *v = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* v) {
  if (!v) return fail(cudaErrorInvalidValue);
  *v = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int device) {
  if (!p) return fail(cudaErrorInvalidValue);
  if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
  std::memset(p, 0, sizeof *p);
  std::snprintf(p->name, sizeof p->name, "zinf CUDA executor (CPU, sm_%d%d)", kMajor, kMinor);
  p->totalGlobalMem = memory_total();
  p->sharedMemPerBlock = kDefaultDynamicSmem;
  p->sharedMemPerBlockOptin = kMaxSmemPerBlockOptin;
  p->sharedMemPerMultiprocessor = kSmemPerMultiprocessor;
  p->regsPerBlock = 65536;
  p->regsPerMultiprocessor = 65536;
  p->warpSize = 32;
  p->maxThreadsPerBlock = static_cast<int>(kMaxThreadsPerBlock);
  p->maxThreadsPerMultiProcessor = 2048;
  p->maxBlocksPerMultiProcessor = 32;
  for (int i = 0; i < 3; ++i) {
    p->maxThreadsDim[i] = static_cast<int>(kMaxBlockDim[i]);
    p->maxGridSize[i] = static_cast<int>(kMaxGridDim[i]);
  }
  p->totalConstMem = 65536;
  p->major = kMajor;
  p->minor = kMinor;
  p->multiProcessorCount = kMultiprocessors;
  p->canMapHostMemory = 1;
  p->unifiedAddressing = 1;
  p->concurrentKernels = 1;
  p->asyncEngineCount = 2;
  p->memoryBusWidth = 6144;
  p->l2CacheSize = 50 * 1024 * 1024;
  p->pciBusID = device;
  p->integrated = 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int device) {
  if (!v) return fail(cudaErrorInvalidValue);
  if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
  switch (a) {
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = static_cast<int>(kMaxSmemPerBlockOptin); return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlock: *v = static_cast<int>(kDefaultDynamicSmem); return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *v = static_cast<int>(kSmemPerMultiprocessor); return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor: *v = kMajor; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor: *v = kMinor; return cudaSuccess;
    case cudaDevAttrMultiProcessorCount: *v = kMultiprocessors; return cudaSuccess;
    case cudaDevAttrMaxThreadsPerBlock: *v = static_cast<int>(kMaxThreadsPerBlock); return cudaSuccess;
    case cudaDevAttrWarpSize: *v = 32; return cudaSuccess;
    case cudaDevAttrCanMapHostMemory: *v = 1; return cudaSuccess;
    case cudaDevAttrUnifiedAddressing: *v = 1; return cudaSuccess;
    default: return fail(cudaErrorInvalidValue);
  }
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  use_context();
  if (!func) return fail(cudaErrorInvalidDeviceFunction);
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;  // carveout: a hint
  if (value < 0 || static_cast<std::size_t>(value) > kMaxSmemPerBlockOptin) return fail(cudaErrorInvalidValue);
  FuncAttrs& f = func_attrs();
  std::lock_guard<std::mutex> g(f.mu);
  f.max_dynamic_smem[func] = static_cast<std::size_t>(value);
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  use_context();
  count(&Counters::device_syncs);
  for (const auto& s : live_streams()) s->drain();
  return sticky();
}

// Ends the context's sticky error (a kernel fault), after the streams have drained: the executor's
// own tests fault on purpose and go on. Allocations stay (a GPU's reset would free them).
cudaError_t cudaDeviceReset() {
  cudaDeviceSynchronize();
  g_sticky.store(0);
  tl_last = cudaSuccess;
  return cudaSuccess;
}

// ---- memory -------------------------------------------------------------------------------------

// A fresh allocation overlapping a recorded one would mean the registry missed a free: an executor bug.
#define ZINF_CHECK_RANGE(x)                                              \
  do {                                                                   \
    if ((x) != cudaSuccess) {                                            \
      report("a new allocation overlaps a recorded range (registry bug)"); \
      std::abort();                                                      \
    }                                                                    \
  } while (0)
namespace {
cudaError_t add_range(void* p, std::size_t size, MemKind kind) {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  auto it = r.ranges.lower_bound(a);
  if (it != r.ranges.end() && it->first < a + size) return cudaErrorHostMemoryAlreadyRegistered;
  if (it != r.ranges.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second.size > a) return cudaErrorHostMemoryAlreadyRegistered;
  }
  r.ranges[a] = Allocation{size, kind};
  return cudaSuccess;
}
// Removes the allocation starting exactly at p if it has `kind`; *size is its size.
bool remove_range(void* p, MemKind kind, std::size_t* size = nullptr) {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  auto it = r.ranges.find(reinterpret_cast<std::uintptr_t>(p));
  if (it == r.ranges.end() || it->second.kind != kind) return false;
  if (kind == MemKind::device) r.device_bytes -= it->second.size;
  if (size) *size = it->second.size;
  r.ranges.erase(it);
  return true;
}
// cudaFree / cudaFreeHost: CUDA synchronises the device first; a pointer that is not the start of a
// live allocation of that kind is an error.
cudaError_t free_allocation(void* p, MemKind kind, const char* call) {
  use_context();
  ZINF_CUDAX_STICKY();
  if (!p) return cudaSuccess;
  cudaDeviceSynchronize();
  std::size_t size = 0;
  if (!remove_range(p, kind, &size)) {
    report(std::string(call) + " of a pointer that is not the start of a live " + to_string(kind) + " allocation");
    return fail(cudaErrorInvalidValue);
  }
  if (kind == MemKind::device)
    device_memory_free(p, size);
  else
    std::free(p);
  return cudaSuccess;
}
}  // namespace

cudaError_t cudaMalloc(void** p, std::size_t size) {
  use_context();
  ZINF_CUDAX_STICKY();
  if (!p) return fail(cudaErrorInvalidValue);
  *p = nullptr;
  if (size == 0) return cudaSuccess;
  Registry& r = registry();
  {
    std::lock_guard<std::mutex> g(r.mu);
    if (r.device_bytes + size > memory_total()) return fail(cudaErrorMemoryAllocation);
    r.device_bytes += size;
  }
  void* m = device_memory_allocate(size);
  if (!m) {
    std::lock_guard<std::mutex> g(r.mu);
    r.device_bytes -= size;
    return fail(cudaErrorMemoryAllocation);
  }
  poison_tail(m, size, (size + 255) / 256 * 256);
  {
    const DeviceAccess fill;
    std::memset(m, 0xFF, size);
  }
  ZINF_CHECK_RANGE(add_range(m, size, MemKind::device));
  count(&Counters::device_allocs);
  *p = m;
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  if (p) count(&Counters::device_frees);
  return free_allocation(p, MemKind::device, "cudaFree");
}

cudaError_t cudaHostAlloc(void** p, std::size_t size, unsigned /*flags*/) {
  use_context();
  ZINF_CUDAX_STICKY();
  if (!p) return fail(cudaErrorInvalidValue);
  *p = nullptr;
  if (size == 0) return cudaSuccess;
  void* m = std::aligned_alloc(4096, (size + 4095) / 4096 * 4096);
  if (!m) return fail(cudaErrorMemoryAllocation);
  poison_tail(m, size, (size + 4095) / 4096 * 4096);
  ZINF_CHECK_RANGE(add_range(m, size, MemKind::pinned));
  count(&Counters::pinned_allocs);
  *p = m;
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void** p, std::size_t size) { return cudaHostAlloc(p, size, cudaHostAllocDefault); }

cudaError_t cudaFreeHost(void* p) { return free_allocation(p, MemKind::pinned, "cudaFreeHost"); }

cudaError_t cudaHostRegister(void* p, std::size_t size, unsigned /*flags*/) {
  use_context();
  ZINF_CUDAX_STICKY();
  if (!p || size == 0) return fail(cudaErrorInvalidValue);
  if (where(p).kind != MemKind::pageable) return fail(cudaErrorHostMemoryAlreadyRegistered);
  const cudaError_t e = add_range(p, size, MemKind::registered);
  if (e == cudaSuccess) count(&Counters::pinned_allocs);
  return e == cudaSuccess ? e : fail(e);
}
cudaError_t cudaHostUnregister(void* p) {
  use_context();
  ZINF_CUDAX_STICKY();
  if (!p || !remove_range(p, MemKind::registered)) return fail(cudaErrorHostMemoryNotRegistered);
  return cudaSuccess;
}
cudaError_t cudaHostGetDevicePointer(void** dev, void* host, unsigned flags) {
  use_context();
  ZINF_CUDAX_STICKY();
  if (!dev || flags != 0) return fail(cudaErrorInvalidValue);
  const MemKind k = where(host).kind;
  if (k != MemKind::pinned && k != MemKind::registered) return fail(cudaErrorInvalidValue);
  *dev = host;  // unified addressing: the same address
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p) {
  if (!a) return fail(cudaErrorInvalidValue);
  std::memset(a, 0, sizeof *a);
  const MemRange m = where(p);
  a->device = 0;
  switch (m.kind) {
    case MemKind::pageable:
      a->type = cudaMemoryTypeUnregistered;
      a->device = -2;
      break;
    case MemKind::device:
      a->type = cudaMemoryTypeDevice;
      a->devicePointer = const_cast<void*>(p);
      break;
    case MemKind::pinned:
    case MemKind::registered:
      a->type = cudaMemoryTypeHost;
      a->devicePointer = const_cast<void*>(p);
      a->hostPointer = const_cast<void*>(p);
      break;
  }
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(std::size_t* free_bytes, std::size_t* total) {
  use_context();
  ZINF_CUDAX_STICKY();
  if (!free_bytes || !total) return fail(cudaErrorInvalidValue);
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  *total = memory_total();
  *free_bytes = memory_total() - r.device_bytes;
  return cudaSuccess;
}

// ---- copies -----------------------------------------------------------------------------------------

namespace {
// The direction a copy really takes, or cudaErrorInvalidValue where its pointers do not match `kind`
// (or a device range runs past its allocation).
cudaError_t check_copy(void* dst, const void* src, std::size_t n, cudaMemcpyKind kind, bool* dst_pageable,
                       bool* src_pageable) {
  const MemRange d = where(dst), s = where(src);
  const bool dd = d.kind == MemKind::device, sd = s.kind == MemKind::device;
  if ((dd && !is_device_range(dst, n)) || (sd && !is_device_range(src, n))) {
    report("a copy of " + std::to_string(n) + " bytes runs past the end of its device allocation");
    return cudaErrorInvalidValue;
  }
  bool ok = true;
  switch (kind) {
    case cudaMemcpyHostToHost: ok = !dd && !sd; break;
    case cudaMemcpyHostToDevice: ok = dd && !sd; break;
    case cudaMemcpyDeviceToHost: ok = !dd && sd; break;
    case cudaMemcpyDeviceToDevice: ok = dd && sd; break;
    case cudaMemcpyDefault: ok = true; break;
    default: return cudaErrorInvalidMemcpyDirection;
  }
  if (!ok) {
    report(std::string("a copy declared ") +
           (kind == cudaMemcpyHostToDevice   ? "HostToDevice"
            : kind == cudaMemcpyDeviceToHost ? "DeviceToHost"
            : kind == cudaMemcpyDeviceToDevice ? "DeviceToDevice"
                                               : "HostToHost") +
           " reads " + to_string(s.kind) + " and writes " + to_string(d.kind));
    return cudaErrorInvalidValue;
  }
  *dst_pageable = d.kind == MemKind::pageable;
  *src_pageable = s.kind == MemKind::pageable;
  return cudaSuccess;
}
}  // namespace

cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t n, cudaMemcpyKind kind, cudaStream_t stream) {
  use_context();
  ZINF_CUDAX_STICKY();
  if (n == 0) return cudaSuccess;
  if (!dst || !src) return fail(cudaErrorInvalidValue);
  bool dst_pageable = false, src_pageable = false;
  if (const cudaError_t e = check_copy(dst, src, n, kind, &dst_pageable, &src_pageable)) return fail(e);
  if (src_pageable || dst_pageable) count(&Counters::pageable_copies);
  if (src_pageable && !dst_pageable) {
    // Staged: the source is read now, the destination written in stream order.
    auto staged = std::make_shared<std::vector<unsigned char>>(static_cast<const unsigned char*>(src),
                                                               static_cast<const unsigned char*>(src) + n);
    const cudaError_t e = enqueue(stream, [dst, staged] {
      std::memcpy(dst, staged->data(), staged->size());
      return cudaSuccess;
    });
    return e == cudaSuccess ? e : fail(e);
  }
  auto done = std::make_shared<std::atomic<bool>>(false);
  const cudaError_t e = enqueue(stream, [dst, src, n, done] {
    std::memmove(dst, src, n);
    done->store(true);
    done->notify_all();
    return cudaSuccess;
  });
  if (e != cudaSuccess) return fail(e);
  if (dst_pageable) {
    // A copy into pageable memory returns once it is done (or the context has faulted: queued work is
    // then dropped, and the copy never runs).
    while (!done->load(std::memory_order_acquire) && !sticky()) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  return sticky();
}

cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t n, cudaMemcpyKind kind) {
  count(&Counters::blocking_copies);
  const cudaError_t e = cudaMemcpyAsync(dst, src, n, kind, nullptr);
  return e;
}

cudaError_t cudaMemsetAsync(void* p, int value, std::size_t n, cudaStream_t stream) {
  use_context();
  ZINF_CUDAX_STICKY();
  if (n == 0) return cudaSuccess;
  if (!is_device_range(p, n)) {
    report("cudaMemset of " + std::to_string(n) + " bytes outside device memory (" + to_string(where(p).kind) + ")");
    return fail(cudaErrorInvalidValue);
  }
  const cudaError_t e = enqueue(stream, [p, value, n] {
    std::memset(p, value, n);
    return cudaSuccess;
  });
  return e == cudaSuccess ? e : fail(e);
}
cudaError_t cudaMemset(void* p, int value, std::size_t n) { return cudaMemsetAsync(p, value, n, nullptr); }

// ---- streams ------------------------------------------------------------------------------------

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
  use_context();
  ZINF_CUDAX_STICKY();
  if (!s) return fail(cudaErrorInvalidValue);
  auto st = std::make_shared<Stream>();
  st->flags = flags;
  {
    Streams& ss = streams();
    std::lock_guard<std::mutex> g(ss.mu);
    st->rng.seed(seed() * 1000003ull + ss.created++);
    ss.live[st.get()] = st;
  }
  Stream* raw = st.get();
  st->worker = std::thread([raw] { raw->run(); });
  *s = reinterpret_cast<cudaStream_t>(raw);
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  use_context();
  std::shared_ptr<Stream> st;
  {
    Streams& ss = streams();
    std::lock_guard<std::mutex> g(ss.mu);
    auto it = ss.live.find(reinterpret_cast<Stream*>(s));
    if (it == ss.live.end()) return fail(cudaErrorInvalidResourceHandle);
    st = it->second;
    ss.live.erase(it);
  }
  {
    std::lock_guard<std::mutex> g(st->mu);
    st->stop = true;
  }
  st->cv.notify_all();
  st->worker.join();  // the work already queued runs first; the object goes with its last holder
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  use_context();
  count(&Counters::stream_syncs);
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) {
    drain_blocking_streams();
    return sticky();
  }
  const std::shared_ptr<Stream> st = find_stream(s);
  if (!st) return fail(cudaErrorInvalidResourceHandle);
  st->drain();
  return sticky();
}

cudaError_t cudaStreamQuery(cudaStream_t s) {
  use_context();
  ZINF_CUDAX_STICKY();
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return cudaSuccess;
  const std::shared_ptr<Stream> st = find_stream(s);
  if (!st) return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> g(st->mu);
  return st->work.empty() && !st->busy ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void* data) {
  ZINF_CUDAX_STICKY();
  if (!fn) return fail(cudaErrorInvalidValue);
  const cudaError_t e = enqueue_host(s, [fn, data] {
    fn(data);  // host code: device memory stays closed to it
    return cudaSuccess;
  });
  return e == cudaSuccess ? e : fail(e);
}

// ---- events -------------------------------------------------------------------------------------

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags) {
  use_context();
  ZINF_CUDAX_STICKY();
  if (!e) return fail(cudaErrorInvalidValue);
  auto ev = std::make_shared<Event>();
  ev->flags = flags;
  Events& es = events();
  std::lock_guard<std::mutex> g(es.mu);
  es.live.emplace(ev.get(), ev);
  *e = reinterpret_cast<cudaEvent_t>(ev.get());
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  use_context();
  const std::shared_ptr<Event> ev = find_event(e);
  if (!ev) return fail(cudaErrorInvalidResourceHandle);
  Events& es = events();
  std::lock_guard<std::mutex> g(es.mu);
  es.live.erase(ev.get());  // freed here, or by the last queued record or wait that holds it
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  use_context();
  ZINF_CUDAX_STICKY();
  const std::shared_ptr<Event> ev = find_event(e);
  if (!ev) return fail(cudaErrorInvalidResourceHandle);
  const bool legacy = s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread;
  const std::shared_ptr<Stream> target = legacy ? nullptr : find_stream(s);
  if (!legacy && !target) return fail(cudaErrorInvalidResourceHandle);
  std::uint64_t n = 0;
  {
    std::lock_guard<std::mutex> g(ev->mu);
    n = ++ev->recorded;
  }
  // On an idle stream the record has nothing to wait for: it completes at once, as a GPU's does
  // within microseconds (so a query right after a synchronised stream's record reports done).
  if (const std::shared_ptr<Stream>& st = target) {
    std::lock_guard<std::mutex> sl(st->mu);
    if (st->work.empty() && !st->busy) {
      std::lock_guard<std::mutex> g(ev->mu);
      ev->completed = std::max(ev->completed, n);
      ev->when = std::chrono::steady_clock::now();
      ev->cv.notify_all();
      return cudaSuccess;
    }
  }
  const cudaError_t r = enqueue_host(s, [ev, n] {
    std::lock_guard<std::mutex> g(ev->mu);
    if (n > ev->completed) {
      ev->completed = n;
      ev->when = std::chrono::steady_clock::now();
    }
    ev->cv.notify_all();
    return cudaSuccess;
  });
  return r == cudaSuccess ? r : fail(r);
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
  use_context();
  ZINF_CUDAX_STICKY();
  const std::shared_ptr<Event> ev = find_event(e);
  if (!ev) return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> g(ev->mu);
  return ev->completed >= ev->recorded ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  use_context();
  count(&Counters::event_syncs);
  ZINF_CUDAX_STICKY();
  const std::shared_ptr<Event> ev = find_event(e);
  if (!ev) return fail(cudaErrorInvalidResourceHandle);
  std::unique_lock<std::mutex> l(ev->mu);
  const std::uint64_t target = ev->recorded;
  while (ev->completed < target && !sticky()) ev->cv.wait_for(l, std::chrono::milliseconds(5));
  return sticky();
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
  use_context();
  ZINF_CUDAX_STICKY();
  if (flags != 0 && flags != cudaEventWaitDefault) return fail(cudaErrorInvalidValue);
  const std::shared_ptr<Event> ev = find_event(e);
  if (!ev) return fail(cudaErrorInvalidResourceHandle);
  std::uint64_t target = 0;
  {
    std::lock_guard<std::mutex> g(ev->mu);
    target = ev->recorded;  // the most recent record at the time of the call
  }
  const cudaError_t r = enqueue_host(s, [ev, target] {
    std::unique_lock<std::mutex> l(ev->mu);
    while (ev->completed < target && !sticky()) ev->cv.wait_for(l, std::chrono::milliseconds(5));
    return cudaSuccess;
  });
  return r == cudaSuccess ? r : fail(r);
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  use_context();
  ZINF_CUDAX_STICKY();
  if (!ms) return fail(cudaErrorInvalidValue);
  const std::shared_ptr<Event> a = find_event(start);
  const std::shared_ptr<Event> b = find_event(end);
  if (!a || !b) return fail(cudaErrorInvalidResourceHandle);
  if ((a->flags | b->flags) & cudaEventDisableTiming) return fail(cudaErrorInvalidResourceHandle);
  std::scoped_lock l(a->mu, b->mu);
  if (a->recorded == 0 || b->recorded == 0) return fail(cudaErrorInvalidResourceHandle);
  if (a->completed < a->recorded || b->completed < b->recorded) return cudaErrorNotReady;
  *ms = std::chrono::duration<float, std::milli>(b->when - a->when).count();
  return cudaSuccess;
}

}  // extern "C"
