// internal.h — what the executor's own files share and nothing else includes: the launch limits of
// the GPU it imitates, the per-kernel attributes, and the run-time choices read from the environment.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>
#include <cstdint>
#include <string>

#include "cudax/runtime.h"

// ZINF_CUDAX_ASAN: this build uses AddressSanitizer. The executor then tells it about every fiber
// switch (so a fiber's stack is its own), and marks the bytes past each allocation's requested size
// (device, pinned, a launch's dynamic shared memory) as poisoned, so a kernel or copy that reads or
// writes past its buffer is reported with its line, as compute-sanitizer's memcheck would on a GPU.
#if defined(__SANITIZE_ADDRESS__)
#define ZINF_CUDAX_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ZINF_CUDAX_ASAN 1
#endif
#endif
#ifndef ZINF_CUDAX_ASAN
#define ZINF_CUDAX_ASAN 0
#endif
#if ZINF_CUDAX_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

namespace zinf::cudax {

// The device the executor reports and checks launches against: an sm_90 part (H100/H200 class).
inline constexpr int kMajor = 9, kMinor = 0;
inline constexpr int kMultiprocessors = 132;
inline constexpr unsigned kMaxThreadsPerBlock = 1024;
inline constexpr unsigned kMaxBlockDim[3] = {1024, 1024, 64};
inline constexpr unsigned kMaxGridDim[3] = {2147483647u, 65535u, 65535u};
inline constexpr std::size_t kDefaultDynamicSmem = 48 * 1024;  // without cudaFuncSetAttribute
inline constexpr std::size_t kMaxSmemPerBlockOptin = 232448;   // 227 KiB on sm_90
inline constexpr std::size_t kSmemPerMultiprocessor = 233472;  // 228 KiB

// The dynamic shared memory limit set for `kernel` by cudaFuncSetAttribute (kDefaultDynamicSmem when
// never set).
std::size_t max_dynamic_smem(const void* kernel);

struct LaunchShape;
// Runs every block of the grid on the calling thread (kernel.cpp); a fault is reported with the
// kernel's `name` and returns cudaErrorLaunchFailure.
cudaError_t run_grid(const LaunchShape& shape, const std::function<void()>& body, const std::string& name);

// Prints one line to stderr, prefixed "cudax: " (kernel faults, misuse of the runtime).
void report(const std::string& line);

// ZINF_CUDAX_MEMORY_MIB in bytes: what cudaMalloc may hand out in all (runtime.cpp).
std::size_t memory_budget();

// The device memory arena (device_memory.cpp): `bytes` rounded up to 256, 256-byte aligned, closed
// to host code outside a DeviceAccess scope; nullptr when the arena is full.
void* device_memory_allocate(std::size_t bytes);
void device_memory_free(void* p, std::size_t bytes);
bool in_device_arena(const void* p);
// For the fault handler: which allocation holds address a and at what offset ("byte 8 of the
// 64-byte device allocation at 0x..."), or that none does. Takes no lock it could wait on (runtime.cpp).
void describe_device_address(std::uintptr_t a, char* out, std::size_t n) noexcept;

// Under AddressSanitizer: [p, p + size) addressable, [p + size, p + capacity) poisoned. Nothing
// otherwise.
inline void poison_tail(void* p, std::size_t size, std::size_t capacity) {
#if ZINF_CUDAX_ASAN
  ASAN_UNPOISON_MEMORY_REGION(p, size);
  if (capacity > size) ASAN_POISON_MEMORY_REGION(static_cast<unsigned char*>(p) + size, capacity - size);
#else
  (void)p, (void)size, (void)capacity;
#endif
}

}  // namespace zinf::cudax
