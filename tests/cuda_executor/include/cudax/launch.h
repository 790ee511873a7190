// cudax/launch.h — a kernel launch on the executor. zinf::cuda::launch (the one launch helper of the
// CUDA sources) forwards here in the executor build. The arguments are converted to the kernel's
// parameter types and copied once, as a CUDA launch copies them; every CUDA thread of the grid then
// calls the kernel with them, as a fiber of the scheduler (kernel.cpp), in stream order on `stream`.
// A launch the GPU would refuse (block or grid dimensions out of range, too much dynamic shared
// memory for the kernel's attribute) does not run and sets the error cudaGetLastError returns.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

namespace zinf::cudax {

struct LaunchShape {
  dim3 grid;
  dim3 block;
  std::size_t dynamic_smem = 0;
};

// Checks `shape` for `kernel` (its address identifies it for cudaFuncSetAttribute), then runs `body`
// once per CUDA thread in stream order on `stream`. Returns the launch's error and records it for
// cudaGetLastError.
cudaError_t launch_body(const void* kernel, const LaunchShape& shape, cudaStream_t stream, std::function<void()> body);

template <typename... P, typename... A>
void launch(void (*kernel)(P...), dim3 grid, dim3 block, std::size_t dynamic_smem, cudaStream_t stream, A&&... args) {
  static_assert(sizeof...(P) == sizeof...(A), "a kernel launch passes one argument per parameter");
  std::tuple<std::decay_t<P>...> params(static_cast<std::decay_t<P>>(std::forward<A>(args))...);
  launch_body(reinterpret_cast<const void*>(kernel), LaunchShape{grid, block, dynamic_smem}, stream,
              [kernel, params] { std::apply(kernel, params); });
}

}  // namespace zinf::cudax
