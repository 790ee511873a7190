// device_cuda_none.cpp — make_cuda_device in a build without CUDA.
#include "zinf/device.h"

namespace zinf {

std::unique_ptr<Device> make_cuda_device(int, std::size_t) {
  throw Error("CUDA device: this zinf was built without CUDA", "configure with -DZINF_CUDA=ON on a machine with nvcc");
}

}  // namespace zinf
