// cuda_ops_none.cpp — make_cuda_ops in a build without CUDA.
#include "model/cuda/cuda_ops.h"
#include "zinf/error.h"

namespace zinf::cuda {

std::unique_ptr<OpsBackend> make_cuda_ops(Device&, Precision) {
  throw Error("CUDA ops: this zinf was built without CUDA", "configure with -DZINF_CUDA=ON on a machine with nvcc");
}

}  // namespace zinf::cuda
