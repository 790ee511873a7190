// check.cuh — launch checking for the op kernels: every launch_<op> calls ZINF_CUDA_LAUNCH_CHECK so
// a bad configuration fails at the call that caused it, with its name.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "zinf/error.h"

#define ZINF_CUDA_LAUNCH_CHECK(name)                                                                     \
  do {                                                                                                   \
    const cudaError_t e_ = cudaGetLastError();                                                           \
    if (e_ != cudaSuccess) throw ::zinf::Error(std::string(name) + " launch failed: " + cudaGetErrorString(e_)); \
  } while (0)

namespace zinf::cuda::ops {
inline unsigned blocks_for(std::size_t n, unsigned threads) { return static_cast<unsigned>((n + threads - 1) / threads); }
}  // namespace zinf::cuda::ops
