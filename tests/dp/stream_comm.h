// stream_comm.h — NCCL's calling convention on the CPU device, for the data-parallel tests: a
// communicator whose collectives on device memory are jobs on the device stream passed in: each runs
// when its stream reaches it, blocks that stream until every rank has joined, and runs alone in its
// process (NCCL does not promise that two collectives in flight at once on one GPU both progress).
// Over MPI on the asynchronous CPU device this shows what GPUs with NCCL would do with the engine's
// ordering: collectives that two ranks run in different orders hang both.
#pragma once

#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "zinf/comm.h"
#include "zinf/device.h"
#include "zinf/error.h"

namespace zinf::test {

class StreamOrderedComm final : public Comm {
 public:
  StreamOrderedComm(std::unique_ptr<Comm> inner, Device& dev) : in_(std::move(inner)), dev_(dev) {
    if (!dev.ops_stream_ordered()) throw Error("StreamOrderedComm needs the asynchronous CPU device");
  }
  int rank() const override { return in_->rank(); }
  int size() const override { return in_->size(); }
  std::string backend() const override { return in_->backend() + " on streams"; }
  bool stream_ordered() const override { return true; }

  void alltoallv(const void* send, const std::vector<std::size_t>& sc, void* recv, const std::vector<std::size_t>& rc,
                 std::size_t elem, void* stream) override {
    run(stream, [=, c = in_.get()] { c->alltoallv(send, sc, recv, rc, elem); });
  }
  void allgatherv(void* buf, const std::vector<std::size_t>& counts, std::size_t elem, void* stream) override {
    run(stream, [=, c = in_.get()] { c->allgatherv(buf, counts, elem); });
  }
  void allgatherv(const void* part, void* buf, const std::vector<std::size_t>& counts, std::size_t elem,
                  void* stream) override {
    run(stream, [=, c = in_.get()] { c->allgatherv(part, buf, counts, elem); });
  }
  void broadcast(void* buf, std::size_t bytes, int root, void* stream) override {
    run(stream, [=, c = in_.get()] { c->broadcast(buf, bytes, root); });
  }
  void barrier() override { in_->barrier(); }
  std::unique_ptr<Comm> dup() override { return std::make_unique<StreamOrderedComm>(in_->dup(), dev_); }
  [[noreturn]] void abort(int code) override {
    in_->abort(code);
    std::abort();  // (never reached: the inner abort does not return)
  }

 private:
  // The job goes on the stream whose native handle was passed; without one it runs now (host helpers).
  void run(void* stream, std::function<void()> job) {
    if (!stream) return job();
    // One collective at a time per process: NCCL does not promise that two in flight at once on one
    // GPU both progress, so the test assumes the worst — they never run side by side.
    job = [j = std::move(job)] {
      static std::mutex one_at_a_time;
      std::lock_guard<std::mutex> lk(one_at_a_time);
      j();
    };
    for (StreamRole r : {StreamRole::compute, StreamRole::h2d, StreamRole::d2h})
      if (dev_.native_stream(r) == stream) return dev_.launch(r, std::move(job));
    throw Error("StreamOrderedComm: a stream of another device");
  }
  std::unique_ptr<Comm> in_;
  Device& dev_;
};

}  // namespace zinf::test
