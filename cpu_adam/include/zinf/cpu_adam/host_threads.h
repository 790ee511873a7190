// zinf/cpu_adam/host_threads.h — the host worker threads that run Update, norm and conversion passes.
//
// A oneTBB task arena of a fixed size (default: the physical cores, from hwloc), optionally with each
// worker pinned to its own core. Work is split into chunks aligned to 1024 elements (4 KiB of fp32:
// whole cache lines and whole SIMD vectors on every path), so the chunking never changes a result.
// Calls may come from any thread, including the scheduler's workers; the arena bounds concurrency, so
// nested or concurrent calls share the same threads instead of oversubscribing the cores.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "zinf/cpu_adam/adam.h"

namespace zinf::cpu_adam {

class HostThreads {
 public:
  // threads = 0: the number of physical cores. pin: bind worker i to core i (hwloc).
  explicit HostThreads(int threads = 0, bool pin = false);
  ~HostThreads();
  HostThreads(const HostThreads&) = delete;
  HostThreads& operator=(const HostThreads&) = delete;

  int threads() const;
  // Runs fn(begin, end) over [0, n) in chunks of at least `grain` elements, rounded to 1024.
  // Exceptions thrown by fn reach the caller.
  void parallel_for(std::size_t n, std::size_t grain, const std::function<void(std::size_t, std::size_t)>& fn);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

int physical_cores();

// The fused Update over a large range, split across the pool (results identical to one call).
void adam_update(HostThreads& pool, const AdamStep& s, const UpdateChunk& c);
// Sum of squares over fixed 64 Ki-element blocks combined in block order: the result does not depend
// on the thread count (it equals sum_squares_blocked's serial result).
SumSquares sum_squares(HostThreads& pool, const void* grad, GradType t, std::size_t n);
// The per-block sums behind it, in block order (a data-parallel rank sums the blocks of its shard).
std::vector<double> sum_squares_parts(HostThreads& pool, const void* grad, GradType t, std::size_t n);
// The serial definition of the blocked sum (the reference for the pooled one).
SumSquares sum_squares_blocked(const void* grad, GradType t, std::size_t n);
constexpr std::size_t kNormBlock = std::size_t{1} << 16;
// fp32 ⇄ the 16-bit type `t` over n elements, split across the pool (results identical to one call).
void to_half(HostThreads& pool, const float* src, std::uint16_t* dst, std::size_t n, HalfType t);
void from_half(HostThreads& pool, const std::uint16_t* src, float* dst, std::size_t n, HalfType t);
// acc[i] += the fp32 value of src[i] (the 16-bit type `t`): from_half then an fp32 add, element by
// element, without the fp32 copy in memory (it goes through a small buffer in the cache).
void accumulate_half(HostThreads& pool, const std::uint16_t* src, float* acc, std::size_t n, HalfType t);

}  // namespace zinf::cpu_adam
