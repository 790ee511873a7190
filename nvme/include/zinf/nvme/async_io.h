// zinf/nvme/async_io.h — the NVMe I/O back end (AsyncIo): asynchronous transfers between host
// buffers and files.
//
// Back ends: io_uring (liburing; one ring per I/O thread, batched submission, completions
// reaped by blocking in the ring — no core burnt —, optional SQPOLL, registered buffers), a plain
// pread/pwrite thread pool for filesystems or kernels that refuse io_uring or O_DIRECT, and fault
// injection on either (tests). `auto` picks and says in one line which and why.
//
// A transfer is split into block_size requests spread round-robin over the I/O threads, each of
// which keeps up to queue_depth in flight — DeepSpeed's aio block_size / queue_depth /
// intra_op_parallelism. Short transfers are resubmitted for the remainder, -EAGAIN/-EINTR retried,
// every result checked; a failure carries file, offset, length and the errno text, and the whole
// transfer fails (nothing partial is reported as success).
//
// Thread-safety: submit() may be called from any thread; a handle may be waited on from any thread.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace zinf::nvme {

enum class AsyncIoKind { automatic, uring, posix };

struct AsyncIoOptions {
  std::size_t block_size = 1 << 20;  // bytes per request
  int queue_depth = 8;               // requests in flight per I/O thread
  int threads = 1;                   // I/O threads (rings)
  bool single_submit = false;        // one io_uring_submit per request instead of batches
  bool sqpoll = false;               // kernel-side submission polling (IORING_SETUP_SQPOLL)
  std::vector<iovec> fixed_buffers;  // registered with every ring (e.g. the pinned pool's slabs)
  std::vector<int> fixed_files;      // registered with every ring; requests on them use the fixed index
};

// Fault injection for tests: the Nth request (1-based, counted across the back end) fails with
// `fail_errno`; every `short_every`-th request completes with half its bytes (exercising the
// resubmission of the remainder).
struct FaultPlan {
  std::atomic<std::int64_t> fail_at{0};
  int fail_errno = 5;  // EIO
  std::int64_t short_every = 0;
  std::atomic<std::int64_t> seen{0};
  // Returns the result to report for a request that really transferred `res` bytes of `len`.
  long long apply(long long res, std::size_t len);
};

// One submitted transfer. wait() blocks until every request finished and throws zinf::IoError
// (file, offset, length, errno text) if any failed.
class IoOp {
 public:
  explicit IoOp(std::size_t requests) : pending_(requests) {}
  void wait();
  bool done() const { return pending_.load(std::memory_order_acquire) == 0; }
  // Called by the back ends.
  void request_done();
  void request_failed(int err, const std::string& message);
  // Runs once, on the completing I/O thread, when the last request finishes (set before submitting
  // the first request; the store uses it to account busy time).
  std::function<void()> on_done;

 private:
  std::atomic<std::size_t> pending_;
  std::mutex mu_;
  std::condition_variable cv_;
  int err_ = 0;
  std::string message_;
};
using IoHandle = std::shared_ptr<IoOp>;

class AsyncIo {
 public:
  virtual ~AsyncIo() = default;
  // Queues a transfer of `len` bytes between `buf` and `fd` at `offset`. `path` names the file in
  // errors. With O_DIRECT files, buf, len and offset must honour the file's alignment. `on_done`
  // (optional) runs on the I/O thread when the transfer completes, before waiters are woken.
  virtual IoHandle submit(bool write, int fd, void* buf, std::uint64_t len, std::uint64_t offset,
                          const std::string& path, std::function<void()> on_done = {}) = 0;
  virtual std::string name() const = 0;
  virtual const AsyncIoOptions& options() const = 0;
};

// Builds a back end. `automatic` tries io_uring and falls back to posix; `why` (if given) receives the
// one-line reason for the choice. `faults` (tests) may be null; it must outlive the back end.
std::unique_ptr<AsyncIo> make_async_io(AsyncIoKind kind, const AsyncIoOptions& o, std::string* why = nullptr,
                                       FaultPlan* faults = nullptr);

}  // namespace zinf::nvme
