// world.cpp — the solo communicator and the launch detection of zinf/backends/world.h.
#include <cstdlib>
#include <cstring>
#include <string>

#include "zinf/backends/world.h"
#include "zinf/error.h"

namespace zinf {

namespace {

class SoloComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "solo"; }
  void alltoallv(const void* send, const std::vector<std::size_t>& sc, void* recv, const std::vector<std::size_t>& rc,
                 std::size_t elem, void*) override {
    ZINF_CHECK(sc.size() == 1 && rc.size() == 1 && sc[0] == rc[0]);
    if (sc[0] && send != recv) std::memmove(recv, send, sc[0] * elem);
  }
  void allgatherv(void*, const std::vector<std::size_t>& c, std::size_t, void*) override { ZINF_CHECK(c.size() == 1); }
  void allgatherv(const void* part, void* buf, const std::vector<std::size_t>& c, std::size_t elem, void*) override {
    ZINF_CHECK(c.size() == 1);
    if (c[0] && part != buf) std::memmove(buf, part, c[0] * elem);
  }
  void broadcast(void*, std::size_t, int root, void*) override { ZINF_CHECK(root == 0); }
  void barrier() override {}
  std::unique_ptr<Comm> dup() override { return std::make_unique<SoloComm>(); }
  [[noreturn]] void abort(int code) override { std::_Exit(code); }
};

// An integer environment variable, or −1 when unset; a value that is not a number is an error.
int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return -1;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end || x < 0 || x > 1'000'000) throw ConfigError(std::string(name) + "=" + v + ": not a rank number");
  return static_cast<int>(x);
}

}  // namespace

std::unique_ptr<Comm> make_solo_comm() { return std::make_unique<SoloComm>(); }

World detect_world() {
  World w;
  // mpirun: Open MPI's variables, or the PMI ones of MPICH's hydra.
  int size = env_int("OMPI_COMM_WORLD_SIZE"), rank = env_int("OMPI_COMM_WORLD_RANK"),
      local = env_int("OMPI_COMM_WORLD_LOCAL_RANK");
  if (size < 0) size = env_int("PMI_SIZE"), rank = env_int("PMI_RANK"), local = env_int("MPI_LOCALRANKID");
  // DeepSpeed's (and torchrun's) variables.
  const int ds_size = env_int("WORLD_SIZE"), ds_rank = env_int("RANK"), ds_local = env_int("LOCAL_RANK");
  if (size > 0) {
    if (rank < 0 || rank >= size)
      throw ConfigError("the MPI launcher set a world of " + std::to_string(size) + " but no valid rank");
    w.size = size, w.rank = rank, w.local_rank = local >= 0 ? local : rank;
    w.launcher = "mpirun";
    if ((ds_size >= 0 && ds_size != size) || (ds_rank >= 0 && ds_rank != rank))
      throw ConfigError("WORLD_SIZE=" + std::to_string(ds_size) + " RANK=" + std::to_string(ds_rank) +
                            " disagree with mpirun's world (" + std::to_string(size) + " ranks, this is rank " +
                            std::to_string(rank) + ")",
                        "unset WORLD_SIZE and RANK, or launch so that both describe the same job");
    if (ds_local >= 0) w.local_rank = ds_local;
    return w;
  }
  if (ds_size > 1) {  // a launcher that sets DeepSpeed's (torchrun's) variables: rendezvous at MASTER_ADDR:MASTER_PORT
    const char* addr = std::getenv("MASTER_ADDR");
    const int port = env_int("MASTER_PORT");
    if (ds_rank < 0 || ds_rank >= ds_size)
      throw ConfigError("WORLD_SIZE=" + std::to_string(ds_size) + " is set without a RANK below it",
                        "set RANK=0…" + std::to_string(ds_size - 1));
    if (!addr || !*addr || port <= 0 || port > 65535)
      throw ConfigError(
          "WORLD_SIZE=" + std::to_string(ds_size) + " and RANK are set, but MASTER_ADDR / MASTER_PORT are not",
          "set both (rank 0's host and a free TCP port), or launch with `mpirun -np " + std::to_string(ds_size) +
              " zinf …`");
    w.size = ds_size, w.rank = ds_rank, w.local_rank = ds_local >= 0 ? ds_local : ds_rank;
    w.launcher = "env";
    w.master_addr = addr;
    w.master_port = port;
    return w;
  }
  if (ds_rank > 0) throw ConfigError("RANK=" + std::to_string(ds_rank) + " is set for a world of one process");
  return w;
}

}  // namespace zinf
