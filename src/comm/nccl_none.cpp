// nccl_none.cpp — make_nccl_comm in a build without CUDA.
#include "zinf/comm.h"
#include "zinf/error.h"

namespace zinf {

std::unique_ptr<Comm> make_nccl_comm(Comm&, int) {
  throw Error("NCCL: this build of zinf has no CUDA", "rebuild with -DZINF_CUDA=ON on a machine with the CUDA toolkit");
}

}  // namespace zinf
