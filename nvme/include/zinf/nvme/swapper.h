// zinf/nvme/swapper.h — the pipelined swapper: stream items (tensor ranges) from the store through a
// fixed number of pinned buffers, reading ahead and writing behind, so that the read of item i+k,
// the processing of item i and the write of item i−1 overlap — DeepSpeed's pipeline_read /
// pipeline_write for optimizer sub-groups.
//
// The memory bound is structural: buffer_count buffers of buffer_bytes are taken from the pinned pool
// once, and an item waits for a free buffer; however many items are queued, nothing else is
// allocated. On an I/O error, run() waits for every transfer still in flight (so no buffer is reused
// under the kernel's feet) and then throws the first error.
// Not thread-safe: one run() at a time per Swapper.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "zinf/nvme/store.h"
#include "zinf/pinned.h"

namespace zinf::nvme {

struct SwapItem {
  TensorStore::Id id = 0;
  std::uint64_t offset = 0;  // aligned
  std::uint64_t len = 0;     // ≤ buffer_bytes
  bool read = true;          // false: the buffer starts with undefined contents (e.g. first init)
  bool write = true;         // false: read-only item, the buffer is released after processing
  std::int64_t write_offset = -1;  // aligned; where the buffer is written back (-1: `offset`)
};

class Swapper {
 public:
  Swapper(TensorStore& store, PinnedPool& pool, int buffer_count, std::size_t buffer_bytes);

  // process(i, buffer, len) runs on the caller's thread, in item order. `admit`, when given, is asked
  // before each item is processed (its read done): false stops the run there — the reads ahead are
  // waited for and dropped, the writes behind finished (their errors thrown), nothing more processed.
  void run(const std::vector<SwapItem>& items, const std::function<void(std::size_t, void*, std::size_t)>& process,
           int read_ahead = -1 /* default: buffer_count - 2, at least 1 */,
           const std::function<bool(std::size_t)>& admit = {});

  int buffer_count() const { return static_cast<int>(buffers_.size()); }
  std::size_t buffer_bytes() const { return buffer_bytes_; }
  int peak_buffers_in_use() const { return peak_; }

 private:
  TensorStore& store_;
  std::vector<PinnedBuffer> buffers_;
  std::size_t buffer_bytes_;
  int peak_ = 0;
};

}  // namespace zinf::nvme
