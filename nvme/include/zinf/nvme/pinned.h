// zinf/nvme/pinned.h — one bounded pool of page-locked host memory for all staging.
//
// One slab is allocated up front (posix_memalign, then mlock unless pinning is off) and carved into
// 4 KiB-aligned blocks on request; the pool never grows, so pinned memory can never exceed what was
// asked for — the failure DeepSpeed's users keep hitting (host OOM from swap buffers) cannot happen
// here. The CUDA device (issue 8) registers the same slab with cudaHostRegister.
// Thread-safe: acquire/release from any thread.
#pragma once

#include <sys/uio.h>

#include <condition_variable>
#include <cstddef>
#include <map>
#include <mutex>
#include <string>

namespace zinf::nvme {

class PinnedPool;

// A block of the pool; returned to it on destruction. Move-only.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(PinnedBuffer&& o) noexcept { *this = std::move(o); }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() { reset(); }
  void reset();
  void* data() const { return data_; }
  std::size_t size() const { return size_; }
  explicit operator bool() const { return data_ != nullptr; }

 private:
  friend class PinnedPool;
  PinnedPool* pool_ = nullptr;
  void* data_ = nullptr;
  std::size_t size_ = 0;
};

class PinnedPool {
 public:
  // Throws zinf::Error when the memory cannot be allocated or locked (naming RLIMIT_MEMLOCK and the
  // fix). lock = false gives pageable memory with the same bound (pin_memory: false).
  explicit PinnedPool(std::size_t capacity_bytes, bool lock = true);
  ~PinnedPool();
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  // A block of at least `bytes` (rounded up to 4 KiB), 4 KiB aligned. With wait = false an exhausted
  // pool throws zinf::Error; with wait = true the call blocks until enough is released.
  PinnedBuffer acquire(std::size_t bytes, bool wait = false);

  std::size_t capacity() const { return capacity_; }
  std::size_t in_use() const;
  std::size_t peak() const;
  bool locked() const { return locked_; }
  iovec slab() const { return {base_, capacity_}; }

  static constexpr std::size_t kAlign = 4096;

 private:
  friend class PinnedBuffer;
  void release(void* p, std::size_t bytes);

  char* base_ = nullptr;
  std::size_t capacity_ = 0;
  bool locked_ = false;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::size_t, std::size_t> free_;  // offset -> length, coalesced
  std::size_t in_use_ = 0, peak_ = 0;
};

// The RLIMIT_MEMLOCK soft limit in bytes (SIZE_MAX when unlimited or when running with CAP_IPC_LOCK).
std::size_t lockable_bytes();

}  // namespace zinf::nvme
