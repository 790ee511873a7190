// caching_allocator_test.cpp — the CUDA device's allocator logic, on the CPU with a fake raw
// allocator: rounding, reuse, the budget over reserved bytes, releasing the cache under pressure,
// errors that name the allocation, and peak accounting.
#include <gtest/gtest.h>

#include <cstdlib>
#include <set>

#include "cuda/caching_allocator.h"

namespace zinf::cuda {
namespace {

struct FakeRaw {
  std::size_t live = 0, calls = 0, frees = 0;
  std::set<void*> blocks;
  bool fail = false;
  CachingAllocator make(std::size_t budget) {
    return CachingAllocator(
        budget,
        [this](std::size_t n) -> void* {
          ++calls;
          if (fail) return nullptr;
          void* p = std::malloc(n);
          blocks.insert(p);
          live += n;
          return p;
        },
        [this](void* p) {
          ++frees;
          blocks.erase(p);
          std::free(p);
        });
  }
};

TEST(CachingAllocator, RoundsAndReusesFreedBlocks) {
  EXPECT_EQ(CachingAllocator::round(1), 512u);
  EXPECT_EQ(CachingAllocator::round(513), 1024u);
  EXPECT_EQ(CachingAllocator::round((1u << 20) + 1), 2u << 20);
  FakeRaw raw;
  {
    CachingAllocator a = raw.make(64 << 20);
    void* p = a.allocate(1000, "x");
    a.free(p);
    void* q = a.allocate(900, "y");  // same 1024-byte class: the cached block comes back
    EXPECT_EQ(p, q);
    EXPECT_EQ(raw.calls, 1u);
    EXPECT_EQ(a.in_use(), 1024u);
    EXPECT_EQ(a.cached(), 0u);
    a.free(q);
    EXPECT_EQ(a.cached(), 1024u);
  }
  EXPECT_TRUE(raw.blocks.empty());  // the destructor returns everything
}

// The allocator rounds by the plain rule the plan counts with (zinf/device_memory.h), at and around
// every boundary.
TEST(CachingAllocator, RoundsByThePlansRule) {
  EXPECT_EQ(cuda_block_bytes(0), 512u);
  EXPECT_EQ(cuda_block_bytes(512), 512u);
  EXPECT_EQ(cuda_block_bytes((1u << 20) - 1), 1u << 20);
  EXPECT_EQ(cuda_block_bytes(1u << 20), 2u << 20);
  EXPECT_EQ(cuda_block_bytes((2u << 20) + 1), 4u << 20);
  EXPECT_EQ(cuda_block_bytes(8u << 20), 8u << 20);
  for (std::size_t b :
       {std::size_t{0}, std::size_t{1}, std::size_t{511}, std::size_t{513}, std::size_t{(1u << 20) - 1},
        std::size_t{1u << 20}, std::size_t{(1u << 20) + 1}, std::size_t{3u << 20}, std::size_t{5000000}})
    EXPECT_EQ(CachingAllocator::round(b), cuda_block_bytes(b)) << b;
  FakeRaw raw;
  CachingAllocator a = raw.make(64 << 20);
  void* p = a.allocate(3'000'000, "x");
  EXPECT_EQ(a.in_use(), cuda_block_bytes(3'000'000));  // what the plan's device line counts
  a.free(p);
}

TEST(CachingAllocator, BudgetBoundsReservedBytesAndReleasesTheCacheFirst) {
  FakeRaw raw;
  CachingAllocator a = raw.make(8 << 20);
  void* big = a.allocate(6 << 20, "activations");
  a.free(big);                                   // 6 MiB cached
  void* other = a.allocate(4 << 20, "weights");  // 6 + 4 > 8: the cache is released, then it fits
  EXPECT_EQ(raw.frees, 1u);
  EXPECT_EQ(a.reserved(), 4u << 20);
  try {
    a.allocate(6 << 20, "block.3 grads");
    FAIL();
  } catch (const DeviceMemoryError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("block.3 grads"), std::string::npos) << m;
    EXPECT_NE(m.find("8.00 MiB"), std::string::npos) << m;
  }
  a.free(other);
  EXPECT_EQ(a.peak(), 6u << 20);
}

TEST(CachingAllocator, RawFailureIsAnErrorNotACrash) {
  FakeRaw raw;
  CachingAllocator a = raw.make(1u << 30);
  raw.fail = true;
  EXPECT_THROW(a.allocate(1 << 20, "x"), DeviceMemoryError);
  EXPECT_EQ(a.in_use(), 0u);
}

}  // namespace
}  // namespace zinf::cuda
