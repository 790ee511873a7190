// nvme_sweep.cpp — `zinf bench nvme` (bench/nvme_sweep.h).
#include "bench/nvme_sweep.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "zinf/error.h"
#include "zinf/nvme/store.h"
#include "zinf/nvme/swapper.h"
#include "zinf/pinned.h"

namespace zinf::nvme {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string fmt_size(std::size_t b) {
  return b >= (1u << 20) ? std::to_string(b >> 20) + "M" : std::to_string(b >> 10) + "K";
}

// One sequential pass with plain pread/pwrite, 1 MiB at a time, queue depth 1.
double plain_pass(int fd, const std::string& path, bool write, void* buf, std::uint64_t bytes) {
  const std::size_t req = 1 << 20;
  const auto t0 = Clock::now();
  for (std::uint64_t off = 0; off < bytes; off += req) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(req, bytes - off));
    ssize_t r = write ? ::pwrite(fd, buf, n, static_cast<off_t>(off)) : ::pread(fd, buf, n, static_cast<off_t>(off));
    if (r != static_cast<ssize_t>(n)) {
      const int e = r < 0 ? errno : EIO;
      throw IoError(std::string(write ? "write " : "read ") + path + " offset " + std::to_string(off) + " length " +
                        std::to_string(n) + ": " + std::strerror(e),
                    e);
    }
  }
  if (write) ::fdatasync(fd);
  return static_cast<double>(bytes) / seconds_since(t0) / 1e9;
}

// The sweep's raw file, opened once more past the store (same inode, O_DIRECT when the filesystem
// allows it), and the pinned buffer every cell moves.
struct RawFile {
  int fd;
  std::string path;
  iovec buffer;  // a part of the pinned slab
  iovec slab;    // the whole slab, registered with every engine
};

// One sweep cell: `cell_bytes` written or read through a fresh engine with this block size, queue
// depth and thread count. Sets *engine to the engine's description.
SweepCell measure_cell(const RawFile& file, const SweepOptions& o, std::uint64_t cell_bytes, bool write, int threads,
                       int depth, std::size_t block, std::string* engine) {
  AsyncIoOptions eo;
  eo.block_size = block;
  eo.queue_depth = depth;
  eo.threads = threads;
  eo.fixed_buffers = {file.slab};
  auto io = make_async_io(o.engine, eo, engine);
  const auto t0 = Clock::now();
  std::vector<IoHandle> hs;
  for (std::uint64_t off = 0; off < cell_bytes; off += file.buffer.iov_len)
    hs.push_back(io->submit(write, file.fd, file.buffer.iov_base,
                            std::min<std::uint64_t>(file.buffer.iov_len, cell_bytes - off), off, file.path));
  for (auto& h : hs) h->wait();
  if (write) ::fdatasync(file.fd);
  return SweepCell{write, block, depth, threads, static_cast<double>(cell_bytes) / seconds_since(t0) / 1e9};
}

// Every cell of the sweep (read, then write) into r, with the best read and best write.
void sweep_cells(const RawFile& file, const SweepOptions& o, std::uint64_t cell_bytes, SweepResult& r,
                 const std::function<void(const std::string&)>& progress) {
  for (bool write : {false, true}) {
    for (int th : o.threads) {
      for (int qd : o.depths) {
        for (std::size_t bs : o.block_sizes) {
          std::string why;
          const SweepCell c = measure_cell(file, o, cell_bytes, write, th, qd, bs, &why);
          if (r.engine.empty()) r.engine = why;
          r.cells.push_back(c);
          SweepCell& best = write ? r.best_write : r.best_read;
          if (c.gbps > best.gbps) best = c;
          progress(std::string(write ? "write" : "read ") + " block " + fmt_size(bs) + " depth " + std::to_string(qd) +
                   " threads " + std::to_string(th) + ": " + std::to_string(c.gbps).substr(0, 5) + " GB/s");
        }
      }
    }
  }
}

// The single setting with the highest read + write (what a paste-ready aio block can hold).
void choose_best_combined(SweepResult& r) {
  double best_sum = -1;
  for (const auto& rc : r.cells) {
    if (rc.write) continue;
    for (const auto& wc : r.cells)
      if (wc.write && wc.block == rc.block && wc.depth == rc.depth && wc.threads == rc.threads &&
          rc.gbps + wc.gbps > best_sum) {
        best_sum = rc.gbps + wc.gbps;
        r.best_combined_read = rc;
        r.best_combined_write = wc;
      }
  }
}

// Swap mode: the optimizer pattern through the pipelined swapper, at the best combined setting, with
// `pool`'s room (the sweep's buffer given back) as its buffers.
void measure_swap(const SweepOptions& o, PinnedPool& pool, std::uint64_t file_bytes, SweepResult& r,
                  const std::function<void(const std::string&)>& progress) {
  progress("swap mode: read g+1 | touch g | write g-1 through " + std::to_string(o.swap_buffers) +
           " pinned buffers of " + fmt_size(o.swap_item));
  StoreOptions swap_options;
  swap_options.parent = o.dir;
  swap_options.io_kind = o.engine;
  swap_options.io.block_size = r.best_combined_read.block;
  swap_options.io.queue_depth = r.best_combined_read.depth;
  swap_options.io.threads = r.best_combined_read.threads;
  swap_options.io.fixed_buffers = {pool.slab()};
  TensorStore swap_store(swap_options);
  const std::size_t item = static_cast<std::size_t>(std::min<std::uint64_t>(o.swap_item, file_bytes));
  const std::size_t nitems = static_cast<std::size_t>(std::max<std::uint64_t>(2, file_bytes / item));
  const auto sid = swap_store.add("optimizer", static_cast<std::uint64_t>(nitems) * item);
  Swapper swapper(swap_store, pool, o.swap_buffers, item);
  std::vector<SwapItem> items;
  for (std::size_t i = 0; i < nitems; ++i) items.push_back({sid, i * item, item, false, true});
  auto touch = [](std::size_t, void* b, std::size_t len) {
    auto* p = static_cast<unsigned char*>(b);
    for (std::size_t k = 0; k < len; k += 4096) p[k] = static_cast<unsigned char>(p[k] + 1);
  };
  swapper.run(items, touch);  // lay the data down once
  for (auto& it : items) it.read = true;
  const auto t0 = Clock::now();
  swapper.run(items, touch);
  const double t = seconds_since(t0);
  r.swap_bytes = 2 * static_cast<std::uint64_t>(nitems) * item;
  r.swap_gbps = static_cast<double>(r.swap_bytes) / t / 1e9;
  const double half = static_cast<double>(r.swap_bytes) / 2;
  const double ideal = half / (r.best_read.gbps * 1e9) + half / (r.best_write.gbps * 1e9);
  r.swap_ratio = ideal / t;
}

}  // namespace

SweepResult run_sweep(const SweepOptions& o, const std::function<void(const std::string&)>& progress) {
  ZINF_CHECK(o.file_bytes >= (1 << 20) && o.cell_bytes >= (1 << 20));
  SweepResult r;
  const std::uint64_t file_bytes = o.file_bytes / (1 << 20) * (1 << 20);
  const std::uint64_t cell = std::min(file_bytes, o.cell_bytes / (1 << 20) * (1 << 20));
  const std::size_t buf_bytes = static_cast<std::size_t>(std::min<std::uint64_t>(cell, 256 << 20));

  // The store gives us the private directory, an O_DIRECT file and its cleanup on every exit path.
  StoreOptions store_options;
  store_options.parent = o.dir;
  store_options.io_kind =
      AsyncIoKind::posix;  // only for the store's own bookkeeping; cells build their own AsyncIo back ends
  TensorStore store(store_options);
  if (store.description().find("O_DIRECT") == std::string::npos ||
      store.description().find("refuses") != std::string::npos)
    progress("note: " + store.description() + " — figures include the page cache");
  const auto id = store.add("bench", file_bytes);
  (void)id;
  // Re-open the store's file for the raw passes (same inode, O_DIRECT when the filesystem allows it).
  const std::string path = store.directory() + "/store.0";
  int fd = ::open(path.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);
  if (fd < 0) fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) throw IoError("open " + path + ": " + std::strerror(errno), errno);
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};

  PinnedPool pool(buf_bytes + static_cast<std::size_t>(o.swap_buffers) * store.padded(o.swap_item),
                  /*lock=*/lockable_bytes() == SIZE_MAX);
  PinnedBuffer buf = pool.acquire(buf_bytes);
  std::memset(buf.data(), 0x5A, buf_bytes);

  progress("plain sequential O_DIRECT pass: write " + std::to_string(file_bytes >> 20) + " MiB");
  r.plain_write_gbps = plain_pass(fd, path, true, buf.data(), file_bytes);
  progress("plain sequential O_DIRECT pass: read");
  r.plain_read_gbps = plain_pass(fd, path, false, buf.data(), file_bytes);

  sweep_cells(RawFile{fd, path, {buf.data(), buf_bytes}, pool.slab()}, o, cell, r, progress);
  choose_best_combined(r);
  buf.reset();  // give the pool's room to the swap buffers
  measure_swap(o, pool, file_bytes, r, progress);
  return r;
}

}  // namespace zinf::nvme
