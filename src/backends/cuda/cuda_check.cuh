// zinf/cuda_check.cuh — CUDA error checks for every .cu file (the only header here with CUDA types;
// plain C++ never includes it). ZINF_CUDA(call) throws zinf::Error naming the call and the error;
// every launch_<op> calls ZINF_CUDA_LAUNCH_CHECK so a bad configuration fails at the call that
// caused it, with its name.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "zinf/error.h"

namespace zinf::cuda {
inline void check_call(cudaError_t e, const char* call) {
  if (e != cudaSuccess) throw ::zinf::Error(std::string(call) + " failed: " + cudaGetErrorString(e));
}
}  // namespace zinf::cuda
#define ZINF_CUDA(x) ::zinf::cuda::check_call((x), #x)

#define ZINF_CUDA_LAUNCH_CHECK(name)                                                                             \
  do {                                                                                                           \
    const cudaError_t e_ = cudaGetLastError();                                                                   \
    if (e_ != cudaSuccess) throw ::zinf::Error(std::string(name) + " launch failed: " + cudaGetErrorString(e_)); \
  } while (0)

namespace zinf::cuda::ops {
inline unsigned blocks_for(std::size_t n, unsigned threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}
}  // namespace zinf::cuda::ops
