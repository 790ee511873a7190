// zinf/pinned.h — one bounded pool of page-locked host memory for all staging: NVMe transfers, the
// gradient landing buffers, the update upload slots, parameter homes. A leaf that knows nothing of
// NVMe, devices or models; header-only so that every layer can use it (nvme and offload do).
//
// One slab is allocated up front (posix_memalign, then mlock unless pinning is off) and carved into
// 4 KiB-aligned blocks on request; the pool never grows, so pinned memory can never exceed what was
// asked for — the failure DeepSpeed's users keep hitting (host OOM from swap buffers) cannot happen
// here. The CUDA device registers the same slab with cudaHostRegister.
// Thread-safe: acquire/release from any thread.
#pragma once

#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "zinf/error.h"

namespace zinf {

class PinnedPool;

// A block of the pool; returned to it on destruction. Move-only.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(PinnedBuffer&& o) noexcept
      : pool_(std::exchange(o.pool_, nullptr)),
        data_(std::exchange(o.data_, nullptr)),
        size_(std::exchange(o.size_, 0)) {}
  inline PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() { reset(); }
  inline void reset();
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
inline std::size_t lockable_bytes();

// ---- implementation -----------------------------------------------------------------------------

inline std::size_t lockable_bytes() {
  if (::geteuid() == 0) return SIZE_MAX;  // CAP_IPC_LOCK: not bound by RLIMIT_MEMLOCK
  rlimit rl{};
  if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return SIZE_MAX;
  return static_cast<std::size_t>(rl.rlim_cur);
}

// Takes o's block; the one this held goes back to its pool with `taken` (a self-move keeps it).
inline PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  PinnedBuffer taken(std::move(o));
  std::swap(pool_, taken.pool_);
  std::swap(data_, taken.data_);
  std::swap(size_, taken.size_);
  return *this;
}

inline void PinnedBuffer::reset() {
  if (pool_ && data_) pool_->release(data_, size_);
  pool_ = nullptr;
  data_ = nullptr;
  size_ = 0;
}

inline PinnedPool::PinnedPool(std::size_t capacity_bytes, bool lock) {
  capacity_ = (capacity_bytes + kAlign - 1) / kAlign * kAlign;
  if (capacity_ == 0) return;
  if (lock && capacity_ > lockable_bytes())
    throw Error("pinned pool: " + std::to_string(capacity_) + " bytes exceed the locked-memory limit (RLIMIT_MEMLOCK " +
                    std::to_string(lockable_bytes()) + " bytes)",
                "raise it with `ulimit -l unlimited` or a memlock line in /etc/security/limits.conf, shrink the "
                "buffers (buffer_count, sub_group_size), or set pin_memory: false");
  void* p = nullptr;
  if (int rc = ::posix_memalign(&p, kAlign, capacity_); rc != 0)
    throw Error("pinned pool: cannot allocate " + std::to_string(capacity_) + " bytes: " + std::strerror(rc));
  base_ = static_cast<char*>(p);
  if (lock) {
    if (::mlock(base_, capacity_) != 0) {
      const int e = errno;
      std::free(base_);
      base_ = nullptr;
      throw Error("pinned pool: mlock of " + std::to_string(capacity_) + " bytes failed: " + std::strerror(e),
                  "raise the locked-memory limit (`ulimit -l`), shrink the buffers, or set pin_memory: false");
    }
    locked_ = true;
  }
  free_[0] = capacity_;
}

inline PinnedPool::~PinnedPool() {
  if (!base_) return;
  if (locked_) ::munlock(base_, capacity_);
  std::free(base_);
}

inline PinnedBuffer PinnedPool::acquire(std::size_t bytes, bool wait) {
  const std::size_t need = std::max<std::size_t>(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
  std::unique_lock<std::mutex> lk(mu_);
  while (true) {
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < need) continue;
      const std::size_t off = it->first, len = it->second;
      free_.erase(it);
      if (len > need) free_[off + need] = len - need;
      in_use_ += need;
      peak_ = std::max(peak_, in_use_);
      PinnedBuffer b;
      b.pool_ = this;
      b.data_ = base_ + off;
      b.size_ = need;
      return b;
    }
    if (!wait || need > capacity_)
      throw Error("pinned pool exhausted: need " + std::to_string(need) + " bytes, " +
                  std::to_string(capacity_ - in_use_) + " of " + std::to_string(capacity_) + " free");
    cv_.wait(lk);
  }
}

inline void PinnedPool::release(void* p, std::size_t bytes) {
  std::lock_guard<std::mutex> lk(mu_);
  std::size_t off = static_cast<std::size_t>(static_cast<char*>(p) - base_), len = bytes;
  auto next = free_.lower_bound(off);
  if (next != free_.end() && off + len == next->first) {  // merge with the following block
    len += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {  // merge with the preceding block
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      off = prev->first;
      len += prev->second;
      free_.erase(prev);
    }
  }
  free_[off] = len;
  in_use_ -= bytes;
  cv_.notify_all();
}

inline std::size_t PinnedPool::in_use() const {
  std::lock_guard<std::mutex> lk(mu_);
  return in_use_;
}
inline std::size_t PinnedPool::peak() const {
  std::lock_guard<std::mutex> lk(mu_);
  return peak_;
}

}  // namespace zinf
