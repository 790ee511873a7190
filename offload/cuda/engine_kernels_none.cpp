// engine_kernels_none.cpp — make_engine_kernels in a build without CUDA.
#include "zinf/offload/cuda_kernels.h"
#include "zinf/error.h"

namespace zinf::cuda {

std::unique_ptr<offload::DeviceKernels> make_engine_kernels(Device&) {
  throw Error("CUDA engine kernels: this zinf was built without CUDA");
}

}  // namespace zinf::cuda
