// zinf/host_device.h — ZINF_HD marks a function that is compiled for the host and, under nvcc, for
// CUDA kernels too: the arithmetic written once for a CPU implementation and its kernel.
#pragma once

#if defined(__CUDACC__)
#define ZINF_HD __host__ __device__
#else
#define ZINF_HD
#endif
