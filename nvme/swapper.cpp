// swapper.cpp — read-ahead / process / write-behind over a fixed set of pinned buffers.
#include "zinf/nvme/swapper.h"

#include <deque>
#include <exception>

#include "zinf/error.h"

namespace zinf::nvme {

Swapper::Swapper(TensorStore& store, PinnedPool& pool, int buffer_count, std::size_t buffer_bytes)
    : store_(store), buffer_bytes_(store.padded(buffer_bytes)) {
  ZINF_CHECK(buffer_count >= 1);
  for (int i = 0; i < buffer_count; ++i) buffers_.push_back(pool.acquire(buffer_bytes_));
}

void Swapper::run(const std::vector<SwapItem>& items,
                  const std::function<void(std::size_t, void*, std::size_t)>& process, int read_ahead,
                  const std::function<bool(std::size_t)>& admit) {
  const int nbuf = buffer_count();
  if (read_ahead < 0) read_ahead = std::max(1, nbuf - 2);
  for (const auto& it : items) {
    if (store_.padded(it.len) > buffer_bytes_)
      throw Error("swapper: item of " + std::to_string(it.len) + " bytes does not fit a " +
                  std::to_string(buffer_bytes_) + "-byte buffer");
  }
  std::vector<int> free_bufs;
  for (int b = nbuf - 1; b >= 0; --b) free_bufs.push_back(b);
  struct Pending {
    std::size_t item;
    int buf;
    IoHandle io;  // null when nothing to wait for (item without read)
  };
  std::deque<Pending> reads, writes;
  std::size_t next_read = 0;
  int in_use = 0;
  std::exception_ptr failure;

  auto finish_write = [&](Pending& p) {
    try {
      if (p.io) p.io->wait();
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
    free_bufs.push_back(p.buf);
    --in_use;
  };
  auto drain = [&] {  // wait for everything in flight; buffers are ours again afterwards
    for (auto& p : reads) try {
        if (p.io) p.io->wait();
      } catch (...) {
      }
    for (auto& p : writes) finish_write(p);
    reads.clear();
    writes.clear();
  };

  try {
    for (std::size_t i = 0; i < items.size(); ++i) {
      // Issue reads up to read_ahead items beyond i, reclaiming buffers from finished writes.
      while (next_read < items.size() && next_read <= i + static_cast<std::size_t>(read_ahead)) {
        while (!writes.empty() && writes.front().io && writes.front().io->done()) {
          finish_write(writes.front());
          writes.pop_front();
        }
        if (free_bufs.empty()) {
          if (next_read > i) break;  // the item we need now must get a buffer: wait for the oldest write
          ZINF_CHECK(!writes.empty());
          finish_write(writes.front());
          writes.pop_front();
          if (failure) std::rethrow_exception(failure);
        }
        const int b = free_bufs.back();
        free_bufs.pop_back();
        peak_ = std::max(peak_, ++in_use);
        const SwapItem& it = items[next_read];
        IoHandle io =
            it.read ? store_.read(it.id, buffers_[static_cast<std::size_t>(b)].data(), it.offset, it.len) : nullptr;
        reads.push_back({next_read, b, io});
        ++next_read;
      }
      Pending p = reads.front();
      reads.pop_front();
      if (p.io) p.io->wait();
      if (admit && !admit(i)) {  // stop here: drop the reads ahead, finish the writes behind
        for (auto& r : reads) try {
            if (r.io) r.io->wait();
          } catch (...) {
          }
        reads.clear();
        while (!writes.empty()) {
          finish_write(writes.front());
          writes.pop_front();
        }
        if (failure) std::rethrow_exception(failure);
        return;
      }
      const SwapItem& it = items[i];
      process(i, buffers_[static_cast<std::size_t>(p.buf)].data(), static_cast<std::size_t>(it.len));
      if (it.write) {
        writes.push_back(
            {i, p.buf,
             store_.write(it.id, buffers_[static_cast<std::size_t>(p.buf)].data(),
                          it.write_offset < 0 ? it.offset : static_cast<std::uint64_t>(it.write_offset), it.len)});
      } else {
        free_bufs.push_back(p.buf);
        --in_use;
      }
      if (failure) std::rethrow_exception(failure);
    }
    while (!writes.empty()) {
      finish_write(writes.front());
      writes.pop_front();
    }
    if (failure) std::rethrow_exception(failure);
  } catch (...) {
    drain();
    throw;
  }
}

}  // namespace zinf::nvme
