// mpi.cpp — the MPI communicator (zinf/comm.h) on host-visible buffers, and make_world_comm.
//
// MPI is initialised once, with MPI_THREAD_MULTIPLE (the engine's workers each run collectives on
// their own communicator), only when the launcher started more than one rank; it is finalised at exit.
// Errors return (MPI_ERRORS_RETURN) and become zinf errors naming the call and the rank.
#include <mpi.h>

#include <climits>
#include <cstdlib>
#include <mutex>
#include <string>

#include "zinf/comm.h"
#include "zinf/error.h"

namespace zinf {
namespace {

void check(int rc, const char* what, int rank) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw Error(std::string("MPI ") + what + " failed on rank " + std::to_string(rank) + ": " + std::string(msg, static_cast<std::size_t>(len)));
}

MPI_Datatype type_of(std::size_t elem) {
  switch (elem) {
    case 1: return MPI_BYTE;
    case 2: return MPI_UINT16_T;
    case 4: return MPI_UINT32_T;  // moved as bits: no MPI arithmetic is ever applied
    case 8: return MPI_UINT64_T;
  }
  throw Error("comm: element size " + std::to_string(elem) + " is not 1, 2, 4 or 8");
}

// MPI counts and displacements are ints: larger transfers are refused with the reason.
std::vector<int> ints(const std::vector<std::size_t>& v, std::vector<int>* displs) {
  std::vector<int> out(v.size());
  std::size_t off = 0;
  if (displs) displs->resize(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (v[i] > INT_MAX || off > INT_MAX)
      throw Error("comm: a transfer of " + std::to_string(v[i]) + " elements at offset " + std::to_string(off) +
                      " is beyond MPI's int counts",
                  "lower reduce_bucket_size or sub_group_size");
    out[i] = static_cast<int>(v[i]);
    if (displs) (*displs)[i] = static_cast<int>(off);
    off += v[i];
  }
  return out;
}

class MpiComm final : public Comm {
 public:
  explicit MpiComm(MPI_Comm c) : c_(c) {
    MPI_Comm_rank(c_, &rank_);
    MPI_Comm_size(c_, &size_);
    MPI_Comm_set_errhandler(c_, MPI_ERRORS_RETURN);
  }
  ~MpiComm() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && c_ != MPI_COMM_WORLD) MPI_Comm_free(&c_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }

  void alltoallv(const void* send, const std::vector<std::size_t>& sc, void* recv, const std::vector<std::size_t>& rc,
                 std::size_t elem, void*) override {
    ZINF_CHECK(sc.size() == static_cast<std::size_t>(size_) && rc.size() == sc.size());
    std::vector<int> sd, rd;
    const auto s = ints(sc, &sd), r = ints(rc, &rd);
    check(MPI_Alltoallv(send, s.data(), sd.data(), type_of(elem), recv, r.data(), rd.data(), type_of(elem), c_), "Alltoallv", rank_);
  }
  void allgatherv(void* buf, const std::vector<std::size_t>& counts, std::size_t elem, void*) override {
    ZINF_CHECK(counts.size() == static_cast<std::size_t>(size_));
    std::vector<int> d;
    const auto c = ints(counts, &d);
    check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, c.data(), d.data(), type_of(elem), c_), "Allgatherv", rank_);
  }
  void allgatherv(const void* part, void* buf, const std::vector<std::size_t>& counts, std::size_t elem, void*) override {
    ZINF_CHECK(counts.size() == static_cast<std::size_t>(size_));
    std::vector<int> d;
    const auto c = ints(counts, &d);
    check(MPI_Allgatherv(part, c[static_cast<std::size_t>(rank_)], type_of(elem), buf, c.data(), d.data(), type_of(elem), c_),
          "Allgatherv", rank_);
  }
  void broadcast(void* buf, std::size_t bytes, int root, void*) override {
    auto* p = static_cast<char*>(buf);
    for (std::size_t o = 0; o < bytes; o += INT_MAX / 2) {
      const std::size_t len = std::min<std::size_t>(INT_MAX / 2, bytes - o);
      check(MPI_Bcast(p + o, static_cast<int>(len), MPI_BYTE, root, c_), "Bcast", rank_);
    }
  }
  void barrier() override { check(MPI_Barrier(c_), "Barrier", rank_); }
  std::unique_ptr<Comm> dup() override {
    MPI_Comm d;
    check(MPI_Comm_dup(c_, &d), "Comm_dup", rank_);
    return std::make_unique<MpiComm>(d);
  }
  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }

 private:
  MPI_Comm c_;
  int rank_ = 0, size_ = 1;
};

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace

void end_world_job(int code) {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Abort(MPI_COMM_WORLD, code);
}

std::unique_ptr<Comm> make_world_comm(const World& w) {
  if (w.size <= 1) return make_solo_comm();
  static std::once_flag once;
  std::call_once(once, [] {
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
      throw Error("MPI_Init_thread failed");
    if (provided < MPI_THREAD_MULTIPLE)
      throw Error("this MPI library does not provide MPI_THREAD_MULTIPLE, which zinf's workers need",
                  "use Debian's Open MPI (openmpi-bin, libopenmpi-dev)");
    std::atexit(finalize_at_exit);
  });
  auto c = std::make_unique<MpiComm>(MPI_COMM_WORLD);
  if (c->size() != w.size || c->rank() != w.rank)
    throw Error("MPI reports rank " + std::to_string(c->rank()) + " of " + std::to_string(c->size()) + ", the launcher said " +
                std::to_string(w.rank) + " of " + std::to_string(w.size));
  return c;
}

}  // namespace zinf
