// cudax/runtime.h — the executor's CUDA runtime over host memory, as the library fakes (cuBLAS,
// cuBLASLt, NCCL) and the executor's own tests see it. The CUDA API itself (cudaMalloc, streams,
// events, ...) is NVIDIA's declarations from <cuda_runtime_api.h>, implemented in runtime.cpp.
//
// Memory: every "device" allocation is host memory recorded in one registry with its kind, so a
// copy or a library call can be checked against where its pointers really live; device memory is
// closed to host code (DeviceAccess, below).
// Streams: each created stream is a worker thread running its work in order, with a seeded random
// delay before each item (ZINF_CUDAX_JITTER=0 turns it off; ZINF_CUDAX_SEED picks the seed). Stream
// 0 (the legacy default stream) runs its work on the calling thread, in call order.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace zinf::cudax {

enum class MemKind {
  pageable,    // not known to CUDA: plain host memory
  device,      // cudaMalloc
  pinned,      // cudaHostAlloc / cudaMallocHost
  registered,  // cudaHostRegister
};
const char* to_string(MemKind k);

struct MemRange {
  MemKind kind = MemKind::pageable;
  const void* base = nullptr;  // the allocation holding the pointer (nullptr for pageable)
  std::size_t size = 0;        // its size in bytes
};

// Where p lives. Thread-safe.
MemRange where(const void* p);

// True when [p, p + bytes) lies inside one device allocation.
bool is_device_range(const void* p, std::size_t bytes);

// Device memory is guarded as a GPU's is: host code that reads or writes it faults, with one
// "cudax:" line naming the access, the allocation and the offset (device_memory.cpp). Only device
// work may touch it — what runs through enqueue (kernels, copies, memsets, the library fakes'
// work) and the runtime's own accesses — and that runs inside a DeviceAccess scope. A library fake
// that hands device work to threads of its own opens one on each of them.
// ZINF_CUDAX_GUARD picks how: auto (default: pkey where the CPU and kernel have protection keys,
// else arena), pkey, arena, or off.
//   pkey:  per thread and exact (a scope opens device memory to its own thread only);
//   arena: device memory is inaccessible while no scope is open anywhere in the process, and open
//          to every thread while one is, so a host access made while device work runs elsewhere is
//          not caught.
enum class Guard { off, arena, pkey };
Guard guard();
// How many times the arena guard has changed the arena's protection (its cost: one mprotect each).
std::uint64_t guard_transitions();
class DeviceAccess {
 public:
  DeviceAccess();
  ~DeviceAccess();
  DeviceAccess(const DeviceAccess&) = delete;
  DeviceAccess& operator=(const DeviceAccess&) = delete;
};

// Runs fn in stream order on s, on s's worker (or, for stream 0, on the calling thread before this
// returns). fn returns cudaSuccess or an error; an error becomes the stream's sticky error, reported
// by the next cudaStreamSynchronize / cudaGetLastError, like an asynchronous CUDA failure.
// Returns cudaErrorInvalidResourceHandle for a destroyed or unknown stream.
cudaError_t enqueue(cudaStream_t s, std::function<cudaError_t()> fn);

// Records an error on the calling thread, as a failed launch does (read by cudaGetLastError).
void set_last_error(cudaError_t e);

// How the scheduler orders the threads of a block (and the blocks of a grid) between collectives:
// ZINF_CUDAX_ORDER=fifo (default) | lifo | random (seeded by ZINF_CUDAX_SEED and the launch count);
// set_order changes it for the launches that follow (the executor's own tests).
enum class Order { fifo, lifo, random };
Order order();
void set_order(Order o);

// Primary contexts: bit d is set once device d's primary context has been made or used by a call that
// needs one (the rules are in runtime.cpp, "devices and their primary contexts": from CUDA 12 on
// cudaSetDevice makes it; cudaGetDeviceCount and cudaGetDeviceProperties never do), since the process
// started or forget_contexts(). So a test can check that a process touched only its own GPU.
std::uint64_t context_devices();
void forget_contexts();

// The number of devices reported: ZINF_CUDAX_DEVICES (default 1, at most 64), or n for the calls that
// follow (the executor's own tests; 0 returns to ZINF_CUDAX_DEVICES).
void set_device_count(int n);

// The seed the run uses for jitter and random thread orders (ZINF_CUDAX_SEED, default 1).
unsigned long seed();

// The calls that cost a GPU time when a training step makes them, counted since the process
// started (every thread): a test reads them around steps to check that a steady step allocates
// nothing, never drains the device, and copies only between device and pinned memory.
struct ApiCounts {
  std::uint64_t launches = 0;         // kernels launched (the library fakes' work not included)
  std::uint64_t device_allocs = 0;    // cudaMalloc (on a GPU: slow, and it may synchronise)
  std::uint64_t device_frees = 0;     // cudaFree (on a GPU: synchronises the device)
  std::uint64_t pinned_allocs = 0;    // cudaHostAlloc / cudaMallocHost / cudaHostRegister
  std::uint64_t device_syncs = 0;     // cudaDeviceSynchronize
  std::uint64_t stream_syncs = 0;     // cudaStreamSynchronize
  std::uint64_t event_syncs = 0;      // cudaEventSynchronize
  std::uint64_t pageable_copies = 0;  // async copies to or from pageable host memory (staged, not async)
  std::uint64_t blocking_copies = 0;  // cudaMemcpy, which waits for the copy and the legacy stream
};
ApiCounts api_counts();

}  // namespace zinf::cudax
