// nccl.cu — the NCCL communicator (zinf/comm.h) on CUDA device memory: collectives enqueue on the
// caller's stream. NCCL has no variable-count all-to-all or all-gather, so both are grouped
// point-to-point transfers (ncclSend/ncclRecv inside one ncclGroupStart/End), which is how NCCL's
// own documentation builds them. The communicator is bootstrapped through the host communicator:
// rank 0 makes the unique id and broadcasts it.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdlib>
#include <string>

#include "cuda/cuda.h"
#include "cuda/cuda_check.cuh"
#include "zinf/comm.h"
#include "zinf/error.h"

namespace zinf {
namespace {

void nccl_check(ncclResult_t r, const char* what, int rank) {
  if (r == ncclSuccess) return;
  throw Error(std::string("NCCL ") + what + " failed on rank " + std::to_string(rank) + ": " + ncclGetErrorString(r));
}

class NcclComm final : public Comm {
 public:
  NcclComm(std::unique_ptr<Comm> host, int device) : host_(std::move(host)), device_(device) {
    ZINF_CUDA(cudaSetDevice(device_));
    ncclUniqueId id{};
    if (host_->rank() == 0) nccl_check(ncclGetUniqueId(&id), "GetUniqueId", 0);
    host_->broadcast(&id, sizeof id, 0);
    nccl_check(ncclCommInitRank(&comm_, host_->size(), id, host_->rank()), "CommInitRank", host_->rank());
  }
  ~NcclComm() override {
    if (comm_) ncclCommDestroy(comm_);
  }
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  std::string backend() const override { return "nccl"; }
  bool stream_ordered() const override { return true; }

  void alltoallv(const void* send, const std::vector<std::size_t>& sc, void* recv, const std::vector<std::size_t>& rc,
                 std::size_t elem, void* stream) override {
    auto st = static_cast<cudaStream_t>(stream);
    std::size_t so = 0, ro = 0;
    nccl_check(ncclGroupStart(), "GroupStart", rank());
    for (int r = 0; r < size(); ++r) {
      const auto k = static_cast<std::size_t>(r);
      if (sc[k])
        nccl_check(ncclSend(static_cast<const char*>(send) + so * elem, sc[k] * elem, ncclUint8, r, comm_, st), "Send",
                   rank());
      if (rc[k])
        nccl_check(ncclRecv(static_cast<char*>(recv) + ro * elem, rc[k] * elem, ncclUint8, r, comm_, st), "Recv",
                   rank());
      so += sc[k];
      ro += rc[k];
    }
    nccl_check(ncclGroupEnd(), "GroupEnd", rank());
  }
  void allgatherv(void* buf, const std::vector<std::size_t>& counts, std::size_t elem, void* stream) override {
    gather(nullptr, buf, counts, elem, stream);
  }
  void allgatherv(const void* part, void* buf, const std::vector<std::size_t>& counts, std::size_t elem,
                  void* stream) override {
    gather(part, buf, counts, elem, stream);
  }
  void broadcast(void* buf, std::size_t bytes, int root, void* stream) override {
    nccl_check(ncclBroadcast(buf, buf, bytes, ncclUint8, root, comm_, static_cast<cudaStream_t>(stream)), "Broadcast",
               rank());
  }
  void barrier() override { host_->barrier(); }
  std::unique_ptr<Comm> dup() override { return std::make_unique<NcclComm>(host_->dup(), device_); }
  [[noreturn]] void abort(int code) override {
    host_->abort(code);
    std::_Exit(code);
  }

 private:
  void gather(const void* part, void* buf, const std::vector<std::size_t>& counts, std::size_t elem, void* stream) {
    auto st = static_cast<cudaStream_t>(stream);
    std::vector<std::size_t> off(counts.size() + 1, 0);
    for (std::size_t r = 0; r < counts.size(); ++r) off[r + 1] = off[r] + counts[r];
    const auto me = static_cast<std::size_t>(rank());
    char* b = static_cast<char*>(buf);
    if (part && counts[me] && part != b + off[me] * elem)
      ZINF_CUDA(cudaMemcpyAsync(b + off[me] * elem, part, counts[me] * elem, cudaMemcpyDeviceToDevice, st));
    nccl_check(ncclGroupStart(), "GroupStart", rank());
    for (int r = 0; r < size(); ++r) {
      const auto k = static_cast<std::size_t>(r);
      if (k == me) continue;
      if (counts[me])
        nccl_check(ncclSend(b + off[me] * elem, counts[me] * elem, ncclUint8, r, comm_, st), "Send", rank());
      if (counts[k]) nccl_check(ncclRecv(b + off[k] * elem, counts[k] * elem, ncclUint8, r, comm_, st), "Recv", rank());
    }
    nccl_check(ncclGroupEnd(), "GroupEnd", rank());
  }

  std::unique_ptr<Comm> host_;
  int device_;
  ncclComm_t comm_ = nullptr;
};

}  // namespace

std::unique_ptr<Comm> cuda::make_nccl_comm(Comm& host, int cuda_device) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) throw Error("NCCL: no CUDA device is visible");
  return std::make_unique<NcclComm>(host.dup(), cuda_device);
}

}  // namespace zinf
