// kernel.cpp — the executor's scheduler: runs a grid of CUDA threads as fibers on the calling OS
// thread, block after block (block order and thread order chosen by ZINF_CUDAX_ORDER).
//
// A fiber runs until it reaches a collective (__syncthreads, a _sync warp function, a wmma
// operation) or returns; the scheduler then resumes the next ready fiber. So between two barriers
// the threads of a block run one after the other, in the chosen order, and a kernel whose result
// depends on that order (a missing barrier) gives different results under fifo, lifo and random.
// Collectives are checked as CUDA defines them:
//   - __syncthreads must be reached by every thread of the block at the same call: a thread that
//     returned, or waits at another barrier, is a fault naming both places;
//   - a warp collective names its lanes in `mask`; the caller must be in it, every lane in it must
//     arrive at the same kind of operation with the same mask, and none may have exited;
//   - a block where no fiber can go on (a lane waits for a lane that waits at a barrier) is a fault.
// A fault prints one line ("cudax: ..."), abandons the block's fibers and fails the launch with
// cudaErrorLaunchFailure, which the stream reports like an asynchronous GPU fault.
//
// Under ThreadSanitizer (-fsanitize=thread) every fiber is a TSan fiber, switched without implied
// synchronisation; the collectives release and acquire, so shared- or global-memory accesses that
// no barrier orders are reported as races with their file and line.
//
// Under AddressSanitizer every switch is announced (__sanitizer_start_switch_fiber / _finish_), so
// ASan knows which stack is running, and a fiber's stack is unpoisoned before it is reused (a fault
// abandons fibers mid-call, leaving their frames' redzones behind).
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cudax/kernel.h"
#include "cudax/runtime.h"
#include "internal.h"

// ZINF_CUDAX_TSAN: set by the build when it uses ThreadSanitizer. This file itself is compiled
// without TSan's instrumentation (the scheduler's own bookkeeping is handed between fibers by the
// switches, which TSan is told do not synchronise), so only the kernels' accesses are checked.
#if ZINF_CUDAX_TSAN
#include <sanitizer/tsan_interface.h>
#endif

// The context switch: saves the callee-saved registers, the SSE control word and the x87 control
// word on the current stack, stores the stack pointer in *from, loads `to` and restores the same set
// from there. A new fiber's stack is prepared so that the first switch "returns" into
// zinf_cudax_fiber_start, which calls the entry (r13) with its argument (r12). System V x86-64.
extern "C" void zinf_cudax_switch(void** from, void* to);
extern "C" void zinf_cudax_fiber_start();
asm(R"(
  .text
  .globl zinf_cudax_switch
  .type zinf_cudax_switch, @function
zinf_cudax_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size zinf_cudax_switch, .-zinf_cudax_switch
  .globl zinf_cudax_fiber_start
  .type zinf_cudax_fiber_start, @function
zinf_cudax_fiber_start:
  movq %r12, %rdi
  callq *%r13
  ud2
  .size zinf_cudax_fiber_start, .-zinf_cudax_fiber_start
  .section .note.GNU-stack,"",@progbits
  .text
)");

namespace zinf::cudax {

thread_local constinit const Coordinates* tl_coords = nullptr;

namespace {

constexpr std::size_t kStackBytes = 256 * 1024;  // per CUDA thread; a guard page below each

enum class Status { ready, at_barrier, at_warp, done };

struct Stack {
  unsigned char* base = nullptr;  // the mapping, guard page first
  std::size_t bytes = 0;
};

struct ThreadState {
  Coordinates coords{};
  int linear = 0, lane = 0, warp = 0;
  Status status = Status::ready;
  Site site{nullptr, 0};  // where it waits, or where it faulted
  void* sp = nullptr;
  Stack stack;
#if ZINF_CUDAX_TSAN
  void* tsan_fiber = nullptr;
#endif
#if ZINF_CUDAX_ASAN
  void* asan_fake_stack = nullptr;  // ASan's fake stack of this fiber while it is switched out
#endif
  std::uint64_t result = 0;  // a warp collective's result for this lane
};

// One warp collective in progress: the lanes it names, who has arrived, what they contributed.
struct Pending {
  bool active = false;
#if ZINF_CUDAX_TSAN
  char sync[2] = {};  // TSan's address for this slot's collective, alternating by generation
  unsigned gen = 0;
#endif
  unsigned mask = 0;
  unsigned arrived = 0;
  int kind = 0;  // what the lanes called (a shuffle mode, ballot, syncwarp, a wmma operation)
  std::uint64_t key0 = 0, key1 = 0;  // what every lane must pass alike (wmma: pointer, ldm)
  Site first{nullptr, 0};
  std::uint64_t values[32] = {};
  int args[32] = {};
  int width = 32;
};

struct WarpState {
  unsigned live = 0;  // lanes that exist and have not returned
  // The collectives in progress (lanes of disjoint masks may each have one). Fixed slots: a fiber
  // never allocates or moves the scheduler's memory.
  static constexpr int kSlots = 32;
  Pending pending[kSlots];
  std::uint64_t completed = 0;  // collectives completed (their generation)
};

struct BlockRun {
  ThreadState* threads = nullptr;  // the block's threads
  std::size_t nthreads = 0;
  std::vector<WarpState> warps;
  const std::function<void()>* body = nullptr;
  unsigned char* dynamic_smem = nullptr;
  bool failed = false;
  std::string fault;
  void* main_sp = nullptr;
  ThreadState* current = nullptr;
  // The threads that can run, oldest first: a ring of one slot per thread (a thread is in it at most
  // once), allocated before the block runs, so that no fiber allocates.
  std::vector<int> ring;
  std::size_t ring_head = 0, ring_count = 0;
  void push_ready(int i) {
    ring[(ring_head + ring_count) % ring.size()] = i;
    ++ring_count;
  }
  int pop_ready(Order o, std::mt19937_64& rng) {
    const std::size_t n = ring.size();
    std::size_t k = 0;  // from the oldest
    if (o == Order::lifo) k = ring_count - 1;
    if (o == Order::random) k = static_cast<std::size_t>(rng() % ring_count);
    const std::size_t at = (ring_head + k) % n;
    const int i = ring[at];
    if (k == 0) {
      ring_head = (ring_head + 1) % n;
    } else {
      ring[at] = ring[(ring_head + ring_count - 1) % n];  // fill the hole with the newest
    }
    --ring_count;
    return i;
  }
  std::uint64_t barrier_gen = 0;  // barriers completed
#if ZINF_CUDAX_ASAN
  void* main_asan_fake_stack = nullptr;
  const void* main_stack_bottom = nullptr;  // the scheduler's stack, as ASan reports it on a switch
  std::size_t main_stack_size = 0;
#endif
#if ZINF_CUDAX_TSAN
  void* main_tsan_fiber = nullptr;
  // Addresses TSan synchronises on. A barrier (and a warp's collective) alternates between two, by
  // the parity of its generation, so that a thread leaving generation g acquires only what the
  // threads did before arriving at g, not what a fast thread did after it (at g + 1).
  char barrier_sync[2] = {};
  char block_start = 0;  // released by the scheduler as a block starts, acquired by its fibers
  char block_end = 0;    // released by each fiber as it returns, acquired by the scheduler
#endif
};

thread_local BlockRun* tl_run = nullptr;

// Per OS thread: the fibers' states and stacks, reused launch after launch.
struct Pool {
  std::vector<ThreadState> threads;
  ~Pool() {
    for (ThreadState& t : threads) {
      if (t.stack.base) munmap(t.stack.base, t.stack.bytes);
#if ZINF_CUDAX_TSAN
      if (t.tsan_fiber) __tsan_destroy_fiber(t.tsan_fiber);
#endif
    }
  }
};
thread_local Pool tl_pool;

std::string where_str(Site s) {
  if (!s.file) return "(unknown)";
  const char* f = std::strrchr(s.file, '/');
  return std::string(f ? f + 1 : s.file) + ":" + std::to_string(s.line);
}
std::string thread_str(const ThreadState& t) {
  const auto& c = t.coords;
  return "thread (" + std::to_string(c.thread_idx.x) + "," + std::to_string(c.thread_idx.y) + "," +
         std::to_string(c.thread_idx.z) + ") of block (" + std::to_string(c.block_idx.x) + "," +
         std::to_string(c.block_idx.y) + "," + std::to_string(c.block_idx.z) + ")";
}

void fiber_entry(void* arg);

void prepare(ThreadState& t) {
  if (!t.stack.base) {
    const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    t.stack.bytes = kStackBytes + page;
    void* m = mmap(nullptr, t.stack.bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
      report("cannot map a fiber stack");
      std::abort();
    }
    mprotect(m, page, PROT_NONE);  // a stack overflow faults here instead of corrupting a neighbour
    t.stack.base = static_cast<unsigned char*>(m);
#if ZINF_CUDAX_TSAN
    t.tsan_fiber = __tsan_create_fiber(0);
#endif
  }
#if ZINF_CUDAX_ASAN
  // A fiber abandoned by a fault left its frames' redzones poisoned on this stack.
  ASAN_UNPOISON_MEMORY_REGION(t.stack.base + (t.stack.bytes - kStackBytes), kStackBytes);
#endif
  // The first switch pops: mxcsr/fpcw, r15, r14, r13 (entry), r12 (argument), rbx, rbp, then returns
  // into zinf_cudax_fiber_start with the stack 16-byte aligned.
  auto top = reinterpret_cast<std::uintptr_t>(t.stack.base + t.stack.bytes) & ~std::uintptr_t{15};
  auto* sp = reinterpret_cast<std::uint64_t*>(top - 16);
  *--sp = reinterpret_cast<std::uint64_t>(&zinf_cudax_fiber_start);
  *--sp = 0;                                                 // rbp
  *--sp = 0;                                                 // rbx
  *--sp = reinterpret_cast<std::uint64_t>(&t);               // r12
  *--sp = reinterpret_cast<std::uint64_t>(&fiber_entry);     // r13
  *--sp = 0;                                                 // r14
  *--sp = 0;                                                 // r15
  std::uint32_t mxcsr = 0;
  std::uint16_t fpcw = 0;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpcw));
  --sp;
  std::memcpy(sp, &mxcsr, 4);
  std::memcpy(reinterpret_cast<unsigned char*>(sp) + 4, &fpcw, 2);
  t.sp = sp;
  t.status = Status::ready;
  t.result = 0;
}

// Back to the scheduler from the running fiber.
void yield_to_main() {
  BlockRun& r = *tl_run;
  ThreadState* t = r.current;
#if ZINF_CUDAX_TSAN
  // Back to the scheduler with synchronisation (its bookkeeping follows what the fiber did); from the
  // scheduler to a fiber without, so fibers stay unordered unless a collective orders them.
  __tsan_switch_to_fiber(r.main_tsan_fiber, 0);
#endif
#if ZINF_CUDAX_ASAN
  // A fiber that is done is never resumed: ASan may drop its fake stack.
  __sanitizer_start_switch_fiber(t->status == Status::done ? nullptr : &t->asan_fake_stack, r.main_stack_bottom,
                                 r.main_stack_size);
#endif
  zinf_cudax_switch(&t->sp, r.main_sp);
#if ZINF_CUDAX_ASAN
  __sanitizer_finish_switch_fiber(t->asan_fake_stack, &r.main_stack_bottom, &r.main_stack_size);
#endif
  tl_coords = &t->coords;  // resumed: the scheduler set current back to this fiber
}

void resume(BlockRun& r, ThreadState& t) {
  r.current = &t;
  tl_coords = &t.coords;
#if ZINF_CUDAX_TSAN
  __tsan_switch_to_fiber(t.tsan_fiber, __tsan_switch_to_fiber_no_sync);
#endif
#if ZINF_CUDAX_ASAN
  __sanitizer_start_switch_fiber(&r.main_asan_fake_stack, t.stack.base + (t.stack.bytes - kStackBytes), kStackBytes);
#endif
  zinf_cudax_switch(&r.main_sp, t.sp);
#if ZINF_CUDAX_ASAN
  __sanitizer_finish_switch_fiber(r.main_asan_fake_stack, nullptr, nullptr);
#endif
  r.current = nullptr;
}

void fiber_entry(void* arg) {
  auto* t = static_cast<ThreadState*>(arg);
  BlockRun& r = *tl_run;
#if ZINF_CUDAX_ASAN
  // The first switch into this fiber: no fake stack of its own yet; learn the scheduler's stack.
  __sanitizer_finish_switch_fiber(nullptr, &r.main_stack_bottom, &r.main_stack_size);
#endif
#if ZINF_CUDAX_TSAN
  __tsan_acquire(&r.block_start);
#endif
  (*r.body)();
#if ZINF_CUDAX_TSAN
  __tsan_release(&r.block_end);
#endif
  t->status = Status::done;
  r.warps[static_cast<std::size_t>(t->warp)].live &= ~(1u << t->lane);
  yield_to_main();
  std::abort();  // a finished fiber is never resumed
}

// Ends the calling fiber with a fault whose line `what()` makes. The fiber is abandoned mid-call,
// so nothing its frames own is ever destroyed: the message is built here, into the block's record,
// and its temporaries are gone before the switch.
template <typename What>
[[noreturn]] void fault_here(const What& what) {
  BlockRun& r = *tl_run;
  if (!r.failed) {
    r.failed = true;
    r.fault = what();
  }
#if ZINF_CUDAX_TSAN
  __tsan_release(&r.block_end);  // the launch's memory is freed after the fault
#endif
  r.current->status = Status::done;
  yield_to_main();
  std::abort();
}

ThreadState& me() {
  if (!tl_run || !tl_run->current) {
    report("a device function was called outside a kernel");
    std::abort();
  }
  return *tl_run->current;
}

// Arrive at a warp collective; returns when every lane of `mask` has arrived (the lane's result is
// then in me().result). `compute` forms every lane's result from the Pending once all are in.
template <typename Compute>
void warp_collective(unsigned mask, int kind, std::uint64_t key0, std::uint64_t key1, std::uint64_t value, int arg,
                     int width, Site site, const char* name, Compute compute) {
  BlockRun& r = *tl_run;
  ThreadState& t = me();
  WarpState& w = r.warps[static_cast<std::size_t>(t.warp)];
  const unsigned bit = 1u << t.lane;
  if (!(mask & bit))
    fault_here([&] { return std::string(name) + " at " + where_str(site) + ": calling lane " + std::to_string(t.lane) +
               " is not in the mask 0x" + [&] { char b[16]; std::snprintf(b, sizeof b, "%08x", mask); return std::string(b); }(); });
  // A lane joins the collective in progress with its mask (and not yet joined by it); otherwise it
  // starts one. Lanes may take part in collectives of other masks in between (legal since sm_70:
  // each lane performs its own in program order); real mismatches end in the deadlock report.
  Pending* p = nullptr;
  for (Pending& q : w.pending)
    if (q.active && q.mask == mask && !(q.arrived & bit)) {
      p = &q;
      break;
    }
  if (!p) {
    for (Pending& q : w.pending)
      if (!q.active) {
        p = &q;
        break;
      }
    if (!p) fault_here([&] { return std::string(name) + " at " + where_str(site) + ": more than 32 warp collectives at once in one warp"; });
    p->active = true;
    p->arrived = 0;
    p->mask = mask;
    p->kind = kind;
    p->key0 = key0;
    p->key1 = key1;
    p->first = site;
    p->width = width;
  } else if (p->kind != kind || p->key0 != key0 || p->key1 != key1 || p->width != width) {
    fault_here([&] { return std::string(name) + " at " + where_str(site) + " meets a different warp operation (or other arguments) at " +
               where_str(p->first) + " in lanes of the same mask"; });
  }
  p->arrived |= bit;
  p->values[t.lane] = value;
  p->args[t.lane] = arg;
#if ZINF_CUDAX_TSAN
  char* sync = &p->sync[p->gen & 1];
#endif
  if (p->arrived == mask) {
#if ZINF_CUDAX_TSAN
    __tsan_acquire(sync);  // what the other lanes did before they arrived
#endif
    ++w.completed;
#if ZINF_CUDAX_TSAN
    ++p->gen;
#endif
    const Pending& done = *p;
    ThreadState* ts = r.threads;
    const int first = t.warp * 32;
    for (int l = 0; l < 32; ++l) {
      if (!(done.mask & (1u << l))) continue;
      ThreadState& o = ts[static_cast<std::size_t>(first + l)];
      o.result = compute(done, l);
      if (&o != &t) {
        o.status = Status::ready;
        r.push_ready(first + l);
      }
    }
    p->active = false;
#if ZINF_CUDAX_TSAN
    __tsan_release(sync);  // the results, and what this lane did, for the others
#endif
  } else {
#if ZINF_CUDAX_TSAN
    __tsan_release(sync);
#endif
    t.status = Status::at_warp;
    t.site = site;
    yield_to_main();
#if ZINF_CUDAX_TSAN
    __tsan_acquire(sync);
#endif
  }
}

std::uint64_t launch_counter() {
  static std::atomic<std::uint64_t> n{0};
  return n.fetch_add(1);
}


// Runs one block to the end (or to its first fault). Returns the fault, empty when none.
// Runs one block to the end (or to its first fault). Returns the fault, empty when none.
// The next thread to run is the oldest ready one (fifo), the newest (lifo: a warp whose collective
// has just completed runs on before the rest of the block, as a warp scheduled ahead would), or a
// random one.
std::string run_block(BlockRun& r, Order o, std::mt19937_64& rng) {
  ThreadState* ts = r.threads;
  const std::size_t n = r.nthreads;
  for (std::size_t i = 0; i < n; ++i) prepare(ts[i]);
  r.failed = false;
  r.fault.clear();
  // Capacity for the most any block needs, so that no fiber allocates (see yield_to_main).
  for (WarpState& w : r.warps) {
    for (Pending& q : w.pending) q.active = false;
    w.completed = 0;
  }
  for (std::size_t i = 0; i < n; ++i) r.warps[i / 32].live |= 1u << (i % 32);
  r.barrier_gen = 0;
  r.ring.assign(n, 0);
  r.ring_head = r.ring_count = 0;
  for (std::size_t i = 0; i < n; ++i) r.push_ready(static_cast<int>(i));
  for (;;) {
    if (r.ring_count == 0) {
      std::size_t done = 0;
      const ThreadState* at_barrier = nullptr;
      const ThreadState* finished = nullptr;
      const ThreadState* at_warp = nullptr;
      for (std::size_t i = 0; i < n; ++i) {
        const ThreadState& t = ts[i];
        if (t.status == Status::done) ++done, finished = &t;
        if (t.status == Status::at_barrier && !at_barrier) at_barrier = &t;
        if (t.status == Status::at_warp && !at_warp) at_warp = &t;
      }
      if (done == n) return {};
      if (at_warp) {
        std::string why = "the warp operation at " + where_str(at_warp->site) + " (" + thread_str(*at_warp) +
                          ") waits for lanes that ";
        const WarpState& w = r.warps[static_cast<std::size_t>(at_warp->warp)];
        unsigned missing = 0;
        for (const Pending& p : w.pending)
          if (p.active && (p.arrived & (1u << at_warp->lane))) missing = p.mask & ~p.arrived;
        const ThreadState* other = nullptr;
        for (int l = 0; l < 32; ++l)
          if (missing & (1u << l)) {
            const std::size_t i = static_cast<std::size_t>(at_warp->warp * 32 + l);
            other = i < n ? &ts[i] : nullptr;
            break;
          }
        if (!other) why += "do not exist in this block";
        else if (other->status == Status::done) why += "have returned (" + thread_str(*other) + ")";
        else why += "wait at " + where_str(other->site) + " (" + thread_str(*other) + ")";
        return why;
      }
      // Every thread still running waits at a barrier.
      if (done > 0)
        return "__syncthreads at " + where_str(at_barrier->site) + " (" + thread_str(*at_barrier) + ") is not reached by " +
               thread_str(*finished) + ", which has returned";
      for (std::size_t i = 0; i < n; ++i)
        if (const ThreadState& t = ts[i]; t.site.line != at_barrier->site.line || std::strcmp(t.site.file, at_barrier->site.file) != 0)
          return "divergent __syncthreads: " + thread_str(*at_barrier) + " waits at " + where_str(at_barrier->site) +
                 ", " + thread_str(t) + " at " + where_str(t.site);
      ++r.barrier_gen;
      for (std::size_t i = 0; i < n; ++i) {
        ts[i].status = Status::ready;
        r.push_ready(static_cast<int>(i));
      }
      continue;
    }
    const int next = r.pop_ready(o, rng);
    ThreadState& t = ts[static_cast<std::size_t>(next)];
    if (t.status != Status::ready) continue;
    resume(r, t);
    if (r.failed) return r.fault;
  }
}

}  // namespace

// ---- the collectives (called from kernels through cudax/kernel.h) ----------------------------------

void syncthreads(Site site) {
  BlockRun& r = *tl_run;
  ThreadState& t = me();
  t.status = Status::at_barrier;
  t.site = site;
#if ZINF_CUDAX_TSAN
  char* sync = &r.barrier_sync[r.barrier_gen & 1];
  __tsan_release(sync);
#endif
  yield_to_main();
#if ZINF_CUDAX_TSAN
  __tsan_acquire(sync);
#endif
  (void)r;
}

namespace {
enum Kind { kShuffleIndex = 1, kShuffleUp, kShuffleDown, kShuffleBfly, kBallot, kSyncwarp, kWmmaBase = 100 };
}

void syncwarp(unsigned mask, Site site) {
  warp_collective(mask, kSyncwarp, 0, 0, 0, 0, 32, site, "__syncwarp", [](const Pending&, int) { return 0ull; });
}

std::uint64_t shuffle(unsigned mask, std::uint64_t value, int lane_arg, int width, ShuffleMode mode, Site site) {
  if (width < 1 || width > 32 || (width & (width - 1)) != 0)
    kernel_fault(site, "a shuffle's width must be a power of two from 1 to 32");
  const int kind = kShuffleIndex + static_cast<int>(mode);
  // Every lane's source lane, by the rule of each shuffle (CUDA C++ Programming Guide, warp shuffle
  // functions): a source outside the lane's segment of `width` lanes (later segments, for xor) gives
  // the lane its own value.
  auto compute = [mode](const Pending& p, int lane) -> std::uint64_t {
    const int w = p.width;
    const int seg = lane & ~(w - 1);
    const int a = p.args[lane];
    int src = lane;
    switch (mode) {
      case ShuffleMode::index: src = seg + (a & (w - 1)); break;
      case ShuffleMode::up: src = (lane - seg) - a >= 0 ? lane - a : lane; break;
      case ShuffleMode::down: src = (lane - seg) + a < w ? lane + a : lane; break;
      case ShuffleMode::bfly: {
        const int j = lane ^ a;
        src = j < seg + w ? j : lane;
        break;
      }
    }
    if (src < 0 || src > 31) src = lane;  // out-of-range arguments: the hardware compares unsigned
    if (!(p.mask & (1u << src))) return p.values[lane];  // an inactive source: undefined on the GPU
    return p.values[src];
  };
  warp_collective(mask, kind, 0, 0, value, lane_arg, width, site, "a warp shuffle", compute);
  return me().result;
}

unsigned ballot(unsigned mask, bool predicate, Site site) {
  warp_collective(mask, kBallot, 0, 0, predicate ? 1 : 0, 0, 32, site, "__ballot_sync", [](const Pending& p, int) {
    std::uint64_t b = 0;
    for (int l = 0; l < 32; ++l)
      if ((p.mask & (1u << l)) && p.values[l]) b |= 1ull << l;
    return b;
  });
  return static_cast<unsigned>(me().result);
}

unsigned activemask() {
  const ThreadState& t = me();
  return tl_run->warps[static_cast<std::size_t>(t.warp)].live;
}

void kernel_fault(Site site, const char* what) {
  fault_here([&] { return std::string(what) + " at " + where_str(site); });
}

unsigned char* dynamic_shared() {
  me();
  return tl_run->dynamic_smem;
}

// A wmma operation: every lane of the warp arrives with the same operation, pointer and stride
// (mma.h); returns once all have.
void wmma_collective(int op, const void* ptr, unsigned ldm, Site site, const char* name) {
  warp_collective(0xFFFFFFFFu, kWmmaBase + op, reinterpret_cast<std::uint64_t>(ptr), ldm, 0, 0, 32, site, name,
                  [](const Pending&, int) { return 0ull; });
}
int lane_id() { return me().lane; }

// A warp-wide operation done once for all lanes: every lane arrives with a pointer to its own
// arguments; the last to arrive calls fn with the 32 pointers (lane order) before any lane goes on.
void warp_once(int op, void* lane_args, void (*fn)(void* const* lanes), Site site, const char* name) {
  warp_collective(0xFFFFFFFFu, kWmmaBase + op, 0, 0, reinterpret_cast<std::uint64_t>(lane_args), 0, 32, site, name,
                  [fn](const Pending& p, int lane) {
                    if (lane == 0) {
                      void* lanes[32];
                      for (int l = 0; l < 32; ++l) lanes[l] = reinterpret_cast<void*>(p.values[l]);
                      fn(lanes);
                    }
                    return 0ull;
                  });
}

// ---- the grid ------------------------------------------------------------------------------------

cudaError_t run_grid(const LaunchShape& shape, const std::function<void()>& body, const std::string& name) {
  const unsigned threads = shape.block.x * shape.block.y * shape.block.z;
  std::vector<ThreadState>& ts = tl_pool.threads;
  if (ts.size() < threads) ts.resize(threads);
  BlockRun r;
  r.warps.resize((threads + 31) / 32);
  r.body = &body;
  std::vector<unsigned char> smem(shape.dynamic_smem + 128);
  auto* aligned = reinterpret_cast<unsigned char*>((reinterpret_cast<std::uintptr_t>(smem.data()) + 127) & ~std::uintptr_t{127});
  r.dynamic_smem = aligned;
  // Past the launch's dynamic shared memory (the alignment slack) is out of bounds, as on a GPU.
  poison_tail(smem.data(), 0, static_cast<std::size_t>(aligned - smem.data()));
  poison_tail(aligned, shape.dynamic_smem, smem.size() - static_cast<std::size_t>(aligned - smem.data()));
  BlockRun* outer = tl_run;
  const Coordinates* outer_coords = tl_coords;
  tl_run = &r;
#if ZINF_CUDAX_TSAN
  r.main_tsan_fiber = __tsan_get_current_fiber();
#endif
  const Order o = order();
  std::mt19937_64 rng(seed() * 0x9E3779B97F4A7C15ull + launch_counter());
  const std::uint64_t nblocks = std::uint64_t{shape.grid.x} * shape.grid.y * shape.grid.z;
  std::vector<std::uint64_t> blocks(static_cast<std::size_t>(nblocks));
  std::iota(blocks.begin(), blocks.end(), 0);
  if (o == Order::lifo) std::reverse(blocks.begin(), blocks.end());
  if (o == Order::random) std::shuffle(blocks.begin(), blocks.end(), rng);
  cudaError_t err = cudaSuccess;
  r.threads = ts.data();
  r.nthreads = threads;
  for (std::uint64_t b : blocks) {
    const uint3 bi{static_cast<unsigned>(b % shape.grid.x), static_cast<unsigned>((b / shape.grid.x) % shape.grid.y),
                   static_cast<unsigned>(b / (std::uint64_t{shape.grid.x} * shape.grid.y))};
    for (unsigned i = 0; i < threads; ++i) {
      ThreadState& t = ts[i];
      t.coords.thread_idx = uint3{i % shape.block.x, (i / shape.block.x) % shape.block.y, i / (shape.block.x * shape.block.y)};
      t.coords.block_idx = bi;
      t.coords.block_dim = shape.block;
      t.coords.grid_dim = shape.grid;
      t.linear = static_cast<int>(i);
      t.lane = static_cast<int>(i % 32);
      t.warp = static_cast<int>(i / 32);
    }
    for (WarpState& w : r.warps) w.live = 0;
    // Fresh dynamic shared memory reads as 0xFF bytes (a NaN in every float type), as device memory
    // does: a read of shared memory no thread wrote shows. Blocks run one after another, each after
    // the last (also for ThreadSanitizer: the __shared__ variables are reused by the next block, which
    // on a GPU has its own), so races between blocks are not reported.
    std::memset(aligned, 0xFF, shape.dynamic_smem);
#if ZINF_CUDAX_TSAN
    __tsan_release(&r.block_start);
#endif
    const std::string f = run_block(r, o, rng);
#if ZINF_CUDAX_TSAN
    __tsan_acquire(&r.block_end);
#endif
    if (!f.empty()) {
      report("kernel " + name + ": " + f);
      err = cudaErrorLaunchFailure;
      break;
    }
  }
  poison_tail(smem.data(), smem.size(), smem.size());  // back to the allocator as it was handed out
  tl_run = outer;
  tl_coords = outer_coords;
  return err;
}

}  // namespace zinf::cudax
