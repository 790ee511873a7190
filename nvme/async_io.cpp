// async_io.cpp — the parts common to every back end (IoOp, splitting, faults, the factory) and the
// plain pread/pwrite back end (PosixIo) used where io_uring cannot be set up.
#include "zinf/nvme/async_io.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "async_io_internal.h"
#include "zinf/error.h"
#include "zinf/nvme/probe.h"

namespace zinf::nvme {

long long FaultPlan::apply(long long res, std::size_t len) {
  const std::int64_t n = seen.fetch_add(1) + 1;
  const std::int64_t f = fail_at.load();
  if (f > 0 && n == f) return -fail_errno;
  if (short_every > 0 && n % short_every == 0 && res > 1 && static_cast<std::size_t>(res) == len) return res / 2;
  return res;
}

void IoOp::request_done() {
  if (pending_.load(std::memory_order_acquire) == 1 && on_done) on_done();  // the last request: before waiters wake
  if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    std::lock_guard<std::mutex> lk(mu_);
    cv_.notify_all();
  }
}

void IoOp::request_failed(int err, const std::string& message) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (err_ == 0) {
      err_ = err;
      message_ = message;
    }
  }
  request_done();
}

void IoOp::wait() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return pending_.load(std::memory_order_acquire) == 0; });
  if (err_ != 0) throw IoError(message_, err_);
}

namespace detail {

std::string describe(const Request& r, int err) {
  return std::string(r.write ? "write " : "read ") + (r.path ? *r.path : std::string("?")) + " offset " +
         std::to_string(r.offset + r.done) + " length " + std::to_string(r.len - r.done) + ": " + std::strerror(err) +
         " (errno " + std::to_string(err) + ")";
}

Split split(bool write, int fd, void* buf, std::uint64_t len, std::uint64_t offset, std::size_t block_size,
            const std::string& path, std::function<void()> on_done) {
  Split out;
  out.op = std::make_shared<IoOp>(static_cast<std::size_t>((len + block_size - 1) / block_size));
  out.op->on_done = std::move(on_done);
  if (len == 0 && out.op->on_done) out.op->on_done();
  for (std::uint64_t pos = 0; pos < len; pos += block_size) {
    Request r;
    r.op = out.op;
    r.write = write;
    r.fd = fd;
    r.buf = static_cast<char*>(buf) + pos;
    r.len = std::min<std::uint64_t>(block_size, len - pos);
    r.offset = offset + pos;
    r.path = &path;
    out.requests.push_back(std::move(r));
  }
  return out;
}

namespace {

// pread/pwrite on threads × queue_depth workers sharing one queue.
class PosixIo final : public AsyncIo {
 public:
  PosixIo(const AsyncIoOptions& o, FaultPlan* faults) : options_(o), faults_(faults) {
    const int workers = std::max(1, std::min(64, o.threads * o.queue_depth));
    for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { loop(); });
  }
  ~PosixIo() override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  IoHandle submit(bool write, int fd, void* buf, std::uint64_t len, std::uint64_t offset, const std::string& path,
                  std::function<void()> on_done) override {
    Split s = split(write, fd, buf, len, offset, options_.block_size, path, std::move(on_done));
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (auto& r : s.requests) queue_.push_back(std::move(r));
    }
    cv_.notify_all();
    return s.op;
  }
  std::string name() const override { return "posix"; }
  const AsyncIoOptions& options() const override { return options_; }

 private:
  void loop() {
    while (true) {
      Request r;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        r = std::move(queue_.front());
        queue_.pop_front();
      }
      run(r);
    }
  }
  void run(Request& r) {
    while (r.done < r.len) {
      const std::size_t want = r.len - r.done;
      ssize_t res = r.write ? ::pwrite(r.fd, r.buf + r.done, want, static_cast<off_t>(r.offset + r.done))
                            : ::pread(r.fd, r.buf + r.done, want, static_cast<off_t>(r.offset + r.done));
      long long v = res < 0 ? -errno : res;
      if (faults_) v = faults_->apply(v, want);
      if (v == -EINTR || v == -EAGAIN) continue;
      if (v < 0) return r.op->request_failed(static_cast<int>(-v), describe(r, static_cast<int>(-v)));
      if (v == 0)
        return r.op->request_failed(EIO, describe(r, EIO) + (r.write ? " (wrote nothing)" : " (end of file)"));
      r.done += static_cast<std::uint64_t>(v);
    }
    r.op->request_done();
  }

  AsyncIoOptions options_;
  FaultPlan* faults_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Request> queue_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace

std::unique_ptr<AsyncIo> make_posix_io(const AsyncIoOptions& o, FaultPlan* faults) {
  return std::make_unique<PosixIo>(o, faults);
}

}  // namespace detail

std::unique_ptr<AsyncIo> make_async_io(AsyncIoKind kind, const AsyncIoOptions& o, std::string* why, FaultPlan* faults) {
  ZINF_CHECK(o.block_size >= 512 && o.queue_depth >= 1 && o.threads >= 1);
  if (kind == AsyncIoKind::posix) {
    if (why) *why = "posix engine (pread/pwrite threads), as configured";
    return detail::make_posix_io(o, faults);
  }
  if (kind == AsyncIoKind::uring) {
    if (why) *why = "io_uring engine, as configured";
    return detail::make_uring_io(o, faults);
  }
  std::string reason;
  if (io_uring_available(&reason)) {
    try {
      auto e = detail::make_uring_io(o, faults);
      if (why) *why = "io_uring engine (auto: io_uring works here)";
      return e;
    } catch (const Error& e) {
      reason = e.what();
    }
  }
  if (why) *why = "posix engine (auto: io_uring unavailable: " + reason + ")";
  return detail::make_posix_io(o, faults);
}

}  // namespace zinf::nvme
