// cuda_check.cuh — CUDA error checks for every .cu file (the only header here with CUDA types;
// plain C++ never includes it). ZINF_CUDA(call) throws zinf::Error naming the call and the error;
// every launch_<op> calls ZINF_CUDA_LAUNCH_CHECK so a bad configuration fails at the call that
// caused it, with its name.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <utility>

#include "zinf/error.h"

#ifdef ZINF_CUDA_EXECUTOR
#include "cudax/launch.h"
#endif

namespace zinf::cuda {
inline void check_call(cudaError_t e, const char* call) {
  if (e != cudaSuccess) throw ::zinf::Error(std::string(call) + " failed: " + cudaGetErrorString(e));
}
}  // namespace zinf::cuda
#define ZINF_CUDA(x) ::zinf::cuda::check_call((x), #x)

namespace zinf::cuda {
// launch(kernel, grid, block, smem_bytes, stream, args...) is the one place in src/backends/cuda that
// launches a kernel: every launch_<op> goes through it instead of writing the triple-chevron launch
// itself, so the executor build (g++ with ZINF_CUDA_EXECUTOR, no nvcc) can swap in cudax::launch and
// run the same kernels on the CPU. The kernel is taken as a function pointer (a template-id such as
// kernel<S, 4, 32> decays to one); args convert to its parameters just as in a direct launch.
// Errors surface as before: the caller's ZINF_CUDA_LAUNCH_CHECK reads cudaGetLastError().
template <typename... P, typename... A>
inline void launch(void (*kernel)(P...), dim3 grid, dim3 block, std::size_t smem_bytes, cudaStream_t stream,
                   A&&... args) {
#ifdef ZINF_CUDA_EXECUTOR
  ::zinf::cudax::launch(kernel, grid, block, smem_bytes, stream, std::forward<A>(args)...);
#else
  kernel<<<grid, block, smem_bytes, stream>>>(std::forward<A>(args)...);
#endif
}
}  // namespace zinf::cuda

// ZINF_DYNAMIC_SHARED(name) declares `name`, the kernel's 128-byte-aligned dynamic shared memory (the
// smem_bytes of its launch), as unsigned char. Under nvcc it is the usual extern __shared__ array;
// under ZINF_CUDA_EXECUTOR it is a pointer to the executor's per-block buffer, so never take
// sizeof(name): use the byte count the launch passed.
#ifdef ZINF_CUDA_EXECUTOR
#define ZINF_DYNAMIC_SHARED(name) unsigned char* const name = ::zinf::cudax::dynamic_shared()
#else
#define ZINF_DYNAMIC_SHARED(name) extern __shared__ __align__(128) unsigned char name[]
#endif

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
