// mpi_none.cpp — make_world_comm in a build without MPI: one rank only.
#include "zinf/comm.h"
#include "zinf/error.h"

namespace zinf {

std::unique_ptr<Comm> make_world_comm(const World& w) {
  if (w.size <= 1) return make_solo_comm();
  throw ConfigError("launched as rank " + std::to_string(w.rank) + " of " + std::to_string(w.size) + ", but this build of zinf has no MPI",
                    "install libopenmpi-dev (scripts/install-deps.sh) and rebuild");
}

void mark_world_failing() {}

void end_world_job(int) {}

void remove_world_files() {}

void leave_world() {}

}  // namespace zinf
