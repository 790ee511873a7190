// The executor's builtins, one test per documented behaviour: coordinates, shared memory,
// __syncthreads, the warp shuffles (every mode and width), ballot/any/all, wmma in every layout the
// kernels use, the launch limits a GPU enforces, the copy rules and stream ordering of the runtime.
// Each expected value is worked out from CUDA's definition in the test itself, never taken from the
// executor. Compiled like a .cu file of the executor build (cudax/kernel.h first).
#include <gtest/gtest.h>
#include <mma.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/child_run.h"
#include "cudax/runtime.h"

namespace {

using zinf::cudax::launch;

template <typename T>
T* device_alloc(std::size_t n) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, n * sizeof(T)), cudaSuccess);
  return static_cast<T*>(p);
}
template <typename T>
std::vector<T> to_host(const T* d, std::size_t n) {
  std::vector<T> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}
template <typename T>
void to_device(T* d, const std::vector<T>& h) {
  EXPECT_EQ(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
}

// Runs `f` under each thread order, restoring fifo after.
template <typename F>
void for_each_order(F f) {
  for (auto o : {zinf::cudax::Order::fifo, zinf::cudax::Order::lifo, zinf::cudax::Order::random}) {
    zinf::cudax::set_order(o);
    f(o);
  }
  zinf::cudax::set_order(zinf::cudax::Order::fifo);
}

// A launch that faults: the error comes back at the next synchronisation, stderr names the sites,
// and the context is reset for the tests that follow.
template <typename Launch>
std::string expect_fault(Launch l) {
  testing::internal::CaptureStderr();
  l();
  const cudaError_t e = cudaDeviceSynchronize();
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(e, cudaErrorLaunchFailure) << err;
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure) << "the fault is sticky, as on a GPU";
  cudaDeviceReset();
  return err;
}

__global__ void coords_kernel(unsigned* out) {
  const unsigned tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned bid = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const unsigned nthreads = blockDim.x * blockDim.y * blockDim.z;
  out[bid * nthreads + tid] = (bid << 16) | tid;
}

TEST(Executor, CoordinatesCoverTheGridOnce) {
  const dim3 grid(3, 2, 2), block(4, 3, 2);
  const unsigned n = 12 * 24;
  unsigned* d = device_alloc<unsigned>(n);
  launch(coords_kernel, grid, block, 0, nullptr, d);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto h = to_host(d, n);
  for (unsigned i = 0; i < n; ++i) EXPECT_EQ(h[i], ((i / 24) << 16) | (i % 24)) << i;
  cudaFree(d);
}

template <int kThreads>
__global__ void block_sum(const float* x, float* out) {
  __shared__ float sm[kThreads];
  const int t = static_cast<int>(threadIdx.x);
  sm[t] = x[blockIdx.x * kThreads + t];
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (t < s) sm[t] += sm[t + s];
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = sm[0];
}
// The same reduction with the barrier inside the loop removed: its result depends on thread order.
template <int kThreads>
__global__ void block_sum_racy(const float* x, float* out) {
  __shared__ float sm[kThreads];
  const int t = static_cast<int>(threadIdx.x);
  sm[t] = x[blockIdx.x * kThreads + t];
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1)
    if (t < s) sm[t] += sm[t + s];
  __syncthreads();
  if (t == 0) out[blockIdx.x] = sm[0];
}

TEST(Executor, SharedMemoryIsOnePerBlockAndBarriersOrderIt) {
  constexpr int kThreads = 128, kBlocks = 5;
  std::vector<float> x(kThreads * kBlocks);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 97);
  float* dx = device_alloc<float>(x.size());
  float* dout = device_alloc<float>(kBlocks);
  to_device(dx, x);
  for_each_order([&](auto) {
    launch(block_sum<kThreads>, dim3(kBlocks), dim3(kThreads), 0, nullptr, dx, dout);
    const auto h = to_host(dout, kBlocks);
    for (int b = 0; b < kBlocks; ++b) {
      float want = 0;
      for (int i = 0; i < kThreads; ++i) want += x[static_cast<std::size_t>(b * kThreads + i)];
      EXPECT_EQ(h[static_cast<std::size_t>(b)], want) << "block " << b;
    }
  });
  cudaFree(dx);
  cudaFree(dout);
}

TEST(Executor, AMissingBarrierGivesAnotherResultUnderAnotherOrder) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "its kernel races on purpose: under ThreadSanitizer, ExecutorTsan.* is its case";
#endif
  constexpr int kThreads = 64;
  std::vector<float> x(kThreads);
  for (int i = 0; i < kThreads; ++i) x[static_cast<std::size_t>(i)] = static_cast<float>(i + 1);
  float* dx = device_alloc<float>(kThreads);
  float* dout = device_alloc<float>(1);
  to_device(dx, x);
  std::vector<float> got;
  for_each_order([&](auto) {
    launch(block_sum_racy<kThreads>, dim3(1), dim3(kThreads), 0, nullptr, dx, dout);
    got.push_back(to_host(dout, 1)[0]);
  });
  const float want = kThreads * (kThreads + 1) / 2.0f;
  // Under fifo thread 0 runs every pass before its partners have added theirs (a wrong sum); under
  // lifo the partners run first and the sum happens to come out right.
  EXPECT_NE(got[0], want);
  EXPECT_EQ(got[1], want);
  EXPECT_NE(got[0], got[1]);
  cudaFree(dx);
  cudaFree(dout);
}

constexpr int kFirstBarrierLine = __LINE__ + 4;
constexpr int kSecondBarrierLine = __LINE__ + 5;
__global__ void divergent_barrier(int* out) {
  if (threadIdx.x < 16) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1;
}
__global__ void barrier_after_return(int* out) {
  if (threadIdx.x >= 40) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}

TEST(Executor, ADivergentBarrierIsAFaultNamingBothCalls) {
  int* d = device_alloc<int>(64);
  const std::string err = expect_fault([&] { launch(divergent_barrier, dim3(1), dim3(64), 0, nullptr, d); });
  EXPECT_NE(err.find("divergent __syncthreads"), std::string::npos) << err;
  EXPECT_NE(err.find("executor_test.cpp:" + std::to_string(kFirstBarrierLine)), std::string::npos) << err;
  EXPECT_NE(err.find("executor_test.cpp:" + std::to_string(kSecondBarrierLine)), std::string::npos) << err;
  cudaFree(d);
}

TEST(Executor, ABarrierSomeThreadsNeverReachIsAFault) {
  int* d = device_alloc<int>(64);
  const std::string err = expect_fault([&] { launch(barrier_after_return, dim3(1), dim3(64), 0, nullptr, d); });
  EXPECT_NE(err.find("has returned"), std::string::npos) << err;
  cudaFree(d);
}

enum Op { kXor, kUp, kDown, kIdx };
template <Op kOp>
__global__ void shuffle_kernel(int* out, int arg, int width) {
  const int v = 1000 + static_cast<int>(threadIdx.x);
  int r = 0;
  if constexpr (kOp == kXor) r = __shfl_xor_sync(0xFFFFFFFFu, v, arg, width);
  if constexpr (kOp == kUp) r = __shfl_up_sync(0xFFFFFFFFu, v, static_cast<unsigned>(arg), width);
  if constexpr (kOp == kDown) r = __shfl_down_sync(0xFFFFFFFFu, v, static_cast<unsigned>(arg), width);
  if constexpr (kOp == kIdx) r = __shfl_sync(0xFFFFFFFFu, v, arg, width);
  out[threadIdx.x] = r;
}

// The source lane of each shuffle as the CUDA C++ Programming Guide defines it; a source outside the
// caller's segment of `width` lanes (for xor: in a later segment) yields the caller's own value.
int expected_source(Op op, int lane, int arg, int width) {
  const int seg = lane / width * width;
  switch (op) {
    case kXor: { const int j = lane ^ arg; return j >= seg + width ? lane : j; }
    case kUp: return lane - seg - arg >= 0 ? lane - arg : lane;
    case kDown: return lane - seg + arg < width ? lane + arg : lane;
    case kIdx: return seg + arg % width;
  }
  return -1;
}

template <Op kOp>
void check_shuffle(int arg, int width) {
  int* d = device_alloc<int>(64);
  launch(shuffle_kernel<kOp>, dim3(1), dim3(64), 0, nullptr, d, arg, width);
  const auto h = to_host(d, 64);
  for (int t = 0; t < 64; ++t) {
    const int lane = t % 32, warp = t / 32;
    EXPECT_EQ(h[static_cast<std::size_t>(t)], 1000 + warp * 32 + expected_source(kOp, lane, arg, width))
        << "op " << kOp << " arg " << arg << " width " << width << " thread " << t;
  }
  cudaFree(d);
}

TEST(Executor, ShufflesFollowTheirDefinitionInEveryWidth) {
  for (int width : {32, 16, 8, 4}) {
    for (int m : {1, 2, 4, 8, 16}) check_shuffle<kXor>(m, width);
    for (int d : {1, 3, 8}) {
      check_shuffle<kUp>(d, width);
      check_shuffle<kDown>(d, width);
    }
    for (int s : {0, 5, 31}) check_shuffle<kIdx>(s, width);
  }
  // Hand-worked: xor 16 across a full warp swaps the halves; up 1 leaves lane 0 alone.
  int* d = device_alloc<int>(64);
  launch(shuffle_kernel<kXor>, dim3(1), dim3(64), 0, nullptr, d, 16, 32);
  auto h = to_host(d, 64);
  EXPECT_EQ(h[0], 1016);
  EXPECT_EQ(h[17], 1001);
  EXPECT_EQ(h[40], 1056);
  launch(shuffle_kernel<kUp>, dim3(1), dim3(64), 0, nullptr, d, 1, 32);
  h = to_host(d, 64);
  EXPECT_EQ(h[0], 1000);
  EXPECT_EQ(h[1], 1000);
  EXPECT_EQ(h[32], 1032);
  cudaFree(d);
}

__global__ void vote_kernel(unsigned* out) {
  const unsigned lane = threadIdx.x % 32;
  const bool odd = lane % 2 == 1;
  if (lane < 16) {  // only the low half takes part, with its own mask
    out[threadIdx.x * 4 + 0] = __ballot_sync(0x0000FFFFu, odd);
    out[threadIdx.x * 4 + 1] = __any_sync(0x0000FFFFu, lane == 3);
    out[threadIdx.x * 4 + 2] = __all_sync(0x0000FFFFu, lane < 16);
    out[threadIdx.x * 4 + 3] = __all_sync(0x0000FFFFu, odd);
  } else {
    out[threadIdx.x * 4 + 0] = __ballot_sync(0xFFFF0000u, lane >= 30);
    out[threadIdx.x * 4 + 1] = __any_sync(0xFFFF0000u, false);
    out[threadIdx.x * 4 + 2] = __all_sync(0xFFFF0000u, true);
    out[threadIdx.x * 4 + 3] = 7;
  }
}

TEST(Executor, VotesCountTheLanesOfTheirMask) {
  unsigned* d = device_alloc<unsigned>(32 * 4);
  launch(vote_kernel, dim3(1), dim3(32), 0, nullptr, d);
  const auto h = to_host(d, 32 * 4);
  EXPECT_EQ(h[0], 0x0000AAAAu);  // the odd lanes of 0..15
  EXPECT_EQ(h[1], 1u);
  EXPECT_EQ(h[2], 1u);
  EXPECT_EQ(h[3], 0u);
  EXPECT_EQ(h[16 * 4 + 0], 0xC0000000u);  // lanes 30 and 31
  EXPECT_EQ(h[16 * 4 + 1], 0u);
  for (int l = 16; l < 32; ++l) EXPECT_EQ(h[static_cast<std::size_t>(l * 4 + 2)], 1u) << "lane " << l;
  cudaFree(d);
}

// Since sm_70 each lane performs its collectives in program order: the low half-warp may shuffle
// among itself and then join a full-warp shuffle that the high half reaches first.
__global__ void nested_masks(int* out) {
  const int lane = static_cast<int>(threadIdx.x);
  int v = lane;
  if (lane < 16) v = __shfl_xor_sync(0x0000FFFFu, v, 1);  // pairs swap within the low half
  out[lane] = __shfl_sync(0xFFFFFFFFu, v, 31 - lane);
}

TEST(Executor, LanesMayTakePartInCollectivesOfOtherMasksInProgramOrder) {
  int* d = device_alloc<int>(32);
  for_each_order([&](auto) {
    launch(nested_masks, dim3(1), dim3(32), 0, nullptr, d);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto h = to_host(d, 32);
    for (int lane = 0; lane < 32; ++lane) {
      const int src = 31 - lane;
      EXPECT_EQ(h[static_cast<std::size_t>(lane)], src < 16 ? (src ^ 1) : src) << "lane " << lane;
    }
  });
  cudaFree(d);
}

__global__ void shuffle_not_in_mask(int* out) {
  out[threadIdx.x] = __shfl_xor_sync(0x0000FFFFu, 1, 1);  // lanes 16..31 are not in the mask
}
__global__ void shuffle_partial_warp(int* out) { out[threadIdx.x] = __shfl_xor_sync(0xFFFFFFFFu, 1, 1); }

TEST(Executor, AShuffleByALaneOutsideItsMaskIsAFault) {
  int* d = device_alloc<int>(32);
  const std::string err = expect_fault([&] { launch(shuffle_not_in_mask, dim3(1), dim3(32), 0, nullptr, d); });
  EXPECT_NE(err.find("not in the mask"), std::string::npos) << err;
  cudaFree(d);
}

TEST(Executor, AFullMaskShuffleInAPartialWarpIsAFault) {
  int* d = device_alloc<int>(48);
  const std::string err = expect_fault([&] { launch(shuffle_partial_warp, dim3(1), dim3(48), 0, nullptr, d); });
  EXPECT_NE(err.find("do not exist"), std::string::npos) << err;
  cudaFree(d);
}

__global__ void dynamic_kernel(std::uintptr_t* out, int n) {
  unsigned char* smem = zinf::cudax::dynamic_shared();
  int* s = reinterpret_cast<int*>(smem);
  s[threadIdx.x] = static_cast<int>(threadIdx.x) * 3;
  __syncthreads();
  if (threadIdx.x == 0) {
    out[0] = reinterpret_cast<std::uintptr_t>(smem) % 128;
    long sum = 0;
    for (int i = 0; i < n; ++i) sum += s[i];
    out[1] = static_cast<std::uintptr_t>(sum);
  }
}

TEST(Executor, DynamicSharedMemoryHasItsLaunchSizeAndTheGpuLimits) {
  auto* d = device_alloc<std::uintptr_t>(2);
  launch(dynamic_kernel, dim3(1), dim3(256), 256 * sizeof(int), nullptr, d, 256);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto h = to_host(d, 2);
  EXPECT_EQ(h[0], 0u);
  EXPECT_EQ(h[1], 3u * 255 * 256 / 2);
  // Above 48 KiB only once the kernel's attribute allows it, and never above sm_90's 227 KiB.
  launch(dynamic_kernel, dim3(1), dim3(32), 48 * 1024 + 16, nullptr, d, 32);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  ASSERT_EQ(cudaFuncSetAttribute(dynamic_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 * 1024), cudaSuccess);
  launch(dynamic_kernel, dim3(1), dim3(32), 48 * 1024 + 16, nullptr, d, 32);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(cudaFuncSetAttribute(dynamic_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 232449),
            cudaErrorInvalidValue);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaFree(d);
}

TEST(Executor, LaunchesOutsideTheGpuLimitsAreRefused) {
  unsigned* d = device_alloc<unsigned>(1);
  struct Case {
    dim3 grid, block;
  };
  for (const Case& c : {Case{dim3(1), dim3(1025)}, Case{dim3(1), dim3(32, 33)}, Case{dim3(1), dim3(1, 1, 65)},
                        Case{dim3(0), dim3(32)}, Case{dim3(1, 65536), dim3(32)}, Case{dim3(1, 1, 65536), dim3(32)},
                        Case{dim3(1), dim3(0)}}) {
    launch(coords_kernel, c.grid, c.block, 0, nullptr, d);
    EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration)
        << c.grid.x << "x" << c.grid.y << "x" << c.grid.z << " blocks of " << c.block.x << "x" << c.block.y << "x"
        << c.block.z;
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "cudaGetLastError clears a launch error";
  }
  cudaFree(d);
}

// wmma: C = A·B + C0 for one 16x16x16 tile, A and B stored in the layout under test; the expected
// product is summed in double here.
template <typename T, typename LA, typename LB>
__global__ void wmma_kernel(float* c, const T* a, const T* b, const float* c0, unsigned ld, int c_col_major) {
  namespace wmma = nvcuda::wmma;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, T, LA> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LB> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
  const wmma::layout_t lc = c_col_major ? wmma::mem_col_major : wmma::mem_row_major;
  wmma::load_matrix_sync(fc, c0, ld, lc);
  wmma::load_matrix_sync(fa, a, ld);
  wmma::load_matrix_sync(fb, b, ld);
  wmma::mma_sync(fc, fa, fb, fc);
  wmma::store_matrix_sync(c, fc, ld, lc);
}

template <typename T, typename LA, typename LB>
void check_wmma(bool c_col_major) {
  constexpr unsigned ld = 24;  // a padded leading dimension, a multiple of 8 elements
  constexpr bool a_col = std::is_same_v<LA, nvcuda::wmma::col_major>, b_col = std::is_same_v<LB, nvcuda::wmma::col_major>;
  std::vector<T> a(16 * ld), b(16 * ld);
  std::vector<float> c0(16 * ld), av(256), bv(256);
  for (int i = 0; i < 16; ++i)
    for (int k = 0; k < 16; ++k) {
      const float x = static_cast<float>((i * 7 + k * 3) % 11) - 5.0f, y = static_cast<float>((i * 5 + k) % 9) - 4.0f;
      av[i * 16 + k] = x;  // A(i, k)
      bv[i * 16 + k] = y;  // B(i, k): row i of B is k of the product
      a[a_col ? i + k * ld : i * ld + k] = T(x);
      b[b_col ? i + k * ld : i * ld + k] = T(y);
    }
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) c0[c_col_major ? i + j * ld : i * ld + j] = static_cast<float>(i - j);
  T* da = device_alloc<T>(a.size());
  T* db = device_alloc<T>(b.size());
  float* dc0 = device_alloc<float>(c0.size());
  float* dc = device_alloc<float>(c0.size());
  to_device(da, a);
  to_device(db, b);
  to_device(dc0, c0);
  launch(wmma_kernel<T, LA, LB>, dim3(1), dim3(32), 0, nullptr, dc, da, db, dc0, ld, c_col_major ? 1 : 0);
  const auto c = to_host(dc, c0.size());
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      double want = i - j;
      for (int k = 0; k < 16; ++k) want += double(av[i * 16 + k]) * bv[k * 16 + j];
      EXPECT_EQ(c[c_col_major ? i + j * ld : i * ld + j], static_cast<float>(want))
          << "C(" << i << "," << j << ") a_col " << a_col << " b_col " << b_col << " c_col " << c_col_major;
    }
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc0);
  cudaFree(dc);
}

TEST(Executor, WmmaMultipliesInEveryLayoutAndType) {
  using namespace nvcuda::wmma;
  for (bool cc : {false, true}) {
    check_wmma<__half, row_major, row_major>(cc);
    check_wmma<__half, row_major, col_major>(cc);
    check_wmma<__half, col_major, row_major>(cc);
    check_wmma<__half, col_major, col_major>(cc);
    check_wmma<__nv_bfloat16, row_major, row_major>(cc);
    check_wmma<__nv_bfloat16, row_major, col_major>(cc);
    check_wmma<__nv_bfloat16, col_major, row_major>(cc);
    check_wmma<__nv_bfloat16, col_major, col_major>(cc);
  }
}

TEST(Executor, WmmaRefusesMisalignedPointersAndStrides) {
  using namespace nvcuda::wmma;
  __half* a = device_alloc<__half>(16 * 32 + 16);
  float* c = device_alloc<float>(16 * 32 + 16);
  std::string err = expect_fault([&] {
    launch(wmma_kernel<__half, row_major, row_major>, dim3(1), dim3(32), 0, nullptr, c, a + 4, a, c, 16u, 0);
  });
  EXPECT_NE(err.find("not 256-bit aligned"), std::string::npos) << err;
  err = expect_fault([&] {
    launch(wmma_kernel<__half, row_major, row_major>, dim3(1), dim3(32), 0, nullptr, c, a, a, c, 20u, 0);
  });
  EXPECT_NE(err.find("ldm"), std::string::npos) << err;
  cudaFree(a);
  cudaFree(c);
}

__global__ void math_kernel(float* f, int* i) {
  f[0] = __frcp_rn(2.0f);
  f[1] = max(1.5f, -2.0f);
  f[2] = min(1.5f, -2.0f);
  f[3] = max(__int_as_float(0x7FC00000), 3.0f);  // CUDA's float max is fmaxf: a NaN gives way
  f[4] = __fdiv_rn(1.0f, 8.0f);
  f[5] = __saturatef(1.5f);
  f[6] = __saturatef(__int_as_float(0x7FC00000));  // NaN saturates to +0
  i[0] = __clz(1);
  i[1] = __clz(0);
  i[2] = __popc(0xF0F0u);
  i[3] = __ffs(8);
  i[4] = max(-3, 2);
  i[5] = static_cast<int>(min(7u, 9u));
  i[6] = __float_as_int(1.0f);
}

// The math the kernels use, at values whose results CUDA's Math API documentation fixes exactly.
TEST(Executor, DeviceMathFollowsCudasDefinitions) {
  float* f = device_alloc<float>(7);
  int* i = device_alloc<int>(7);
  launch(math_kernel, dim3(1), dim3(1), 0, nullptr, f, i);
  const auto hf = to_host(f, 7);
  const auto hi = to_host(i, 7);
  EXPECT_EQ(hf[0], 0.5f);
  EXPECT_EQ(hf[1], 1.5f);
  EXPECT_EQ(hf[2], -2.0f);
  EXPECT_EQ(hf[3], 3.0f);
  EXPECT_EQ(hf[4], 0.125f);
  EXPECT_EQ(hf[5], 1.0f);
  EXPECT_EQ(hf[6], 0.0f);
  EXPECT_FALSE(std::signbit(hf[6]));
  EXPECT_EQ(hi[0], 31);
  EXPECT_EQ(hi[1], 32);
  EXPECT_EQ(hi[2], 8);
  EXPECT_EQ(hi[3], 4);
  EXPECT_EQ(hi[4], 2);
  EXPECT_EQ(hi[5], 7);
  EXPECT_EQ(hi[6], 0x3F800000);
  cudaFree(f);
  cudaFree(i);
}

// The signed distance from `want` to `got` in adjacent floats (both finite, of one sign).
std::int64_t ulps_between(float got, float want) {
  std::int32_t a, b;
  std::memcpy(&a, &got, 4);
  std::memcpy(&b, &want, 4);
  return static_cast<std::int64_t>(a & 0x7FFFFFFF) - static_cast<std::int64_t>(b & 0x7FFFFFFF);
}

constexpr int kApproxInputs = 4096;
__global__ void approx_kernel(const float* x, const float* y, float* rsq, float* div, float* ex) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= kApproxInputs) return;
  rsq[i] = rsqrtf(x[i]);
  div[i] = __fdividef(x[i], y[i]);
  ex[i] = __expf(y[i]);
}

// CUDA's approximate functions are approximations on the executor too: within the error bound the
// CUDA C++ Programming Guide documents, measured from the correctly rounded result, and not exact
// for many inputs (code that relies on them being exact shows it here as on a GPU). The same inputs
// give the same results every run.
TEST(Executor, ApproximateIntrinsicsStayWithinTheirDocumentedBoundsAndAreNotExact) {
  std::vector<float> x(kApproxInputs), y(kApproxInputs);
  for (int i = 0; i < kApproxInputs; ++i) {
    x[static_cast<std::size_t>(i)] = std::ldexp(1.0f + static_cast<float>(i % 509) / 509.0f, i % 61 - 30);
    y[static_cast<std::size_t>(i)] = (i % 2 ? -1.0f : 1.0f) * (0.01f + static_cast<float>(i) * 0.0197f);
  }
  float* dx = device_alloc<float>(kApproxInputs);
  float* dy = device_alloc<float>(kApproxInputs);
  float* out[3] = {device_alloc<float>(kApproxInputs), device_alloc<float>(kApproxInputs), device_alloc<float>(kApproxInputs)};
  to_device(dx, x);
  to_device(dy, y);
  launch(approx_kernel, dim3(kApproxInputs / 128), dim3(128), 0, nullptr, dx, dy, out[0], out[1], out[2]);
  const auto rsq = to_host(out[0], kApproxInputs), div = to_host(out[1], kApproxInputs), ex = to_host(out[2], kApproxInputs);
  int off[3] = {0, 0, 0};
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float r = static_cast<float>(1.0 / std::sqrt(static_cast<double>(x[i])));
    const float d = x[i] / y[i];
    const float e = static_cast<float>(std::exp(static_cast<double>(y[i])));
    const std::int64_t bound_e = 2 + static_cast<std::int64_t>(std::floor(std::fabs(1.173 * y[i])));
    ASSERT_LE(std::llabs(ulps_between(rsq[i], r)), 2) << "rsqrtf(" << x[i] << ")";
    ASSERT_LE(std::llabs(ulps_between(div[i], d)), 2) << "__fdividef(" << x[i] << ", " << y[i] << ")";
    ASSERT_LE(std::llabs(ulps_between(ex[i], e)), bound_e) << "__expf(" << y[i] << ")";
    off[0] += rsq[i] != r;
    off[1] += div[i] != d;
    off[2] += ex[i] != e;
  }
  for (int k = 0; k < 3; ++k) EXPECT_GT(off[k], kApproxInputs / 2) << "function " << k << " is exact too often";
  // Outside 2^-126 <= |y| <= 2^126, __fdividef's documented results; special values as CUDA's.
  EXPECT_EQ(__fdividef(1.0f, 0x1.8p127f), 0.0f);
  EXPECT_TRUE(std::isnan(__fdividef(INFINITY, 0x1.8p127f)));
  EXPECT_EQ(rsqrtf(INFINITY), 0.0f);
  EXPECT_EQ(rsqrtf(0.0f), INFINITY);
  EXPECT_TRUE(std::isnan(rsqrtf(-1.0f)));
  EXPECT_EQ(__expf(-INFINITY), 0.0f);
  // Deterministic: the same input, the same result.
  EXPECT_EQ(rsqrtf(x[7]), rsq[7]);
  for (float* p : out) cudaFree(p);
  cudaFree(dx);
  cudaFree(dy);
}

__global__ void fill_kernel(float* p, int n, float v) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) p[i] = v;
}

// Device memory is closed to host code, as on a GPU: a host read or write of it ends the process
// with one line naming the access, the allocation and the offset. Each planted access runs in a
// child process of this binary, whose output is read back.
TEST(DeviceGuard, AHostReadOfDeviceMemoryFaultsNamingIt) {
  if (std::getenv("ZINF_CUDAX_GUARD_CHILD")) {
    float* d = device_alloc<float>(64);
    launch(fill_kernel, dim3(1), dim3(64), 0, nullptr, d, 64, 2.0f);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::printf("survived: %g\n", static_cast<double>(static_cast<volatile float*>(d)[3]));
    return;
  }
  const std::string out = zinf::testing_support::run_in_child("ZINF_CUDAX_GUARD_CHILD=1", "DeviceGuard.AHostReadOf*");
  EXPECT_NE(out.find("cudax: host code reads device memory at 0x"), std::string::npos) << out;
  EXPECT_NE(out.find("(byte 12 of the 256-byte device allocation at 0x"), std::string::npos) << out;
  EXPECT_EQ(out.find("survived"), std::string::npos) << out;
}

TEST(DeviceGuard, AHostWriteOfDeviceMemoryFaultsNamingIt) {
  if (std::getenv("ZINF_CUDAX_GUARD_CHILD")) {
    char* d = device_alloc<char>(1000);
    static_cast<volatile char*>(d)[999] = 1;
    std::printf("survived\n");
    return;
  }
  const std::string out = zinf::testing_support::run_in_child("ZINF_CUDAX_GUARD_CHILD=1", "DeviceGuard.AHostWriteOf*");
  EXPECT_NE(out.find("cudax: host code writes device memory at 0x"), std::string::npos) << out;
  EXPECT_NE(out.find("(byte 999 of the 1000-byte device allocation at 0x"), std::string::npos) << out;
  EXPECT_EQ(out.find("survived"), std::string::npos) << out;
}

TEST(DeviceGuard, AHostReadOfFreedDeviceMemoryFaults) {
  if (std::getenv("ZINF_CUDAX_GUARD_CHILD")) {
    int* d = device_alloc<int>(16);
    cudaFree(d);
    std::printf("survived: %d\n", static_cast<volatile int*>(d)[0]);
    return;
  }
  const std::string out = zinf::testing_support::run_in_child("ZINF_CUDAX_GUARD_CHILD=1 ASAN_OPTIONS=detect_leaks=0",
                                                              "DeviceGuard.AHostReadOfFreed*");
#if defined(__SANITIZE_ADDRESS__)
  // AddressSanitizer sees it first: the executor poisons a freed range of the arena.
  EXPECT_NE(out.find("AddressSanitizer: use-after-poison"), std::string::npos) << out;
#else
  EXPECT_NE(out.find("cudax: host code reads device memory at 0x"), std::string::npos) << out;
  EXPECT_NE(out.find("in no live allocation"), std::string::npos) << out;
#endif
  EXPECT_EQ(out.find("survived"), std::string::npos) << out;
}

void CUDART_CB host_fn_reads(void* p) { *static_cast<int*>(p) += 1; }

// Device work is quiet: kernels, copies, memsets and host functions on a stream, the fill of fresh
// memory, and host code using pinned memory while device work runs on it.
TEST(DeviceGuard, DeviceWorkAndPinnedMemoryAreQuiet) {
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  float* d = device_alloc<float>(256);
  float* pinned = nullptr;
  ASSERT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&pinned), 256 * sizeof(float), cudaHostAllocDefault), cudaSuccess);
  for (int i = 0; i < 256; ++i) pinned[i] = static_cast<float>(i);
  int calls = 0;
  for (int round = 0; round < 10; ++round) {
    ASSERT_EQ(cudaMemsetAsync(d, 0, 256 * sizeof(float), s), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(d, pinned, 128 * sizeof(float), cudaMemcpyHostToDevice, s), cudaSuccess);
    launch(fill_kernel, dim3(1), dim3(128), 0, s, d + 128, 128, static_cast<float>(round));
    ASSERT_EQ(cudaLaunchHostFunc(s, host_fn_reads, &calls), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(pinned + 128, d + 128, 128 * sizeof(float), cudaMemcpyDeviceToHost, s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    ASSERT_EQ(pinned[200], static_cast<float>(round));
    pinned[200] = -1.0f;  // host code may write pinned memory
  }
  EXPECT_EQ(calls, 10);
  const auto h = to_host(d, 256);
  EXPECT_EQ(h[5], 5.0f);
  EXPECT_EQ(h[255], 9.0f);
  EXPECT_NE(zinf::cudax::guard(), zinf::cudax::Guard::off) << "ZINF_CUDAX_GUARD=off in the environment";
  cudaFree(d);
  cudaFreeHost(pinned);
  cudaStreamDestroy(s);
}

// The guard uses protection keys where the CPU and kernel have them (exact, per thread), and the
// arena's mprotect otherwise (or what ZINF_CUDAX_GUARD names).
TEST(DeviceGuard, UsesProtectionKeysWhereTheMachineHasThem) {
  const char* g = std::getenv("ZINF_CUDAX_GUARD");
  const std::string asked = g && *g ? g : "auto";
  FILE* f = std::fopen("/proc/cpuinfo", "r");
  ASSERT_NE(f, nullptr);
  std::string flags;
  char line[8192];
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, "flags", 5) == 0) {
      flags = line;
      break;
    }
  std::fclose(f);
  const bool keys = flags.find(" pku") != std::string::npos && flags.find(" ospke") != std::string::npos;
  using zinf::cudax::Guard;
  const Guard want = asked == "off" ? Guard::off : asked == "arena" || !keys ? Guard::arena : Guard::pkey;
  EXPECT_EQ(zinf::cudax::guard(), want) << "ZINF_CUDAX_GUARD=" << asked << "; " << flags;
}

TEST(Runtime, CopiesAreCheckedAgainstWhereTheirPointersLive) {
  char* dev = device_alloc<char>(64);
  std::vector<char> host(64, 1);
  void* pinned = nullptr;
  ASSERT_EQ(cudaHostAlloc(&pinned, 64, cudaHostAllocDefault), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(dev, host.data(), 64, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(host.data(), dev, 64, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(pinned, dev, 64, cudaMemcpyDefault), cudaSuccess);
  testing::internal::CaptureStderr();
  EXPECT_EQ(cudaMemcpy(host.data(), dev, 64, cudaMemcpyDeviceToDevice), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(dev, pinned, 64, cudaMemcpyDeviceToDevice), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(dev, host.data(), 64, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(host.data(), dev, 64, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(dev + 8, host.data(), 64, cudaMemcpyHostToDevice), cudaErrorInvalidValue) << "past the end";
  EXPECT_EQ(cudaMemset(host.data(), 0, 64), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFree(host.data()), cudaErrorInvalidValue);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("reads pinned host memory and writes device memory"), std::string::npos) << err;
  cudaGetLastError();
  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
  EXPECT_EQ(cudaFree(dev), cudaSuccess);
}

__global__ void slow_write(int* p, int v) {
  for (int i = 0; i < 64; ++i) p[i] = v;
}
__global__ void copy_kernel(int* dst, const int* src) { dst[threadIdx.x] = src[threadIdx.x]; }

TEST(Runtime, AnEventWaitOrdersTwoJitteredStreams) {
  cudaStream_t a, b;
  ASSERT_EQ(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t e;
  ASSERT_EQ(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
  int* x = device_alloc<int>(64);
  int* y = device_alloc<int>(64);
  for (int round = 0; round < 20; ++round) {
    launch(slow_write, dim3(1), dim3(1), 0, a, x, round);
    ASSERT_EQ(cudaEventRecord(e, a), cudaSuccess);
    ASSERT_EQ(cudaStreamWaitEvent(b, e, 0), cudaSuccess);
    launch(copy_kernel, dim3(1), dim3(64), 0, b, y, static_cast<const int*>(x));
    ASSERT_EQ(cudaStreamSynchronize(b), cudaSuccess);
    const auto h = to_host(y, 64);
    for (int i = 0; i < 64; ++i) ASSERT_EQ(h[static_cast<std::size_t>(i)], round) << "round " << round;
    ASSERT_EQ(cudaStreamSynchronize(a), cudaSuccess);
  }
  EXPECT_EQ(cudaEventQuery(e), cudaSuccess);
  float ms = 0;
  EXPECT_EQ(cudaEventElapsedTime(&ms, e, e), cudaErrorInvalidResourceHandle) << "an event without timing";
  cudaEventDestroy(e);
  EXPECT_EQ(cudaEventRecord(e, a), cudaErrorInvalidResourceHandle);
  cudaGetLastError();
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
  cudaFree(x);
  cudaFree(y);
}

TEST(Runtime, TheDeviceLooksLikeAnSm90Part) {
  cudaDeviceProp p{};
  ASSERT_EQ(cudaGetDeviceProperties(&p, 0), cudaSuccess);
  EXPECT_EQ(p.major, 9);
  EXPECT_EQ(p.minor, 0);
  EXPECT_EQ(p.sharedMemPerBlockOptin, 232448u);
  int optin = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0), cudaSuccess);
  EXPECT_EQ(optin, 232448);
  std::size_t free_b = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_b, &total), cudaSuccess);
  void* p1 = nullptr;
  ASSERT_EQ(cudaMalloc(&p1, 1 << 20), cudaSuccess);
  std::size_t free2 = 0;
  ASSERT_EQ(cudaMemGetInfo(&free2, &total), cudaSuccess);
  EXPECT_EQ(free_b - free2, std::size_t{1} << 20);
  EXPECT_EQ(to_host(static_cast<const unsigned char*>(p1), 4)[3], 0xFF) << "fresh device memory is poisoned";
  cudaFree(p1);
}

#if defined(__SANITIZE_THREAD__)
// ThreadSanitizer mode: the racy reduction's unordered shared-memory accesses are reported with
// their line, and a correctly ordered kernel is quiet (this binary runs with halt_on_error=1, so a
// report would end it). The racy launch runs in a child process of this same binary, whose output
// is read back.
constexpr int kRacyLine = __LINE__ + 5;
__global__ void racy_pairs(float* out) {
  __shared__ float sm[64];
  const int t = static_cast<int>(threadIdx.x);
  sm[t] = static_cast<float>(t);
  if (t < 32) sm[t] += sm[t + 32];  // reads what threads 32..63 wrote, with no barrier between
  __syncthreads();
  if (t == 0) out[0] = sm[0];
}

constexpr int kRacyStoreLine = __LINE__ + 1;
__global__ void racy_store(unsigned* out) { out[0] = threadIdx.x; }  // two threads, one address, no barrier

TEST(ExecutorTsan, AnUnorderedSharedMemoryAccessIsReportedWithItsLine) {
  if (std::getenv("ZINF_CUDAX_TSAN_CHILD")) {
    float* d = device_alloc<float>(1);
    launch(racy_pairs, dim3(1), dim3(64), 0, nullptr, d);
    unsigned* u = device_alloc<unsigned>(1);
    launch(racy_store, dim3(1), dim3(2), 0, nullptr, u);
    cudaDeviceSynchronize();
    return;
  }
  const std::string out = zinf::testing_support::run_in_child(
      "ZINF_CUDAX_TSAN_CHILD=1 TSAN_OPTIONS='halt_on_error=0 exitcode=0 report_signal_unsafe=0'", "ExecutorTsan.AnUnordered*");
  EXPECT_NE(out.find("ThreadSanitizer: data race"), std::string::npos) << out;
  EXPECT_NE(out.find("executor_test.cpp:" + std::to_string(kRacyLine)), std::string::npos) << out;
  EXPECT_NE(out.find("executor_test.cpp:" + std::to_string(kRacyStoreLine)), std::string::npos)
      << "threads of a block without barriers are unordered too: " << out;
}

TEST(ExecutorTsan, BarrierOrderedKernelsAreQuiet) {
  constexpr int kThreads = 128;
  std::vector<float> x(kThreads, 1.0f);
  float* dx = device_alloc<float>(kThreads);
  float* dout = device_alloc<float>(1);
  to_device(dx, x);
  for_each_order([&](auto) {
    launch(block_sum<kThreads>, dim3(1), dim3(kThreads), 0, nullptr, dx, dout);
    EXPECT_EQ(to_host(dout, 1)[0], static_cast<float>(kThreads));
  });
  cudaFree(dx);
  cudaFree(dout);
}
#endif

#if defined(__SANITIZE_ADDRESS__)
// AddressSanitizer mode: what compute-sanitizer's memcheck reports on a GPU, reported here with the
// kernel's line. Past the end of a cudaMalloc'd buffer (inside the executor's rounding, so only the
// poisoning catches it) and past a launch's dynamic shared memory. Each case runs in a child process
// of this binary (ASan ends the process at its first report), whose output is read back.
constexpr int kPastEndLine = __LINE__ + 1;
__global__ void read_one_past(const float* x, float* out, int n) { out[0] = x[n]; }

constexpr int kPastSharedLine = __LINE__ + 3;
__global__ void write_past_shared(int n) {
  int* s = reinterpret_cast<int*>(zinf::cudax::dynamic_shared());
  if (threadIdx.x == 0) s[n] = 1;
}

TEST(ExecutorAsan, AReadPastADeviceBuffersEndIsReportedWithItsLine) {
  if (std::getenv("ZINF_CUDAX_ASAN_CHILD")) {
    float* x = device_alloc<float>(3);  // 12 bytes of a 256-byte allocation
    float* out = device_alloc<float>(1);
    launch(read_one_past, dim3(1), dim3(1), 0, nullptr, x, out, 3);
    cudaDeviceSynchronize();
    return;
  }
  const std::string out = zinf::testing_support::run_in_child(
      "ZINF_CUDAX_ASAN_CHILD=1 ASAN_OPTIONS=detect_leaks=0", "ExecutorAsan.AReadPastADeviceBuffersEnd*");
  EXPECT_NE(out.find("AddressSanitizer: use-after-poison"), std::string::npos) << out;
  EXPECT_NE(out.find("executor_test.cpp:" + std::to_string(kPastEndLine)), std::string::npos) << out;
}

TEST(ExecutorAsan, AWritePastDynamicSharedMemoryIsReportedWithItsLine) {
  if (std::getenv("ZINF_CUDAX_ASAN_CHILD")) {
    launch(write_past_shared, dim3(1), dim3(32), 100 * sizeof(int), nullptr, 100);
    cudaDeviceSynchronize();
    return;
  }
  const std::string out = zinf::testing_support::run_in_child(
      "ZINF_CUDAX_ASAN_CHILD=1 ASAN_OPTIONS=detect_leaks=0", "ExecutorAsan.AWritePastDynamicShared*");
  EXPECT_NE(out.find("AddressSanitizer: use-after-poison"), std::string::npos) << out;
  EXPECT_NE(out.find("executor_test.cpp:" + std::to_string(kPastSharedLine)), std::string::npos) << out;
}

TEST(ExecutorAsan, InBoundsAccessesAreQuiet) {
  float* x = device_alloc<float>(3);
  float* out = device_alloc<float>(1);
  to_device(x, std::vector<float>{1.0f, 2.0f, 3.0f});
  launch(read_one_past, dim3(1), dim3(1), 0, nullptr, x, out, 2);  // x[2]: the last element
  EXPECT_EQ(to_host(out, 1)[0], 3.0f);
  launch(write_past_shared, dim3(1), dim3(32), 100 * sizeof(int), nullptr, 99);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaFree(x);
  cudaFree(out);
}
#endif

}  // namespace
