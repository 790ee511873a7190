// zinf/comm.h — communication between data-parallel ranks: the few collectives the engine and the
// trainer need, behind one small interface with a backend per transport.
//
//   MPI   host-visible buffers (host memory, pinned memory, the CPU device's "device" memory);
//         blocking calls on the calling thread. Open MPI from Debian; launched by mpirun.
//   NCCL  CUDA device memory; calls enqueue on the CUDA stream passed in and return. Its
//         communicator is bootstrapped through MPI (the unique id is broadcast by rank 0).
//   solo  one rank: every collective is a copy or nothing (no MPI initialised at all).
//
// Determinism: no sum is left to the transport. A reduction is done by the caller as an
// all-to-all of contributions (alltoallv) followed by a sum in rank order, so element i of a
// reduced vector is ((x₀ + x₁) + x₂) + … on every backend, every world size and every collective
// algorithm the library picks. The sums of small host values (losses, norm parts) are made the same
// way with allgather.
//
// Threads: one communicator serves one thread at a time, and every rank issues the same collectives
// on it in the same order. A component that runs collectives on several threads takes one dup() per
// thread (made at construction, in the same order on every rank).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace zinf {

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "mpi", "nccl", "solo"
  // True when buffers are device memory and calls enqueue on `stream` (NCCL); false when they are
  // host-visible and calls block until done (MPI, solo).
  virtual bool stream_ordered() const { return false; }

  // Element sizes are in bytes (`elem` = 2, 4 or 8); counts in elements.
  // Every rank sends send_counts[r] elements to rank r, taken one after another from `send`, and
  // receives recv_counts[r] elements from rank r, placed one after another in `recv`.
  virtual void alltoallv(const void* send, const std::vector<std::size_t>& send_counts, void* recv,
                         const std::vector<std::size_t>& recv_counts, std::size_t elem, void* stream = nullptr) = 0;
  // In place: rank r's counts[r] elements lie at offset Σ counts[<r] of `buf` on rank r; afterwards
  // every rank holds every part.
  virtual void allgatherv(void* buf, const std::vector<std::size_t>& counts, std::size_t elem,
                          void* stream = nullptr) = 0;
  // From a separate source: rank r contributes counts[r] elements from `part`; `buf` receives all.
  virtual void allgatherv(const void* part, void* buf, const std::vector<std::size_t>& counts, std::size_t elem,
                          void* stream = nullptr) = 0;
  virtual void broadcast(void* buf, std::size_t bytes, int root, void* stream = nullptr) = 0;
  virtual void barrier() = 0;
  // A new communicator over the same ranks, for another thread (collective: every rank calls it).
  virtual std::unique_ptr<Comm> dup() = 0;
  // Ends the whole job from any rank (MPI_Abort): the others stop instead of waiting.
  [[noreturn]] virtual void abort(int code) = 0;

  // ---- host helpers built on the above (host memory only) ----------------------------------------
  // Every rank's `n` doubles, rank-major.
  std::vector<double> allgather(const double* mine, std::size_t n);
  // The rank-ordered sum of one double per rank (the same value on every rank).
  double sum(double mine);
  // Whether the flag is set on any rank.
  bool any(bool mine);
  // Whether every rank passed the same 64-bit value (a config fingerprint, a step number).
  bool same(std::uint64_t mine);
};

inline std::vector<double> Comm::allgather(const double* mine, std::size_t n) {
  std::vector<double> all(n * static_cast<std::size_t>(size()));
  std::memcpy(all.data() + n * static_cast<std::size_t>(rank()), mine, n * sizeof(double));
  allgatherv(all.data(), std::vector<std::size_t>(static_cast<std::size_t>(size()), n), sizeof(double));
  return all;
}

inline double Comm::sum(double mine) {
  const auto all = allgather(&mine, 1);
  double s = all[0];
  for (std::size_t r = 1; r < all.size(); ++r) s += all[r];  // rank order
  return s;
}

inline bool Comm::any(bool mine) { return sum(mine ? 1.0 : 0.0) > 0; }

inline bool Comm::same(std::uint64_t mine) {
  // Two doubles carry the 64 bits exactly (32 each).
  const double parts[2] = {static_cast<double>(mine >> 32), static_cast<double>(mine & 0xffffffffu)};
  const auto all = allgather(parts, 2);
  for (std::size_t r = 0; r < all.size(); r += 2)
    if (all[r] != parts[0] || all[r + 1] != parts[1]) return false;
  return true;
}

// The communicators themselves — solo, MPI, NCCL — and the job's ranks as the launcher set them up
// are the backends' (zinf/backends/world.h).

}  // namespace zinf
