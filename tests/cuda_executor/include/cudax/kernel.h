// cudax/kernel.h — what a .cu file sees when the executor build compiles it as C++ (g++ -include
// this header). It gives CUDA's kernel vocabulary a meaning on the CPU:
//   - __global__/__device__/__host__ are plain functions; __launch_bounds__ is dropped;
//   - __shared__ variables are `static thread_local`: one block runs entirely on one OS thread (its
//     CUDA threads are fibers of that thread), so every thread of the block sees one copy, and blocks
//     running at the same time on other OS threads have their own;
//   - threadIdx/blockIdx/blockDim/gridDim read the running fiber's and block's coordinates;
//   - __syncthreads, the _sync warp functions and wmma (<mma.h>, the executor's own) are collective
//     operations of the scheduler (kernel.cpp), checked for divergence;
//   - the device math the kernels use maps to the host's libm, and CUDA's approximate functions
//     are approximations within their documented error (below).
// NVIDIA's own headers give the runtime API types and the __half / __nv_bfloat16 host conversions
// with their rounding. Only the project's .cu sources and the executor's tests include this.
#pragma once

#define __global__
#define __device__
#define __host__
#define __shared__ static thread_local
#define __launch_bounds__(...)

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace zinf::cudax {

// The running CUDA thread (a fiber) and its block; set by the scheduler before it resumes a fiber.
struct Coordinates {
  uint3 thread_idx;
  uint3 block_idx;
  dim3 block_dim;
  dim3 grid_dim;
};
// constinit: no dynamic initialisation, so every read is a plain TLS load (no wrapper call; GCC 12's
// UBSan null check on the wrapper's result misfires inside a kernel).
extern thread_local constinit const Coordinates* tl_coords;

// Collectives: each returns once every thread it names has arrived (or reports the divergence and
// ends the kernel). `site` is the caller's file and line, named in reports.
struct Site {
  const char* file;
  int line;
};
void syncthreads(Site site);
void syncwarp(unsigned mask, Site site);
// One warp exchange: every lane in `mask` contributes `value`; returns the value of lane `src(lane)`
// (computed by the caller's mode and width rule) as raw bytes.
enum class ShuffleMode { index, up, down, bfly };
std::uint64_t shuffle(unsigned mask, std::uint64_t value, int lane_arg, int width, ShuffleMode mode, Site site);
// ballot over `mask`: bit i set when lane i's predicate is true.
unsigned ballot(unsigned mask, bool predicate, Site site);
// The lanes of the caller's warp that have not exited.
unsigned activemask();
// Ends the kernel with a launch failure and the message (an invalid operation inside a kernel).
[[noreturn]] void kernel_fault(Site site, const char* what);
// The launch's dynamic shared memory (its size as launched; at least 128-byte aligned).
unsigned char* dynamic_shared();

template <typename T>
inline std::uint64_t to_raw(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "shuffles move at most 8 bytes");
  std::uint64_t r = 0;
  std::memcpy(&r, &v, sizeof(T));
  return r;
}
template <typename T>
inline T from_raw(std::uint64_t r) {
  T v;
  std::memcpy(&v, &r, sizeof(T));
  return v;
}
// A shuffle's width argument, 32 when left out (warpSize, its default in CUDA).
constexpr int width_or_32() { return 32; }
constexpr int width_or_32(int w) { return w; }

template <typename T>
inline T shfl(unsigned mask, T v, int lane_arg, int width, ShuffleMode m, Site s) {
  return from_raw<T>(shuffle(mask, to_raw(v), lane_arg, width, m, s));
}

}  // namespace zinf::cudax

#define ZINF_CUDAX_SITE (::zinf::cudax::Site{__FILE__, __LINE__})
#define threadIdx (::zinf::cudax::tl_coords->thread_idx)
#define blockIdx (::zinf::cudax::tl_coords->block_idx)
#define blockDim (::zinf::cudax::tl_coords->block_dim)
#define gridDim (::zinf::cudax::tl_coords->grid_dim)
#define warpSize 32
#define __syncthreads() ::zinf::cudax::syncthreads(ZINF_CUDAX_SITE)
#define __syncwarp(...) ::zinf::cudax::syncwarp(ZINF_CUDAX_SYNCWARP_MASK(__VA_ARGS__), ZINF_CUDAX_SITE)
#define ZINF_CUDAX_SYNCWARP_MASK(...) (0xFFFFFFFFu __VA_OPT__(& (__VA_ARGS__)))
#define __shfl_sync(mask, v, src, ...) \
  ::zinf::cudax::shfl((mask), (v), (src), ::zinf::cudax::width_or_32(__VA_ARGS__), ::zinf::cudax::ShuffleMode::index, ZINF_CUDAX_SITE)
#define __shfl_up_sync(mask, v, d, ...) \
  ::zinf::cudax::shfl((mask), (v), (d), ::zinf::cudax::width_or_32(__VA_ARGS__), ::zinf::cudax::ShuffleMode::up, ZINF_CUDAX_SITE)
#define __shfl_down_sync(mask, v, d, ...) \
  ::zinf::cudax::shfl((mask), (v), (d), ::zinf::cudax::width_or_32(__VA_ARGS__), ::zinf::cudax::ShuffleMode::down, ZINF_CUDAX_SITE)
#define __shfl_xor_sync(mask, v, m, ...) \
  ::zinf::cudax::shfl((mask), (v), (m), ::zinf::cudax::width_or_32(__VA_ARGS__), ::zinf::cudax::ShuffleMode::bfly, ZINF_CUDAX_SITE)
#define __ballot_sync(mask, p) ::zinf::cudax::ballot((mask), static_cast<bool>(p), ZINF_CUDAX_SITE)
#define __any_sync(mask, p) (::zinf::cudax::ballot((mask), static_cast<bool>(p), ZINF_CUDAX_SITE) != 0u)
#define __all_sync(mask, p) (::zinf::cudax::ballot((mask), !static_cast<bool>(p), ZINF_CUDAX_SITE) == 0u)
#define __activemask() ::zinf::cudax::activemask()

// The device math the kernels call, where the host has no function of that name. The standard
// functions (expf, logf, tanhf, sqrtf, ...) are the host libm's: sqrtf correctly rounded as on a
// GPU, the others within an ulp where the GPU's are within one or two.
//
// CUDA's approximate functions are approximations here too: each returns the correctly rounded
// result moved by a deterministic number of ulps (a hash of its argument bits, so runs repeat) up
// to the bound NVIDIA documents (CUDA C++ Programming Guide, "Mathematical Functions"), so code that
// relies on them being exact shows it on the executor as it would on a GPU:
//   rsqrtf(x)       2 ulp;
//   __fdividef(x,y) 2 ulp for 2^-126 <= |y| <= 2^126; for 2^126 < |y| < 2^128 it returns 0 (NaN for
//                   an infinite x), as the GPU's does; exact for a subnormal y (no bound documented);
//   __expf(x)       2 + floor(|1.173 x|) ulp.
// The correctly rounded ones stay exact: __frcp_rn, __fdiv_rn, __fsqrt_rn, __fadd_rn, __fsub_rn,
// __fmul_rn, __fmaf_rn (the host rounds to nearest, as their _rn asks), and __saturatef (a clamp to
// [+0, 1]; NaN gives +0). The other fast intrinsics (__logf, __log2f, __log10f, __exp10f, __sinf,
// __cosf, __tanf, __sincosf, __powf, __frsqrt_rn) are refused at compile time: glibc's <math.h>
// declares functions of those names (exact ones), which a kernel would otherwise call unnoticed.
namespace zinf::cudax::approx {
// A hash of the argument bits (the murmur3 finaliser).
inline std::uint32_t mix(std::uint32_t a, std::uint32_t b = 0x9E3779B9u) {
  std::uint32_t h = a ^ (b * 0x85EBCA6Bu);
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  h ^= h >> 16;
  return h;
}
inline std::uint32_t bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
// r (correctly rounded) moved by k adjacent floats away from or towards zero, |k| <= max_ulps, k
// picked by h. Zeros, subnormals, infinities and NaNs stay as they are, and so does a result that the
// move would take out of the normal range.
inline float within_ulps(float r, std::uint32_t max_ulps, std::uint32_t h) {
  if (!std::isnormal(r) || max_ulps == 0) return r;
  const std::int64_t k = static_cast<std::int64_t>(h % (2 * static_cast<std::uint64_t>(max_ulps) + 1)) - max_ulps;
  const std::int64_t mag = static_cast<std::int64_t>(bits(r) & 0x7FFFFFFFu) + k;
  if (mag < 0x00800000 || mag >= 0x7F800000) return r;
  const std::uint32_t u = (bits(r) & 0x80000000u) | static_cast<std::uint32_t>(mag);
  float v;
  std::memcpy(&v, &u, 4);
  return v;
}
inline constexpr std::uint32_t kRsqrtUlps = 2, kFdividefUlps = 2;
inline std::uint32_t expf_ulps(float x) { return 2u + static_cast<std::uint32_t>(std::floor(std::fabs(1.173 * x))); }
template <typename...>
inline constexpr bool refused = false;
}  // namespace zinf::cudax::approx

inline float rsqrtf(float x) {
  const float r = static_cast<float>(1.0 / std::sqrt(static_cast<double>(x)));
  return ::zinf::cudax::approx::within_ulps(r, ::zinf::cudax::approx::kRsqrtUlps, ::zinf::cudax::approx::mix(::zinf::cudax::approx::bits(x)));
}
inline float __fdividef(float x, float y) {
  namespace ap = ::zinf::cudax::approx;
  const float ay = std::fabs(y);
  if (ay > 0x1p126f && ay < INFINITY) return std::isinf(x) ? NAN : (std::signbit(x) != std::signbit(y) ? -0.0f : 0.0f);
  if (ay < 0x1p-126f) return x / y;
  return ap::within_ulps(x / y, ap::kFdividefUlps, ap::mix(ap::bits(x), ap::bits(y)));
}
#define __expf(x) ::zinf::cudax::approx::expf_emulated(x)
namespace zinf::cudax::approx {
inline float expf_emulated(float x) {
  const float r = static_cast<float>(std::exp(static_cast<double>(x)));
  return within_ulps(r, expf_ulps(x), mix(bits(x), 0x2545F491u));
}
}  // namespace zinf::cudax::approx
inline float __saturatef(float x) { return x > 0.0f ? (x < 1.0f ? x : 1.0f) : 0.0f; }  // NaN: +0
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fdiv_rn(float x, float y) { return x / y; }
inline float __fsqrt_rn(float x) { return std::sqrt(x); }
inline float __fadd_rn(float x, float y) { return x + y; }
inline float __fsub_rn(float x, float y) { return x - y; }
inline float __fmul_rn(float x, float y) { return x * y; }
inline float __fmaf_rn(float x, float y, float z) { return std::fma(x, y, z); }
#define ZINF_CUDAX_REFUSE(name)                                                                            \
  namespace zinf::cudax::approx {                                                                          \
  template <typename... A>                                                                                 \
  inline float refused_##name(A...) {                                                                      \
    static_assert(refused<A...>, "cudax: " #name " is not emulated: the GPU's is an approximation whose "  \
                                 "error the executor does not reproduce; add it to cudax/kernel.h with its " \
                                 "documented bound, or call the standard function");                       \
    return 0.0f;                                                                                           \
  }                                                                                                        \
  }
ZINF_CUDAX_REFUSE(__logf)
ZINF_CUDAX_REFUSE(__log2f)
ZINF_CUDAX_REFUSE(__log10f)
ZINF_CUDAX_REFUSE(__exp10f)
ZINF_CUDAX_REFUSE(__sinf)
ZINF_CUDAX_REFUSE(__cosf)
ZINF_CUDAX_REFUSE(__tanf)
ZINF_CUDAX_REFUSE(__sincosf)
ZINF_CUDAX_REFUSE(__powf)
ZINF_CUDAX_REFUSE(__frsqrt_rn)
#undef ZINF_CUDAX_REFUSE
#define __logf(...) ::zinf::cudax::approx::refused___logf(__VA_ARGS__)
#define __log2f(...) ::zinf::cudax::approx::refused___log2f(__VA_ARGS__)
#define __log10f(...) ::zinf::cudax::approx::refused___log10f(__VA_ARGS__)
#define __exp10f(...) ::zinf::cudax::approx::refused___exp10f(__VA_ARGS__)
#define __sinf(...) ::zinf::cudax::approx::refused___sinf(__VA_ARGS__)
#define __cosf(...) ::zinf::cudax::approx::refused___cosf(__VA_ARGS__)
#define __tanf(...) ::zinf::cudax::approx::refused___tanf(__VA_ARGS__)
#define __sincosf(...) ::zinf::cudax::approx::refused___sincosf(__VA_ARGS__)
#define __powf(...) ::zinf::cudax::approx::refused___powf(__VA_ARGS__)
#define __frsqrt_rn(...) ::zinf::cudax::approx::refused___frsqrt_rn(__VA_ARGS__)
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll(static_cast<unsigned long long>(x)); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline float __int_as_float(int x) { float f; std::memcpy(&f, &x, 4); return f; }
inline int __float_as_int(float f) { int x; std::memcpy(&x, &f, 4); return x; }
inline float __uint_as_float(unsigned x) { float f; std::memcpy(&f, &x, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned x; std::memcpy(&x, &f, 4); return x; }
// CUDA's overloaded min/max for the integer and float types (the device headers' set).
#define ZINF_CUDAX_MINMAX(T)                          \
  inline T max(T a, T b) { return a > b ? a : b; }    \
  inline T min(T a, T b) { return a < b ? a : b; }
ZINF_CUDAX_MINMAX(int)
ZINF_CUDAX_MINMAX(unsigned)
ZINF_CUDAX_MINMAX(long)
ZINF_CUDAX_MINMAX(unsigned long)
ZINF_CUDAX_MINMAX(long long)
ZINF_CUDAX_MINMAX(unsigned long long)
#undef ZINF_CUDAX_MINMAX
inline float max(float a, float b) { return std::fmax(a, b); }
inline float min(float a, float b) { return std::fmin(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }

// cudaFuncSetAttribute on a kernel itself (NVIDIA's header has this overload only under nvcc).
template <typename... P>
inline cudaError_t cudaFuncSetAttribute(void (*kernel)(P...), cudaFuncAttribute attr, int value) {
  return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), attr, value);
}

#include "cudax/launch.h"
