// zinf/backends/world.h — the job's ranks and their host communicator: the solo communicator, the
// launch environment (mpirun, or DeepSpeed's and torchrun's variables) and the MPI world built from
// it, and how a job of several ranks ends. The interface itself is zinf/comm.h; world.cpp has the solo
// communicator and the launch detection, mpi/mpi.cpp the rest (or, built without MPI, backends.cpp).
#pragma once

#include <memory>
#include <string>

#include "zinf/comm.h"

namespace zinf {

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
