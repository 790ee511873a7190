// host_threads.cpp — oneTBB arena (+ optional hwloc pinning) for the host-side passes (host_threads.h).
#include "zinf/cpu_adam/host_threads.h"

#include <hwloc.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>
#include <tbb/task_scheduler_observer.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <thread>
#include <vector>

#include "kernels.h"
#include "zinf/cpu_adam/convert.h"
#include "zinf/error.h"

namespace zinf::cpu_adam {

namespace {
constexpr std::size_t kAlign = 1024;  // elements: 4 KiB of fp32, a multiple of every vector width and q8 block
static_assert(kAlign % kQ8Block == 0);

// Pins each thread that enters the arena to the next core, round-robin.
class PinningObserver : public tbb::task_scheduler_observer {
 public:
  PinningObserver(tbb::task_arena& arena, hwloc_topology_t topo)
      : tbb::task_scheduler_observer(arena), topo_(topo), cores_(hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE)) {
    observe(true);
  }
  ~PinningObserver() override { observe(false); }
  void on_scheduler_entry(bool) override {
    if (cores_ <= 0) return;
    const int idx = next_.fetch_add(1) % cores_;
    hwloc_obj_t core = hwloc_get_obj_by_type(topo_, HWLOC_OBJ_CORE, static_cast<unsigned>(idx));
    if (core && core->cpuset) hwloc_set_cpubind(topo_, core->cpuset, HWLOC_CPUBIND_THREAD);
  }

 private:
  hwloc_topology_t topo_;
  int cores_;
  std::atomic<int> next_{0};
};
}  // namespace

int physical_cores() {
  static const int n = [] {
    hwloc_topology_t topo;
    int cores = 0;
    if (hwloc_topology_init(&topo) == 0) {
      if (hwloc_topology_load(topo) == 0) {
        // The cores this process may run on (mpirun binds each rank to its own cores): more threads
        // than that would only share them, and oneTBB refuses them with a warning.
        hwloc_bitmap_t set = hwloc_bitmap_alloc();
        if (set && hwloc_get_cpubind(topo, set, HWLOC_CPUBIND_PROCESS) == 0)
          cores = hwloc_get_nbobjs_inside_cpuset_by_type(topo, set, HWLOC_OBJ_CORE);
        else
          cores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
        if (set) hwloc_bitmap_free(set);
      }
      hwloc_topology_destroy(topo);
    }
    if (cores <= 0) cores = static_cast<int>(std::thread::hardware_concurrency());
    return cores > 0 ? cores : 1;
  }();
  return n;
}

struct HostThreads::Impl {
  int threads;
  tbb::task_arena arena;
  hwloc_topology_t topo = nullptr;
  std::unique_ptr<PinningObserver> observer;
  Impl(int t, bool pin) : threads(t), arena(t) {
    arena.initialize();
    if (pin && hwloc_topology_init(&topo) == 0 && hwloc_topology_load(topo) == 0)
      observer = std::make_unique<PinningObserver>(arena, topo);
  }
  ~Impl() {
    observer.reset();
    if (topo) hwloc_topology_destroy(topo);
  }
};

HostThreads::HostThreads(int threads, bool pin) {
  ZINF_CHECK(threads >= 0);
  impl_ = std::make_unique<Impl>(threads == 0 ? physical_cores() : threads, pin);
}
HostThreads::~HostThreads() = default;
int HostThreads::threads() const { return impl_->threads; }

void HostThreads::parallel_for(std::size_t n, std::size_t grain,
                               const std::function<void(std::size_t, std::size_t)>& fn) {
  if (n == 0) return;
  grain = std::max<std::size_t>(kAlign, (grain + kAlign - 1) / kAlign * kAlign);
  const std::size_t chunks = (n + grain - 1) / grain;
  if (chunks == 1 || impl_->threads == 1) {
    fn(0, n);
    return;
  }
  impl_->arena.execute([&] {
    tbb::parallel_for(
        tbb::blocked_range<std::size_t>(0, chunks, 1),
        [&](const tbb::blocked_range<std::size_t>& r) { fn(r.begin() * grain, std::min(n, r.end() * grain)); },
        tbb::simple_partitioner());
  });
}

namespace {
UpdateChunk sub_chunk(const UpdateChunk& c, std::size_t b, std::size_t e) {
  UpdateChunk s = c;
  s.n = e - b;
  const std::size_t gsz = c.grad_type == GradType::fp32 ? 4 : 2;
  s.grad = static_cast<const char*>(c.grad) + b * gsz;
  s.master = c.master + b;
  const std::size_t esz = state_elem_bytes(c.states);
  s.m = static_cast<char*>(c.m) + b * esz;
  s.v = static_cast<char*>(c.v) + b * esz;
  if (c.states == StateFormat::q8) {  // b is a multiple of kAlign, itself a multiple of kQ8Block
    s.m_scale = c.m_scale + b / kQ8Block;
    s.v_scale = c.v_scale + b / kQ8Block;
  }
  if (c.param16) s.param16 = static_cast<std::uint16_t*>(c.param16) + b;
  return s;
}
const void* grad_at(const void* g, GradType t, std::size_t i) {
  return static_cast<const char*>(g) + i * (t == GradType::fp32 ? 4 : 2);
}
}  // namespace

void adam_update(HostThreads& pool, const AdamStep& s, const UpdateChunk& c) {
  // Elementwise: any split gives the same bits. Chunks of ≥ 64 Ki elements amortise scheduling.
  const SimdLevel level = active_simd();
  const std::size_t grain =
      std::max<std::size_t>(std::size_t{1} << 16, c.n / (4 * static_cast<std::size_t>(pool.threads())));
  pool.parallel_for(c.n, grain, [&](std::size_t b, std::size_t e) { adam_update(s, sub_chunk(c, b, e), level); });
}

SumSquares sum_squares_blocked(const void* grad, GradType t, std::size_t n) {
  double sum = 0;
  for (std::size_t b = 0; b < n; b += kNormBlock)
    sum += sum_squares(grad_at(grad, t, b), t, std::min(kNormBlock, n - b)).sum;
  return {sum, std::isfinite(sum)};
}

std::vector<double> sum_squares_parts(HostThreads& pool, const void* grad, GradType t, std::size_t n) {
  const std::size_t blocks = (n + kNormBlock - 1) / kNormBlock;
  std::vector<double> part(blocks);
  const SimdLevel level = active_simd();
  pool.parallel_for(blocks * kAlign, kAlign, [&](std::size_t b, std::size_t e) {
    for (std::size_t blk = b / kAlign; blk < e / kAlign; ++blk) {
      const std::size_t off = blk * kNormBlock;
      part[blk] = sum_squares(grad_at(grad, t, off), t, std::min(kNormBlock, n - off), level).sum;
    }
  });
  return part;
}

SumSquares sum_squares(HostThreads& pool, const void* grad, GradType t, std::size_t n) {
  double sum = 0;
  for (double p : sum_squares_parts(pool, grad, t, n)) sum += p;  // fixed block order: independent of the thread count
  return {sum, std::isfinite(sum)};
}

void to_half(HostThreads& pool, const float* src, std::uint16_t* dst, std::size_t n, HalfType t) {
  pool.parallel_for(n, 1 << 16, [&](std::size_t b, std::size_t e) {
    if (t == HalfType::fp16)
      fp32_to_fp16(src + b, dst + b, e - b);
    else
      fp32_to_bf16(src + b, dst + b, e - b);
  });
}

void accumulate_half(HostThreads& pool, const std::uint16_t* src, float* acc, std::size_t n, HalfType t) {
  pool.parallel_for(n, 1 << 16, [&](std::size_t b, std::size_t e) {
    constexpr std::size_t kPiece = 2048;  // 8 KiB of fp32: stays in L1 between the two loops
    alignas(64) float x[kPiece];
    for (std::size_t p = b; p < e; p += kPiece) {
      const std::size_t len = std::min(kPiece, e - p);
      if (t == HalfType::fp16)
        fp16_to_fp32(src + p, x, len);
      else
        bf16_to_fp32(src + p, x, len);
      float* a = acc + p;
      for (std::size_t i = 0; i < len; ++i) a[i] += x[i];
    }
  });
}

void from_half(HostThreads& pool, const std::uint16_t* src, float* dst, std::size_t n, HalfType t) {
  pool.parallel_for(n, 1 << 16, [&](std::size_t b, std::size_t e) {
    if (t == HalfType::fp16)
      fp16_to_fp32(src + b, dst + b, e - b);
    else
      bf16_to_fp32(src + b, dst + b, e - b);
  });
}

}  // namespace zinf::cpu_adam
