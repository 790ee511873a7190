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

// One rank: no communication at all.
std::unique_ptr<Comm> make_solo_comm();

// The ranks of this job as the launcher set them up: mpirun's environment (Open MPI, or a PMI
// launcher), with DeepSpeed's RANK / WORLD_SIZE / LOCAL_RANK checked against it; or, without mpirun,
// DeepSpeed's (torchrun's) RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT; a process
// started alone is rank 0 of 1.
struct World {
  int rank = 0, size = 1, local_rank = 0;
  std::string launcher = "none";  // "mpirun", "env" (RANK/WORLD_SIZE/MASTER_*), or "none" for a single process
  std::string master_addr;        // "env": rank 0's host and the rendezvous port
  int master_port = 0;
};
// Reads the launch environment; throws a ConfigError naming the variables when it is inconsistent.
World detect_world();
// The host communicator of this job: MPI when launched with more than one rank (initialises MPI with
// MPI_THREAD_MULTIPLE once), solo otherwise. Launched by environment variables, the processes are
// separate MPI jobs until they meet: rank 0 starts Open MPI's name server (ompi-server), hands its
// address and an MPI port to the others over a TCP connection at MASTER_ADDR:MASTER_PORT, and the
// ranks connect through MPI (MPI_Comm_accept/connect), ordered by RANK. A rank that does not arrive
// within ZINF_RENDEZVOUS_TIMEOUT seconds (default 120) fails the start on every rank that waits.
std::unique_ptr<Comm> make_world_comm(const World& w);
// This rank is failing and reports its own error: from now on, a peer that ends because it failed
// too is not reported as a second line (call before printing the error, then end_world_job).
void mark_world_failing();
// When MPI was initialised by this process (a job of several ranks): ends the whole job with `code`,
// so no other rank waits for this one; otherwise returns. Under mpirun that is MPI_Abort. An
// environment launch ends without Open MPI's abort banner: the rank tells the others on the
// rendezvous lines that it failed (they end themselves), removes its rendezvous files and exits with
// `code` (it returns, for main to exit normally, only when it never joined the others).
void end_world_job(int code);
// The files of an environment launch's rendezvous (the name server's address): stops the name server
// and removes them. Async-signal-safe, for a signal handler that ends the process at once; the normal
// and the error exits do it themselves.
void remove_world_files();
// The normal end of a job of several ranks: waits until every rank has finished (a barrier), then
// closes the launch's own connections so that no rank mistakes another's exit for its death. Runs at
// exit if not called before; once per process; returns at once for a single process.
void leave_world();

}  // namespace zinf
