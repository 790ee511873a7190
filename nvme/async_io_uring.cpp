// async_io_uring.cpp — the io_uring back end (UringIo): one ring per I/O thread, each keeping up to queue_depth
// requests in flight. A worker blocks in io_uring_submit_and_wait for completions; new work wakes it
// through an eventfd that is itself polled by the ring, so an idle back end burns no CPU and a busy one
// never waits for a timer. Pinned-pool slabs, when given, are registered as fixed buffers.
#include <liburing.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "async_io_internal.h"
#include "zinf/error.h"

namespace zinf::nvme::detail {
namespace {

constexpr std::uint64_t kWakeTag = 1;  // user_data of the eventfd poll; requests use their address

class Worker {
 public:
  Worker(const AsyncIoOptions& o, FaultPlan* faults) : options_(o), faults_(faults) {
    io_uring_params p{};
    if (o.sqpoll) {
      p.flags |= IORING_SETUP_SQPOLL;
      p.sq_thread_idle = 50;
    }
    const unsigned entries = static_cast<unsigned>(o.queue_depth + 2);
    int rc = io_uring_queue_init_params(entries, &ring_, &p);
    if (rc < 0) throw IoError(std::string("io_uring_queue_init: ") + std::strerror(-rc), -rc);
    efd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (efd_ < 0) {
      const int e = errno;
      io_uring_queue_exit(&ring_);
      throw IoError(std::string("eventfd: ") + std::strerror(e), e);
    }
    if (!o.fixed_buffers.empty()) {
      rc = io_uring_register_buffers(&ring_, o.fixed_buffers.data(), static_cast<unsigned>(o.fixed_buffers.size()));
      fixed_ = rc == 0;  // registration is an optimisation: fall back to plain reads/writes
    }
    if (!o.fixed_files.empty())
      files_registered_ =
          io_uring_register_files(&ring_, o.fixed_files.data(), static_cast<unsigned>(o.fixed_files.size())) == 0;
    arm_wake();
    thread_ = std::thread([this] { loop(); });
  }
  ~Worker() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    wake();
    thread_.join();
    ::close(efd_);
    io_uring_queue_exit(&ring_);
  }
  void push(std::deque<Request>& rs) {
    if (rs.empty()) return;
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (auto& r : rs) queue_.push_back(std::move(r));
    }
    wake();
  }

 private:
  void wake() {
    const std::uint64_t one = 1;
    [[maybe_unused]] ssize_t w = ::write(efd_, &one, sizeof one);
  }
  void arm_wake() {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    io_uring_prep_poll_add(sqe, efd_, POLLIN);
    io_uring_sqe_set_data64(sqe, kWakeTag);
  }
  int fixed_index(const char* p) const {
    if (!fixed_) return -1;
    for (std::size_t i = 0; i < options_.fixed_buffers.size(); ++i) {
      const auto* base = static_cast<const char*>(options_.fixed_buffers[i].iov_base);
      if (p >= base && p < base + options_.fixed_buffers[i].iov_len) return static_cast<int>(i);
    }
    return -1;
  }
  void prep(Request* r) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    ZINF_CHECK(sqe != nullptr);
    char* buf = r->buf + r->done;
    const unsigned n = static_cast<unsigned>(r->len - r->done);
    const auto off = static_cast<__u64>(r->offset + r->done);
    const int fi = fixed_index(buf);
    int fd = r->fd;
    bool fixed_file = false;
    if (files_registered_) {
      for (std::size_t i = 0; i < options_.fixed_files.size(); ++i)
        if (options_.fixed_files[i] == fd) {
          fd = static_cast<int>(i);
          fixed_file = true;
          break;
        }
    }
    if (fi >= 0) {
      if (r->write)
        io_uring_prep_write_fixed(sqe, fd, buf, n, off, fi);
      else
        io_uring_prep_read_fixed(sqe, fd, buf, n, off, fi);
    } else {
      if (r->write)
        io_uring_prep_write(sqe, fd, buf, n, off);
      else
        io_uring_prep_read(sqe, fd, buf, n, off);
    }
    if (fixed_file) io_uring_sqe_set_flags(sqe, IOSQE_FIXED_FILE);
    io_uring_sqe_set_data(sqe, r);
    if (options_.single_submit) io_uring_submit(&ring_);
  }
  void loop() {
    std::size_t inflight = 0;
    std::deque<Request*> retry;
    while (true) {
      // Fill the ring up to queue_depth from retries first, then new work.
      bool stopping;
      {
        std::lock_guard<std::mutex> lk(mu_);
        stopping = stop_;
        while (inflight < static_cast<std::size_t>(options_.queue_depth) && (!retry.empty() || !queue_.empty())) {
          Request* r;
          if (!retry.empty()) {
            r = retry.front();
            retry.pop_front();
          } else {
            r = new Request(std::move(queue_.front()));
            queue_.pop_front();
          }
          prep(r);
          ++inflight;
        }
        if (stopping && inflight == 0 && queue_.empty() && retry.empty()) return;
      }
      int rc = io_uring_submit_and_wait(&ring_, 1);
      if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY)
        ZINF_CHECK(!"io_uring_submit_and_wait failed");  // only a broken ring gets here
      io_uring_cqe* cqe;
      unsigned head, seen = 0;
      io_uring_for_each_cqe(&ring_, head, cqe) {
        ++seen;
        if (cqe->user_data == kWakeTag) {
          std::uint64_t v;
          [[maybe_unused]] ssize_t rd = ::read(efd_, &v, sizeof v);
          arm_wake();
          continue;
        }
        Request* r = static_cast<Request*>(io_uring_cqe_get_data(cqe));
        --inflight;
        long long res = cqe->res;
        if (faults_) res = faults_->apply(res, r->len - r->done);
        if (res == -EAGAIN || res == -EINTR) {
          retry.push_back(r);
        } else if (res < 0) {
          r->op->request_failed(static_cast<int>(-res), describe(*r, static_cast<int>(-res)));
          delete r;
        } else if (res == 0) {
          r->op->request_failed(EIO, describe(*r, EIO) + (r->write ? " (wrote nothing)" : " (end of file)"));
          delete r;
        } else {
          r->done += static_cast<std::uint64_t>(res);
          if (r->done < r->len) {
            retry.push_back(r);  // short transfer: resubmit the remainder
          } else {
            r->op->request_done();
            delete r;
          }
        }
      }
      io_uring_cq_advance(&ring_, seen);
    }
  }

  AsyncIoOptions options_;
  FaultPlan* faults_;
  io_uring ring_{};
  int efd_ = -1;
  bool fixed_ = false;
  bool files_registered_ = false;
  std::mutex mu_;
  std::deque<Request> queue_;
  bool stop_ = false;
  std::thread thread_;
};

class UringIo final : public AsyncIo {
 public:
  UringIo(const AsyncIoOptions& o, FaultPlan* faults) : options_(o) {
    for (int i = 0; i < o.threads; ++i) workers_.push_back(std::make_unique<Worker>(o, faults));
  }
  IoHandle submit(bool write, int fd, void* buf, std::uint64_t len, std::uint64_t offset, const std::string& path,
                  std::function<void()> on_done) override {
    Split s = split(write, fd, buf, len, offset, options_.block_size, path, std::move(on_done));
    // Round-robin over the rings, continuing where the last transfer stopped.
    std::vector<std::deque<Request>> per(workers_.size());
    for (auto& r : s.requests) per[next_++ % workers_.size()].push_back(std::move(r));
    for (std::size_t i = 0; i < workers_.size(); ++i) workers_[i]->push(per[i]);
    return s.op;
  }
  std::string name() const override { return "io_uring"; }
  const AsyncIoOptions& options() const override { return options_; }

 private:
  AsyncIoOptions options_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::atomic<std::size_t> next_{0};
};

}  // namespace

std::unique_ptr<AsyncIo> make_uring_io(const AsyncIoOptions& o, FaultPlan* faults) {
  return std::make_unique<UringIo>(o, faults);
}

}  // namespace zinf::nvme::detail
