// device_memory.cpp — where the executor's device memory lives, and the guard that keeps host code
// out of it.
//
// On a GPU, host code that dereferences a device pointer faults. On the executor device memory is
// host memory, so such a read or write would go unnoticed; the guard makes it fault here too. Every
// cudaMalloc allocation comes from one arena, a reserved range of address space, that only device
// work may touch: a kernel, a copy, a memset, a library fake's work (everything that runs through
// zinf::cudax::enqueue), and the runtime's own accesses (the 0xFF fill of fresh memory). Those run
// inside a DeviceAccess scope; a host read or write of the arena outside one raises SIGSEGV, and
// the handler here prints one line naming the access (read or write, the address, the allocation
// and offset) and a backtrace, then aborts.
//
// Two ways to close the arena, chosen once per process (ZINF_CUDAX_GUARD: auto, the default, takes
// the first that works):
//   pkey   x86 protection keys: the arena carries a key of its own that every thread's PKRU denies;
//          a DeviceAccess scope allows it on its own thread only (WRPKRU, a few cycles). Exact: a host
//          access faults even while other threads run device work.
//   arena  no protection keys (the CPU or kernel lacks them): the arena is PROT_NONE whenever no
//          device work is running anywhere in the process, and PROT_READ|PROT_WRITE while any is
//          (a count of open scopes; one mprotect of the whole arena when it goes 0 -> 1 and 1 -> 0).
//          A host access made while device work runs on another thread is not caught.
//   off    the arena stays readable and writable (the executor as it was; a mutation check, or a
//          baseline for the guard's cost).
// Pinned and registered host memory is host memory and is never guarded.
#include <execinfo.h>
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include "cudax/runtime.h"
#include "internal.h"

namespace zinf::cudax {

namespace {

constexpr std::size_t kGranule = 256;  // cudaMalloc's alignment, and the arena's unit
constexpr std::size_t kHugePage = std::size_t{2} << 20;

struct Arena {
  std::once_flag once;
  Guard guard = Guard::off;
  int pkey = -1;
  unsigned char* base = nullptr;
  std::size_t bytes = 0;
  std::mutex mu;  // the free lists and, in arena mode, the open count and the protection
  std::map<std::size_t, std::size_t> free_at;             // offset -> length
  std::set<std::pair<std::size_t, std::size_t>> by_size;  // (length, offset)
  int open = 0;                                           // arena mode: scopes open in the process
  struct sigaction previous {};
};
Arena g_arena;
thread_local int tl_depth = 0;  // DeviceAccess scopes open on this thread

std::atomic<std::uint64_t> g_transitions{0};

[[noreturn]] void die(const char* what) {
  report(std::string("device memory arena: ") + what + ": " + std::strerror(errno));
  std::abort();
}

// Async-signal-safe output: the handler formats with these only.
void put(const char* s) {
  const std::size_t n = std::strlen(s);
  std::size_t done = 0;
  while (done < n) {
    const ssize_t w = ::write(2, s + done, n - done);
    if (w <= 0) return;
    done += static_cast<std::size_t>(w);
  }
}

void on_segv(int sig, siginfo_t* si, void* context) {
  Arena& a = g_arena;
  const auto addr = reinterpret_cast<std::uintptr_t>(si->si_addr);
  const auto base = reinterpret_cast<std::uintptr_t>(a.base);
  const bool ours = a.base && addr >= base && addr < base + a.bytes &&
                    (si->si_code == SEGV_ACCERR
#ifdef SEGV_PKUERR
                     || si->si_code == SEGV_PKUERR
#endif
                    );
  if (ours) {
    // The page fault's error code: bit 1 is set for a write.
    const auto* uc = static_cast<const ucontext_t*>(context);
    const bool write = (uc->uc_mcontext.gregs[REG_ERR] & 2) != 0;
    char where[160];
    describe_device_address(addr, where, sizeof where);
    char line[320];
    std::snprintf(line, sizeof line,
                  "cudax: host code %s device memory at %p (%s); on a GPU a host access to device memory faults: "
                  "copy it with cudaMemcpy, or use pinned memory\n",
                  write ? "writes" : "reads", si->si_addr, where);
    put(line);
    void* frames[48];
    const int n = backtrace(frames, 48);
    backtrace_symbols_fd(frames, n, 2);
    signal(SIGABRT, SIG_DFL);
    std::abort();
  }
  // Not ours: whoever handled SIGSEGV before (a sanitizer, a test framework), or the default action.
  const struct sigaction& p = a.previous;
  if (p.sa_flags & SA_SIGINFO) {
    if (p.sa_sigaction) return p.sa_sigaction(sig, si, context);
  } else if (p.sa_handler != SIG_DFL && p.sa_handler != SIG_IGN) {
    return p.sa_handler(sig);
  }
  signal(SIGSEGV, SIG_DFL);  // returning re-runs the access, which now ends the process
}

Guard choose_guard() {
  const char* v = std::getenv("ZINF_CUDAX_GUARD");
  const std::string s = v ? v : "auto";
  if (s == "off") return Guard::off;
  if (s == "arena") return Guard::arena;
  if (s != "auto" && s != "pkey" && !s.empty())
    report("ZINF_CUDAX_GUARD=" + s + " is not auto, pkey, arena or off; using auto");
  return Guard::pkey;  // tried first; init falls back to arena where the machine has no keys
}

void init(Arena& a) {
  // Room for the whole budget twice over (fragmentation), reserved, never committed up front.
  a.bytes = (memory_budget() * 2 + (std::size_t{1} << 30) + kGranule - 1) / kGranule * kGranule;
  // 2 MiB aligned and in huge pages where the system allows: an mprotect of the arena then changes
  // one page-table entry per 2 MiB in use instead of one per 4 KiB.
  void* m = mmap(nullptr, a.bytes + kHugePage, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) die("cannot reserve the address space");
  a.base = reinterpret_cast<unsigned char*>((reinterpret_cast<std::uintptr_t>(m) + kHugePage - 1) & ~(kHugePage - 1));
  madvise(a.base, a.bytes, MADV_HUGEPAGE);
  a.free_at.emplace(0, a.bytes);
  a.by_size.emplace(a.bytes, 0);
  a.guard = choose_guard();
  if (a.guard == Guard::pkey) {
    a.pkey = pkey_alloc(0, PKEY_DISABLE_ACCESS);
    if (a.pkey < 0) {
      if (const char* v = std::getenv("ZINF_CUDAX_GUARD"); v && std::string(v) == "pkey")
        report("ZINF_CUDAX_GUARD=pkey: this machine has no protection keys; guarding device memory with mprotect");
      a.guard = Guard::arena;
    } else if (pkey_mprotect(a.base, a.bytes, PROT_READ | PROT_WRITE, a.pkey) != 0) {
      die("pkey_mprotect");
    }
  }
  if (a.guard == Guard::off && mprotect(a.base, a.bytes, PROT_READ | PROT_WRITE) != 0) die("mprotect");
  if (a.guard != Guard::off) {
    void* warm[1];
    backtrace(warm, 1);  // loads the unwinder now, so that the handler allocates nothing
    struct sigaction sa {};
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGSEGV, &sa, &a.previous) != 0) die("sigaction");
  }
}

Arena& arena() {
  std::call_once(g_arena.once, [] { init(g_arena); });
  return g_arena;
}

void set_access(Arena& a, int prot) {
  if (mprotect(a.base, a.bytes, prot) != 0) die("mprotect");
  g_transitions.fetch_add(1, std::memory_order_relaxed);
}

void take(Arena& a, std::size_t off, std::size_t len) {
  a.by_size.erase({len, off});
  a.free_at.erase(off);
}
void give(Arena& a, std::size_t off, std::size_t len) {
  a.free_at.emplace(off, len);
  a.by_size.emplace(len, off);
}

}  // namespace

Guard guard() { return arena().guard; }
std::uint64_t guard_transitions() { return g_transitions.load(); }

bool in_device_arena(const void* p) {
  const Arena& a = g_arena;
  const auto x = reinterpret_cast<std::uintptr_t>(p), b = reinterpret_cast<std::uintptr_t>(a.base);
  return a.base && x >= b && x < b + a.bytes;
}

DeviceAccess::DeviceAccess() {
  if (tl_depth++ > 0) return;
  Arena& a = arena();
  switch (a.guard) {
    case Guard::pkey: pkey_set(a.pkey, 0); break;
    case Guard::arena: {
      std::lock_guard<std::mutex> g(a.mu);
      if (a.open++ == 0) set_access(a, PROT_READ | PROT_WRITE);
      break;
    }
    case Guard::off: break;
  }
}

DeviceAccess::~DeviceAccess() {
  if (--tl_depth > 0) return;
  Arena& a = g_arena;
  switch (a.guard) {
    case Guard::pkey: pkey_set(a.pkey, PKEY_DISABLE_ACCESS); break;
    case Guard::arena: {
      std::lock_guard<std::mutex> g(a.mu);
      if (--a.open == 0) set_access(a, PROT_NONE);
      break;
    }
    case Guard::off: break;
  }
}

void* device_memory_allocate(std::size_t bytes) {
  Arena& a = arena();
  const std::size_t len = (bytes + kGranule - 1) / kGranule * kGranule;
  std::lock_guard<std::mutex> g(a.mu);
  const auto it = a.by_size.lower_bound({len, 0});  // the smallest free range that fits, lowest first
  if (it == a.by_size.end()) return nullptr;
  const auto [have, off] = *it;
  take(a, off, have);
  if (have > len) give(a, off + len, have - len);
  return a.base + off;
}

void device_memory_free(void* p, std::size_t bytes) {
  Arena& a = g_arena;
  std::size_t off = static_cast<std::size_t>(static_cast<unsigned char*>(p) - a.base);
  std::size_t len = (bytes + kGranule - 1) / kGranule * kGranule;
#if ZINF_CUDAX_ASAN
  ASAN_POISON_MEMORY_REGION(p, len);  // a use after cudaFree is reported, as the heap's would be
#endif
  // The whole huge pages of a large freed range go back to the system (read as zeros when handed
  // out again, then filled with 0xFF by cudaMalloc).
  const std::size_t lo = (off + kHugePage - 1) / kHugePage * kHugePage, hi = (off + len) / kHugePage * kHugePage;
  if (hi > lo) madvise(a.base + lo, hi - lo, MADV_DONTNEED);
  std::lock_guard<std::mutex> g(a.mu);
  auto next = a.free_at.lower_bound(off);
  if (next != a.free_at.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      off = prev->first;
      len += prev->second;
      take(a, prev->first, prev->second);
    }
  }
  next = a.free_at.lower_bound(off + len);
  if (next != a.free_at.end() && next->first == off + len) {
    len += next->second;
    take(a, next->first, next->second);
  }
  give(a, off, len);
}

}  // namespace zinf::cudax
