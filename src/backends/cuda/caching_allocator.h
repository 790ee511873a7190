// caching_allocator.h — the device memory allocator of the CUDA device, in plain C++ so its logic is
// tested on the CPU (tests/backends/caching_allocator_test.cpp) with a fake raw allocator.
//
// Requests are rounded (cuda_block_bytes: 512 B granules below 1 MiB, 2 MiB granules from 1 MiB)
// and served from a cache of freed blocks of the same rounded size; a miss takes a new block from
// the raw allocator (cudaMalloc). The budget bounds what is *reserved* (cached + in use): when a new block would cross
// it, the cache is released first, and if it still would, the request fails with an error naming
// the allocation and the budget — never an out-of-memory abort. Peak in-use bytes are tracked.
// Thread-safe.
//
// On the CPU executor under AddressSanitizer (where device memory is host memory) it also marks what
// no buffer may touch: the bytes of a block past the request, and a freed block while it waits in the
// cache. So a kernel or copy past its buffer's end, or one still queued on a buffer already freed
// (this cache is not stream-ordered: the block may be handed out again at once), is reported.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "zinf/device.h"
#include "zinf/device_memory.h"
#include "zinf/backends/sysinfo.h"

#if defined(ZINF_CUDA_EXECUTOR) && defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define ZINF_POISON_DEVICE_MEMORY 1
#else
#define ZINF_POISON_DEVICE_MEMORY 0
#endif

namespace zinf::cuda {

class CachingAllocator {
 public:
  using RawAlloc = std::function<void*(std::size_t)>;  // returns nullptr on failure
  using RawFree = std::function<void(void*)>;

  CachingAllocator(std::size_t budget, RawAlloc raw_alloc, RawFree raw_free)
      : budget_(budget), alloc_(std::move(raw_alloc)), free_(std::move(raw_free)) {}
  ~CachingAllocator() { release_cache(); }
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // The block a request takes (zinf/device_memory.h: the plan counts device memory by the same rule).
  static std::size_t round(std::size_t bytes) { return static_cast<std::size_t>(cuda_block_bytes(bytes)); }

  void* allocate(std::size_t bytes, const std::string& what) {
    const std::size_t size = round(bytes);
    std::lock_guard<std::mutex> lk(mu_);
    void* p = nullptr;
    auto it = cache_.find(size);
    if (it != cache_.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
      cached_ -= size;
    } else {
      if (reserved_ + size > budget_) release_cache_locked();
      if (reserved_ + size > budget_) throw over_budget_error(what, bytes, in_use_, budget_);
      p = alloc_(size);
      if (!p) {
        release_cache_locked();
        p = alloc_(size);
      }
      if (!p) throw DeviceMemoryError("the device could not allocate " + format_bytes(size) + " for " + what);
      reserved_ += size;
    }
    sizes_[p] = size;
#if ZINF_POISON_DEVICE_MEMORY
    ASAN_UNPOISON_MEMORY_REGION(p, bytes);
    ASAN_POISON_MEMORY_REGION(static_cast<unsigned char*>(p) + bytes, size - bytes);
#endif
    in_use_ += size;
    peak_ = std::max(peak_, in_use_);
    return p;
  }

  void free(void* p) {
    if (!p) return;
    std::lock_guard<std::mutex> lk(mu_);
    auto it = sizes_.find(p);
    ZINF_CHECK(it != sizes_.end());
    in_use_ -= it->second;
    cached_ += it->second;
#if ZINF_POISON_DEVICE_MEMORY
    ASAN_POISON_MEMORY_REGION(p, it->second);
#endif
    cache_[it->second].push_back(p);
    sizes_.erase(it);
  }

  void release_cache() {
    std::lock_guard<std::mutex> lk(mu_);
    release_cache_locked();
  }

  std::size_t budget() const { return budget_; }
  std::size_t in_use() const { return read_locked(in_use_); }
  std::size_t peak() const { return read_locked(peak_); }
  std::size_t reserved() const { return read_locked(reserved_); }
  std::size_t cached() const { return read_locked(cached_); }

 private:
  std::size_t read_locked(const std::size_t& counter) const {  // the counters change under the lock
    std::lock_guard<std::mutex> lk(mu_);
    return counter;
  }
  void release_cache_locked() {
    for (auto& [size, blocks] : cache_) {
      for (void* b : blocks) {
#if ZINF_POISON_DEVICE_MEMORY
        ASAN_UNPOISON_MEMORY_REGION(b, size);
#endif
        free_(b);
      }
      reserved_ -= size * blocks.size();
      blocks.clear();
    }
    cached_ = 0;
  }

  std::size_t budget_;
  RawAlloc alloc_;
  RawFree free_;
  mutable std::mutex mu_;
  std::map<std::size_t, std::vector<void*>> cache_;
  std::unordered_map<void*, std::size_t> sizes_;
  std::size_t in_use_ = 0, reserved_ = 0, cached_ = 0, peak_ = 0;
};

}  // namespace zinf::cuda
