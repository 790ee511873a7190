// device_flags.cuh — the flags zinf creates its CUDA contexts with.
#pragma once

#include <cuda_runtime.h>

namespace zinf::cuda {

// Makes the current device's (primary) context block a host thread that waits on the GPU — a stream
// or device synchronisation, an event without its own flag — in the driver instead of spinning on
// a core: the host threads that wait beside cpu_adam's Update (the gradient path's d2h syncs, the
// trainer's) would otherwise each take a core from it. Call it before anything creates the context
// (the first cudaMalloc, cudaMemGetInfo, stream or event). A context that is already active keeps
// the flags it was made with: the driver answers cudaErrorSetOnActiveProcess, which is tolerated
// (a library made it first; waits spin there, nothing is wrong). Returns any other error, cleared.
inline cudaError_t request_blocking_sync() {
  const cudaError_t e = cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync);
  if (e == cudaSuccess) return e;
  (void)cudaGetLastError();  // not sticky; leave no error behind for the next check
  return e == cudaErrorSetOnActiveProcess ? cudaSuccess : e;
}

}  // namespace zinf::cuda
