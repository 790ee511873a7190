// cublas_fake_test.cpp — hand-worked checks of the CPU executor's cuBLAS / cuBLASLt (cublas.cpp):
// each expected number is worked out in the comments from cuBLAS's definitions (column-major
// storage, D = alpha·op(A)·op(B) + beta·C, the cuBLASLt epilogues), not taken from a run.
//
// Storage reminder: a stored m×n matrix with leading dimension ld keeps element (i, j) at i + j·ld.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <thread>
#include <vector>

#include "cudax/runtime.h"

namespace zinf::cudax {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Device memory holding a copy of `values`; freed at the end of its scope.
template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(const std::vector<T>& values) : n_(values.size()) {
    EXPECT_EQ(cudaMalloc(&ptr_, bytes()), cudaSuccess);
    if (n_ > 0) {
      EXPECT_EQ(cudaMemcpy(ptr_, values.data(), bytes(), cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  ~DeviceArray() { cudaFree(ptr_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return static_cast<T*>(ptr_); }
  std::vector<T> download() const {
    std::vector<T> out(n_);
    if (n_ > 0) {
      EXPECT_EQ(cudaMemcpy(out.data(), ptr_, bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return out;
  }

 private:
  std::size_t bytes() const { return (n_ > 0 ? n_ : 1) * sizeof(T); }
  std::size_t n_;
  void* ptr_ = nullptr;
};

std::vector<__nv_bfloat16> to_bf16(const std::vector<float>& v) {
  std::vector<__nv_bfloat16> out;
  for (float x : v) out.push_back(__float2bfloat16(x));
  return out;
}
std::vector<__half> to_fp16(const std::vector<float>& v) {
  std::vector<__half> out;
  for (float x : v) out.push_back(__float2half(x));
  return out;
}
std::vector<float> to_float(const std::vector<__nv_bfloat16>& v) {
  std::vector<float> out;
  for (__nv_bfloat16 x : v) out.push_back(__bfloat162float(x));
  return out;
}
std::vector<float> to_float(const std::vector<__half>& v) {
  std::vector<float> out;
  for (__half x : v) out.push_back(__half2float(x));
  return out;
}

// Compares element by element; NaN matches NaN.
void expect_floats(const std::vector<float>& got, const std::vector<float>& want, float tol = 0) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << "element " << i << " = " << got[i];
    } else if (tol == 0) {
      EXPECT_EQ(got[i], want[i]) << "element " << i;
    } else {
      EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
    }
  }
}

// Stream-order checks: on a non-blocking stream s (which the legacy default stream does not wait
// for), `fill` copies the running example's A into `a` once the test thread has made its call
// (released) or after 5 s, and `read` copies 4 floats of `d` out. A GEMM that runs as work on s, after
// `fill`, sees the filled A; one that ran at the call, or on another stream, would see zeros.
class StreamOrder {
 public:
  StreamOrder() { EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess); }
  ~StreamOrder() { EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess); }
  StreamOrder(const StreamOrder&) = delete;
  StreamOrder& operator=(const StreamOrder&) = delete;

  void fill(float* a);
  void release() { released_.store(true); }
  void read(const float* d) {
    EXPECT_EQ(enqueue(stream,
                      [this, d] {
                        std::memcpy(seen.data(), d, 4 * sizeof(float));
                        return cudaSuccess;
                      }),
              cudaSuccess);
  }

  cudaStream_t stream = nullptr;
  std::vector<float> seen = std::vector<float>(4, -1);

 private:
  std::atomic<bool> released_{false};
};

// The running example, a 2×3 · 3×2 product:
//   op(A) = | 1 2 3 |   op(B) = |  7  8 |   op(A)·op(B) = | 1·7+2·9+3·11  1·8+2·10+3·12 | = |  58  64 |
//           | 4 5 6 |           |  9 10 |                 | 4·7+5·9+6·11  4·8+5·10+6·12 |   | 139 154 |
//                               | 11 12 |
// so D, column-major (ldc 2), is {58, 139, 64, 154}. Stored forms of the operands:
//   A for CUBLAS_OP_N: op(A) itself, 2×3, lda 2, columns (1,4) (2,5) (3,6)
//   A for CUBLAS_OP_T: op(A)ᵀ, 3×2, lda 3, columns (1,2,3) (4,5,6)
//   B for CUBLAS_OP_N: op(B) itself, 3×2, ldb 3, columns (7,9,11) (8,10,12)
//   B for CUBLAS_OP_T: op(B)ᵀ, 2×3, ldb 2, columns (7,8) (9,10) (11,12)
const std::vector<float> kAn = {1, 4, 2, 5, 3, 6};
const std::vector<float> kAt = {1, 2, 3, 4, 5, 6};
const std::vector<float> kBn = {7, 9, 11, 8, 10, 12};
const std::vector<float> kBt = {7, 8, 9, 10, 11, 12};
const std::vector<float> kProduct = {58, 139, 64, 154};

void StreamOrder::fill(float* a) {
  EXPECT_EQ(enqueue(stream,
                    [this, a] {
                      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
                      while (!released_.load() && std::chrono::steady_clock::now() < give_up)
                        std::this_thread::sleep_for(std::chrono::milliseconds(1));
                      std::memcpy(a, kAn.data(), kAn.size() * sizeof(float));
                      return cudaSuccess;
                    }),
            cudaSuccess);
}

// ---- cublasGemmEx / cublasGemmStridedBatchedEx ----------------------------------------------------

class GemmEx : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(cublasCreate(&handle_), CUBLAS_STATUS_SUCCESS); }
  void TearDown() override { EXPECT_EQ(cublasDestroy(handle_), CUBLAS_STATUS_SUCCESS); }

  // An fp32 GEMM.
  cublasStatus_t sgemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha, const void* a,
                       int lda, const void* b, int ldb, float beta, void* c, int ldc,
                       cublasComputeType_t compute = CUBLAS_COMPUTE_32F) {
    return cublasGemmEx(handle_, ta, tb, m, n, k, &alpha, a, CUDA_R_32F, lda, b, CUDA_R_32F, ldb, &beta, c,
                        CUDA_R_32F, ldc, compute, CUBLAS_GEMM_DEFAULT);
  }

  // The running example with the given storage of A and B.
  void check_product(cublasOperation_t ta, const std::vector<float>& a, int lda, cublasOperation_t tb,
                     const std::vector<float>& b, int ldb) {
    DeviceArray<float> A(a), B(b), C(std::vector<float>(4, 0));
    ASSERT_EQ(sgemm(ta, tb, 2, 2, 3, 1, A.get(), lda, B.get(), ldb, 0, C.get(), 2), CUBLAS_STATUS_SUCCESS);
    expect_floats(C.download(), kProduct);
  }

  cublasHandle_t handle_ = nullptr;
};

TEST_F(GemmEx, ProductNN) { check_product(CUBLAS_OP_N, kAn, 2, CUBLAS_OP_N, kBn, 3); }
TEST_F(GemmEx, ProductTN) { check_product(CUBLAS_OP_T, kAt, 3, CUBLAS_OP_N, kBn, 3); }
TEST_F(GemmEx, ProductNT) { check_product(CUBLAS_OP_N, kAn, 2, CUBLAS_OP_T, kBt, 2); }
TEST_F(GemmEx, ProductTT) { check_product(CUBLAS_OP_T, kAt, 3, CUBLAS_OP_T, kBt, 2); }
// CUBLAS_OP_C is the transpose for real types.
TEST_F(GemmEx, ProductCC) { check_product(CUBLAS_OP_C, kAt, 3, CUBLAS_OP_C, kBt, 2); }

TEST_F(GemmEx, LeadingDimensionsLargerThanRows) {
  // A (op N) with lda 4: each column of 2 is followed by 2 padding elements, NaN so a read of the
  // padding would show. B (op T, stored 2×3) with ldb 3: one NaN after each column of 2. C with
  // ldc 3: one sentinel (-1) after each column, which D must leave alone.
  DeviceArray<float> A({1, 4, kNaN, kNaN, 2, 5, kNaN, kNaN, 3, 6, kNaN, kNaN});
  DeviceArray<float> B({7, 8, kNaN, 9, 10, kNaN, 11, 12, kNaN});
  DeviceArray<float> C({0, 0, -1, 0, 0, -1});
  ASSERT_EQ(sgemm(CUBLAS_OP_N, CUBLAS_OP_T, 2, 2, 3, 1, A.get(), 4, B.get(), 3, 0, C.get(), 3), CUBLAS_STATUS_SUCCESS);
  expect_floats(C.download(), {58, 139, -1, 64, 154, -1});
}

TEST_F(GemmEx, AlphaAndBeta) {
  // alpha 2, beta 0.5, C = {10, 20, 30, 40}:
  //   D = 2·{58, 139, 64, 154} + 0.5·{10, 20, 30, 40} = {116+5, 278+10, 128+15, 308+20} = {121, 288, 143, 328}.
  DeviceArray<float> A(kAn), B(kBn), C({10, 20, 30, 40});
  ASSERT_EQ(sgemm(CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, 2, A.get(), 2, B.get(), 3, 0.5f, C.get(), 2),
            CUBLAS_STATUS_SUCCESS);
  expect_floats(C.download(), {121, 288, 143, 328});
}

TEST_F(GemmEx, BetaZeroDoesNotReadC) {
  // cuBLAS: with beta == 0, C need not be a valid input; NaN in C must not reach D.
  DeviceArray<float> A(kAn), B(kBn), C({kNaN, kNaN, kNaN, kNaN});
  ASSERT_EQ(sgemm(CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, 1, A.get(), 2, B.get(), 3, 0, C.get(), 2), CUBLAS_STATUS_SUCCESS);
  expect_floats(C.download(), kProduct);
}

TEST_F(GemmEx, EmptyInnerDimensionScalesC) {
  // k = 0: op(A)·op(B) is the 2×2 zero matrix, so D = beta·C = 2·{1, 2, 3, 4} = {2, 4, 6, 8}; A and B
  // are not read (null here).
  DeviceArray<float> C({1, 2, 3, 4});
  ASSERT_EQ(sgemm(CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 0, 1, nullptr, 2, nullptr, 1, 2, C.get(), 2), CUBLAS_STATUS_SUCCESS);
  expect_floats(C.download(), {2, 4, 6, 8});
}

TEST_F(GemmEx, Bf16InputsAccumulateInFp32) {
  // op(A) = [1 1 1] (1×3), op(B) = [256 1 1]ᵀ (3×1): the sum is 258. Near 256, bf16 (8 significant
  // bits) holds only even numbers: 256, 258, 260. Accumulated in bf16 it would be 256 + 1 = 257 → 256
  // (tie, to even), + 1 → 256 again; accumulated in fp32 it is 258, which bf16 holds exactly.
  const float one = 1, zero = 0;
  DeviceArray<__nv_bfloat16> A(to_bf16({1, 1, 1})), B(to_bf16({256, 1, 1}));
  DeviceArray<__nv_bfloat16> D16(to_bf16({0}));
  DeviceArray<float> D32({0});
  ASSERT_EQ(cublasGemmEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 3, &one, A.get(), CUDA_R_16BF, 1, B.get(),
                         CUDA_R_16BF, 3, &zero, D16.get(), CUDA_R_16BF, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasGemmEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 3, &one, A.get(), CUDA_R_16BF, 1, B.get(),
                         CUDA_R_16BF, 3, &zero, D32.get(), CUDA_R_32F, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
  expect_floats(to_float(D16.download()), {258});
  expect_floats(D32.download(), {258});
}

TEST_F(GemmEx, Bf16OutputRoundedOnceToNearestEven) {
  // op(A) = [1 1] (1×2), op(B) = | 256 256 | (2×2): sums 257 and 259, exact in fp32. Rounded once to
  //                              |   1   3 |
  // bf16 (near 256 the neighbours are 256, 258, 260): 257 is halfway between 256 (last mantissa bit
  // 0) and 258 (bit 1) → 256; 259 is halfway between 258 (bit 1) and 260 (bit 0) → 260.
  const float one = 1, zero = 0;
  DeviceArray<__nv_bfloat16> A(to_bf16({1, 1})), B(to_bf16({256, 1, 256, 3})), D(to_bf16({0, 0}));
  ASSERT_EQ(cublasGemmEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, 1, 2, 2, &one, A.get(), CUDA_R_16BF, 1, B.get(),
                         CUDA_R_16BF, 2, &zero, D.get(), CUDA_R_16BF, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
  expect_floats(to_float(D.download()), {256, 260});
}

TEST_F(GemmEx, Fp16InputsAccumulateInFp32) {
  // The fp16 version of the bf16 case: near 2048 fp16 (11 significant bits) holds only even numbers.
  // [1 1 1]·[2048 1 1]ᵀ = 2050 with fp32 accumulation (fp16 accumulation would give 2048).
  const float one = 1, zero = 0;
  DeviceArray<__half> A(to_fp16({1, 1, 1})), B(to_fp16({2048, 1, 1})), D(to_fp16({0}));
  ASSERT_EQ(cublasGemmEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 3, &one, A.get(), CUDA_R_16F, 1, B.get(),
                         CUDA_R_16F, 3, &zero, D.get(), CUDA_R_16F, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
  expect_floats(to_float(D.download()), {2050});
}

TEST_F(GemmEx, FastComputeTypesDownConvertFp32Inputs) {
  // op(A) = [1 + 2⁻⁸, 1 + 2⁻¹¹]ᵀ (2×1), op(B) = [1]: D = op(A) unless the inputs are converted.
  //   bf16 keeps 7 mantissa bits: 1 + 2⁻⁸ is halfway between 1 and 1 + 2⁻⁷ → 1; 1 + 2⁻¹¹ → 1.
  //   fp16 and TF32 keep 10: 1 + 2⁻⁸ stays; 1 + 2⁻¹¹ is halfway between 1 and 1 + 2⁻¹⁰ → 1.
  const float a0 = 1.0f + 1.0f / 256, a1 = 1.0f + 1.0f / 2048;
  DeviceArray<float> A({a0, a1}), B({1}), D({0, 0});
  const auto run = [&](cublasComputeType_t compute) {
    EXPECT_EQ(sgemm(CUBLAS_OP_N, CUBLAS_OP_N, 2, 1, 1, 1, A.get(), 2, B.get(), 1, 0, D.get(), 2, compute),
              CUBLAS_STATUS_SUCCESS);
    return D.download();
  };
  expect_floats(run(CUBLAS_COMPUTE_32F), {a0, a1});
  expect_floats(run(CUBLAS_COMPUTE_32F_PEDANTIC), {a0, a1});
  expect_floats(run(CUBLAS_COMPUTE_32F_FAST_16BF), {1, 1});
  expect_floats(run(CUBLAS_COMPUTE_32F_FAST_16F), {a0, 1});
  expect_floats(run(CUBLAS_COMPUTE_32F_FAST_TF32), {a0, 1});
}

TEST_F(GemmEx, PedanticAccumulatesInFp32) {
  // [2²⁴ 1 1]·[1 1 1]ᵀ = 2²⁴ + 2. In fp32 (24 significant bits) the numbers near 2²⁴ are 2 apart:
  // summed in fp32 in k order, 2²⁴ + 1 is a tie → 2²⁴ (even), and again → 2²⁴. COMPUTE_32F may keep
  // more precision (the fake sums in double): 2²⁴ + 2 = 16777218, which fp32 holds.
  DeviceArray<float> A({16777216.0f, 1, 1}), B({1, 1, 1}), D({0});
  ASSERT_EQ(sgemm(CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 3, 1, A.get(), 1, B.get(), 3, 0, D.get(), 1,
                  CUBLAS_COMPUTE_32F_PEDANTIC),
            CUBLAS_STATUS_SUCCESS);
  expect_floats(D.download(), {16777216.0f});
  ASSERT_EQ(sgemm(CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 3, 1, A.get(), 1, B.get(), 3, 0, D.get(), 1, CUBLAS_COMPUTE_32F),
            CUBLAS_STATUS_SUCCESS);
  expect_floats(D.download(), {16777218.0f});
}

TEST_F(GemmEx, StridedBatches) {
  // Two instances, op N/N, m = n = 2, k = 3, each operand's instances separated by padding:
  //   A: stride 8 (6 elements + 2 NaN), B: stride 7 (6 + 1 NaN), C: stride 5 (4 + a -1 sentinel).
  // Instance 0 is the running example: {58, 139, 64, 154}.
  // Instance 1: op(A₁) = | 1 0 0 |  picks rows 0 and 2 of op(B₁) = | 1 2 |  →  | 1 2 | = {1, 5, 2, 6}.
  //                      | 0 0 1 |                                 | 3 4 |     | 5 6 |
  //                                                                | 5 6 |
  std::vector<float> a = kAn, b = kBn;
  a.insert(a.end(), {kNaN, kNaN, 1, 0, 0, 0, 0, 1});
  b.insert(b.end(), {kNaN, 1, 3, 5, 2, 4, 6});
  DeviceArray<float> A(a), B(b), C({0, 0, 0, 0, -1, 0, 0, 0, 0});
  const float one = 1, zero = 0;
  ASSERT_EQ(cublasGemmStridedBatchedEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, &one, A.get(), CUDA_R_32F, 2, 8,
                                       B.get(), CUDA_R_32F, 3, 7, &zero, C.get(), CUDA_R_32F, 2, 5, 2,
                                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
  expect_floats(C.download(), {58, 139, 64, 154, -1, 1, 5, 2, 6});
}

TEST_F(GemmEx, StrideZeroSharesAnOperandAndBetaReadsEachInstancesC) {
  // strideA 0: both instances use the same A. B₁ = 2·B₀, so op(A)·op(B₁) = 2·{58, 139, 64, 154}.
  // beta 1 with C₀ = {1, 2, 3, 4}, C₁ = {10, 20, 30, 40} (strideC 4):
  //   D₀ = {58+1, 139+2, 64+3, 154+4} = {59, 141, 67, 158}
  //   D₁ = {116+10, 278+20, 128+30, 308+40} = {126, 298, 158, 348}.
  std::vector<float> b = kBn;
  for (float x : kBn) b.push_back(2 * x);
  DeviceArray<float> A(kAn), B(b), C({1, 2, 3, 4, 10, 20, 30, 40});
  const float one = 1;
  ASSERT_EQ(cublasGemmStridedBatchedEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, &one, A.get(), CUDA_R_32F, 2, 0,
                                       B.get(), CUDA_R_32F, 3, 6, &one, C.get(), CUDA_R_32F, 2, 4, 2,
                                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
  expect_floats(C.download(), {59, 141, 67, 158, 126, 298, 158, 348});
}

TEST_F(GemmEx, RunsInOrderOnTheHandlesStream) {
  StreamOrder order;
  ASSERT_EQ(cublasSetStream(handle_, order.stream), CUBLAS_STATUS_SUCCESS);
  cudaStream_t got = nullptr;
  ASSERT_EQ(cublasGetStream(handle_, &got), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(got, order.stream);
  DeviceArray<float> A(std::vector<float>(6, 0)), B(kBn), C(std::vector<float>(4, 0));
  order.fill(A.get());
  ASSERT_EQ(sgemm(CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, 1, A.get(), 2, B.get(), 3, 0, C.get(), 2), CUBLAS_STATUS_SUCCESS);
  order.release();
  order.read(C.get());
  ASSERT_EQ(cudaStreamSynchronize(order.stream), cudaSuccess);
  expect_floats(order.seen, kProduct);
  ASSERT_EQ(cublasSetStream(handle_, nullptr), CUBLAS_STATUS_SUCCESS);
}

TEST_F(GemmEx, DevicePointerModeReadsScalarsFromDeviceMemory) {
  // alpha 2 and beta 0.5 in device memory: {121, 288, 143, 328} as in AlphaAndBeta.
  cublasPointerMode_t mode{};
  ASSERT_EQ(cublasGetPointerMode(handle_, &mode), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(mode, CUBLAS_POINTER_MODE_HOST);
  ASSERT_EQ(cublasSetPointerMode(handle_, CUBLAS_POINTER_MODE_DEVICE), CUBLAS_STATUS_SUCCESS);
  DeviceArray<float> A(kAn), B(kBn), C({10, 20, 30, 40}), scalars({2, 0.5f});
  ASSERT_EQ(cublasGemmEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, scalars.get(), A.get(), CUDA_R_32F, 2, B.get(),
                         CUDA_R_32F, 3, scalars.get() + 1, C.get(), CUDA_R_32F, 2, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
  expect_floats(C.download(), {121, 288, 143, 328});
  // A device beta of 0: C is not read (NaN stays out of D).
  DeviceArray<float> nan_c({kNaN, kNaN, kNaN, kNaN}), one_zero({1, 0});
  ASSERT_EQ(cublasGemmEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, one_zero.get(), A.get(), CUDA_R_32F, 2, B.get(),
                         CUDA_R_32F, 3, one_zero.get() + 1, nan_c.get(), CUDA_R_32F, 2, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
  expect_floats(nan_c.download(), kProduct);
  // Host scalars in device mode are refused.
  const float one = 1;
  EXPECT_EQ(cublasGemmEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, &one, A.get(), CUDA_R_32F, 2, B.get(), CUDA_R_32F,
                         3, &one, C.get(), CUDA_R_32F, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_INVALID_VALUE);
}

TEST_F(GemmEx, MathModeIsStored) {
  cublasMath_t mode{};
  ASSERT_EQ(cublasSetMathMode(handle_, CUBLAS_PEDANTIC_MATH), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasGetMathMode(handle_, &mode), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(mode, CUBLAS_PEDANTIC_MATH);
  EXPECT_EQ(cublasSetMathMode(handle_, static_cast<cublasMath_t>(77)), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_STREQ(cublasGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED");
}

TEST_F(GemmEx, InvalidArgumentsGiveTheDocumentedStatus) {
  DeviceArray<float> A(kAn), B(kBn), C({5, 5, 5, 5}), small({0, 0, 0, 0});
  std::vector<float> host_a = kAn, host_c(4, 0);
  const float one = 1;
  const auto call = [&](cublasHandle_t h, cublasOperation_t ta, int m, int lda, const void* a, cudaDataType at,
                        cudaDataType bt, cudaDataType ct, void* c, int ldc, cublasComputeType_t compute,
                        const float* alpha = nullptr, cublasGemmAlgo_t algo = CUBLAS_GEMM_DEFAULT) {
    return cublasGemmEx(h, ta, CUBLAS_OP_N, m, 2, 3, alpha ? alpha : &one, a, at, lda, B.get(), bt, 3, &one, c, ct,
                        ldc, compute, algo);
  };
  const auto f32 = CUDA_R_32F;
  const auto c32 = CUBLAS_COMPUTE_32F;
  // The documented INVALID_VALUE and NOT_INITIALIZED cases.
  EXPECT_EQ(call(nullptr, CUBLAS_OP_N, 2, 2, A.get(), f32, f32, f32, C.get(), 2, c32), CUBLAS_STATUS_NOT_INITIALIZED);
  EXPECT_EQ(call(handle_, CUBLAS_OP_N, -1, 2, A.get(), f32, f32, f32, C.get(), 2, c32), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(call(handle_, CUBLAS_OP_CONJG, 2, 2, A.get(), f32, f32, f32, C.get(), 2, c32), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(call(handle_, CUBLAS_OP_N, 2, 1, A.get(), f32, f32, f32, C.get(), 2, c32),  // lda < m
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(call(handle_, CUBLAS_OP_T, 2, 2, A.get(), f32, f32, f32, C.get(), 2, c32),  // op T: lda < k
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(call(handle_, CUBLAS_OP_N, 2, 2, A.get(), f32, f32, f32, C.get(), 1, c32),  // ldc < m
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasGemmEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, &one, A.get(), f32, 2, B.get(), f32, 2, &one,
                         C.get(), f32, 2, c32, CUBLAS_GEMM_DEFAULT),  // op N: ldb < k
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasGemmEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, nullptr, A.get(), f32, 2, B.get(), f32, 3, &one,
                         C.get(), f32, 2, c32, CUBLAS_GEMM_DEFAULT),  // no alpha
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(call(handle_, CUBLAS_OP_N, 2, 2, A.get(), f32, f32, f32, C.get(), 2, static_cast<cublasComputeType_t>(12345)),
            CUBLAS_STATUS_INVALID_VALUE);
  // Type and algorithm combinations outside the table: NOT_SUPPORTED.
  EXPECT_EQ(call(handle_, CUBLAS_OP_N, 2, 2, A.get(), CUDA_R_16BF, CUDA_R_16F, f32, C.get(), 2, c32),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(call(handle_, CUBLAS_OP_N, 2, 2, A.get(), f32, f32, CUDA_R_16BF, C.get(), 2, c32),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(call(handle_, CUBLAS_OP_N, 2, 2, A.get(), CUDA_R_16BF, CUDA_R_16BF, f32, C.get(), 2,
                 CUBLAS_COMPUTE_32F_FAST_16BF),  // the FAST types take fp32 inputs
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(call(handle_, CUBLAS_OP_N, 2, 2, A.get(), f32, f32, f32, C.get(), 2, CUBLAS_COMPUTE_16F),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(call(handle_, CUBLAS_OP_N, 2, 2, A.get(), f32, f32, f32, C.get(), 2, c32, nullptr,
                 static_cast<cublasGemmAlgo_t>(555)),
            CUBLAS_STATUS_NOT_SUPPORTED);
  // The fake's strictness: every operand must be cudaMalloc memory covering what the call touches.
  EXPECT_EQ(call(handle_, CUBLAS_OP_N, 2, 2, host_a.data(), f32, f32, f32, C.get(), 2, c32),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(call(handle_, CUBLAS_OP_N, 2, 2, A.get(), f32, f32, f32, host_c.data(), 2, c32),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(call(handle_, CUBLAS_OP_N, 2, 2, small.get(), f32, f32, f32, C.get(), 2, c32),  // 4 of the 6 elements
            CUBLAS_STATUS_INVALID_VALUE);
  // Batches: a negative count is invalid.
  EXPECT_EQ(cublasGemmStridedBatchedEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, &one, A.get(), f32, 2, 6, B.get(),
                                       f32, 3, 6, &one, C.get(), f32, 2, 4, -1, c32, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_INVALID_VALUE);
  // A refused call enqueued nothing: C still holds its values.
  expect_floats(C.download(), {5, 5, 5, 5});
  // An empty product (m = 0) succeeds without touching anything, even null pointers.
  EXPECT_EQ(cublasGemmEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, 0, 2, 3, &one, nullptr, f32, 1, nullptr, f32, 3, &one,
                         nullptr, f32, 1, c32, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
}

// ---- cublasLt ---------------------------------------------------------------------------------------

// One cublasLtMatmul call shape: its descriptor and the layouts of A, B, C and D (C and D separate
// descriptors of the same layout), destroyed with it.
struct LtShape {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;

  LtShape(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, int lda, int ldb, int ldc,
          cudaDataType ab = CUDA_R_32F, cudaDataType cd = CUDA_R_32F,
          cublasComputeType_t compute = CUBLAS_COMPUTE_32F) {
    EXPECT_EQ(cublasLtMatmulDescCreate(&desc, compute, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
    set(CUBLASLT_MATMUL_DESC_TRANSA, ta);
    set(CUBLASLT_MATMUL_DESC_TRANSB, tb);
    EXPECT_EQ(cublasLtMatrixLayoutCreate(&a, ab, ta == CUBLAS_OP_N ? m : k, ta == CUBLAS_OP_N ? k : m, lda),
              CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatrixLayoutCreate(&b, ab, tb == CUBLAS_OP_N ? k : n, tb == CUBLAS_OP_N ? n : k, ldb),
              CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatrixLayoutCreate(&c, cd, m, n, ldc), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatrixLayoutCreate(&d, cd, m, n, ldc), CUBLAS_STATUS_SUCCESS);
  }
  ~LtShape() {
    cublasLtMatrixLayoutDestroy(d);
    cublasLtMatrixLayoutDestroy(c);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatmulDescDestroy(desc);
  }
  LtShape(const LtShape&) = delete;
  LtShape& operator=(const LtShape&) = delete;

  template <class T>
  void set(cublasLtMatmulDescAttributes_t attr, const T& v) {
    EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc, attr, &v, sizeof v), CUBLAS_STATUS_SUCCESS) << "attribute " << attr;
  }
  void epilogue(cublasLtEpilogue_t e) { set(CUBLASLT_MATMUL_DESC_EPILOGUE, e); }
  void bias(const void* p) { set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, p); }
  void aux(void* p, std::int64_t ld) {
    set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, p);
    set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, ld);
  }
  // count instances; strides in elements for A, B and C = D.
  void batch(std::int32_t count, std::int64_t sa, std::int64_t sb, std::int64_t sc) {
    const std::int64_t strides[4] = {sa, sb, sc, sc};
    cublasLtMatrixLayout_t layouts[4] = {a, b, c, d};
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count),
                CUBLAS_STATUS_SUCCESS);
      EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &strides[i],
                                                 sizeof strides[i]),
                CUBLAS_STATUS_SUCCESS);
    }
  }
};

class Lt : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(cublasLtCreate(&lt_), CUBLAS_STATUS_SUCCESS); }
  void TearDown() override { EXPECT_EQ(cublasLtDestroy(lt_), CUBLAS_STATUS_SUCCESS); }

  // D = alpha·op(A)·op(B) + beta·C with the shape's descriptors (D in place of C: the same matrix).
  cublasStatus_t matmul(const LtShape& s, float alpha, const void* a, const void* b, float beta, void* cd,
                        cudaStream_t stream = nullptr, const cublasLtMatmulAlgo_t* algo = nullptr,
                        void* workspace = nullptr, std::size_t workspace_bytes = 0) {
    return cublasLtMatmul(lt_, s.desc, &alpha, a, s.a, b, s.b, &beta, cd, s.c, cd, s.d, algo, workspace,
                          workspace_bytes, stream);
  }

  // The heuristic's first algorithm for the shape, with the given preference alignments.
  cublasStatus_t heuristic(const LtShape& s, std::uint32_t alignment, cublasLtMatmulHeuristicResult_t& result,
                           int& found) {
    cublasLtMatmulPreference_t pref = nullptr;
    EXPECT_EQ(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
    const std::uint64_t workspace = 1 << 20;
    EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                   sizeof workspace),
              CUBLAS_STATUS_SUCCESS);
    for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(pref, attr, &alignment, sizeof alignment), CUBLAS_STATUS_SUCCESS);
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt_, s.desc, s.a, s.b, s.c, s.d, pref, 1, &result, &found);
    EXPECT_EQ(cublasLtMatmulPreferenceDestroy(pref), CUBLAS_STATUS_SUCCESS);
    return st;
  }

  cublasLtHandle_t lt_ = nullptr;
};

TEST_F(Lt, DefaultEpilogueInAllFourTransposeCombinations) {
  struct Case {
    cublasOperation_t ta, tb;
    const std::vector<float>* a;
    const std::vector<float>* b;
    int lda, ldb;
  };
  const Case cases[] = {{CUBLAS_OP_N, CUBLAS_OP_N, &kAn, &kBn, 2, 3},
                        {CUBLAS_OP_T, CUBLAS_OP_N, &kAt, &kBn, 3, 3},
                        {CUBLAS_OP_N, CUBLAS_OP_T, &kAn, &kBt, 2, 2},
                        {CUBLAS_OP_T, CUBLAS_OP_T, &kAt, &kBt, 3, 2}};
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "transa " << c.ta << " transb " << c.tb);
    LtShape s(c.ta, c.tb, 2, 2, 3, c.lda, c.ldb, 2);
    s.epilogue(CUBLASLT_EPILOGUE_DEFAULT);
    DeviceArray<float> A(*c.a), B(*c.b), D(std::vector<float>(4, 0));
    ASSERT_EQ(matmul(s, 1, A.get(), B.get(), 0, D.get()), CUBLAS_STATUS_SUCCESS);
    expect_floats(D.download(), kProduct);
  }
}

TEST_F(Lt, LeadingDimensionsAndAlphaBeta) {
  // A (op T, stored 3×2) with lda 4: one NaN after each stored column. D = C with ldc 3 (sentinel -1
  // after each column). alpha 2, beta 0.5, C = {10, 20, 30, 40} as in GemmEx.AlphaAndBeta:
  //   D = {121, 288, 143, 328}.
  LtShape s(CUBLAS_OP_T, CUBLAS_OP_N, 2, 2, 3, 4, 3, 3);
  DeviceArray<float> A({1, 2, 3, kNaN, 4, 5, 6, kNaN}), B(kBn), CD({10, 20, -1, 30, 40, -1});
  ASSERT_EQ(matmul(s, 2, A.get(), B.get(), 0.5f, CD.get()), CUBLAS_STATUS_SUCCESS);
  expect_floats(CD.download(), {121, 288, -1, 143, 328, -1});
}

TEST_F(Lt, BiasIsAddedToEveryColumn) {
  // bias = {100, 200}, one element per row of D, broadcast over the columns; beta 0.5, C = {10, 20, 30, 40}:
  //   D[i,j] = (op(A)·op(B))[i,j] + 0.5·C[i,j] + bias[i]
  //          = {58+5+100, 139+10+200, 64+15+100, 154+20+200} = {163, 349, 179, 374}.
  LtShape s(CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, 2, 3, 2);
  DeviceArray<float> A(kAn), B(kBn), CD({10, 20, 30, 40}), bias({100, 200});
  s.epilogue(CUBLASLT_EPILOGUE_BIAS);
  s.bias(bias.get());
  ASSERT_EQ(matmul(s, 1, A.get(), B.get(), 0.5f, CD.get()), CUBLAS_STATUS_SUCCESS);
  expect_floats(CD.download(), {163, 349, 179, 374});
}

// The GELU cases use m = n = 2, k = 1: op(A) = [1 -1]ᵀ, op(B) = [1 2], so op(A)·op(B) = | 1  2 |,
//                                                                                       | -1 -2 |
// column-major {1, -1, 2, -2}. gelu is the tanh form, gelu(x) = 0.5·x·(1 + tanh(u)) with
// u = √(2/π)·(x + 0.044715·x³), √(2/π) = 0.7978845608:
//   x = 1:   u = 0.7978845608·1.044715 = 0.833561969, tanh u = 0.682383981, gelu = 0.5·1.682383981 = 0.841191991
//   x = 2:   u = 0.7978845608·2.35772  = 1.881188387, tanh u = 0.954597694, gelu = 1·1.954597694   = 1.954597694
//   x = 1.5: u = 0.7978845608·1.650913125 = 1.317238094, tanh u = 0.866095436, gelu = 0.75·1.866095436 = 1.399571577
//   x = 2.5: u = 0.7978845608·3.198671875 = 2.552170904, tanh u = 0.987932587, gelu = 1.25·1.987932587 = 2.484915734
//   x = 0.5: u = 0.7978845608·0.505589375 = 0.403401956, tanh u = 0.382856039, gelu = 0.25·1.382856039 = 0.345714010
// and, tanh being odd, gelu(-x) = gelu(x) - x: gelu(-1) = -0.158808009, gelu(-2) = -0.045402306,
// gelu(-1.5) = -0.100428423, gelu(-2.5) = -0.015084266, gelu(-0.5) = -0.154285990.
constexpr float kGeluTol = 2e-7f;
const std::vector<float> kGeluA = {1, -1};
const std::vector<float> kGeluB = {1, 2};

TEST_F(Lt, GeluUsesTheTanhApproximation) {
  LtShape s(CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 1, 2, 1, 2);
  DeviceArray<float> A(kGeluA), B(kGeluB), D(std::vector<float>(4, 0));
  s.epilogue(CUBLASLT_EPILOGUE_GELU);
  ASSERT_EQ(matmul(s, 1, A.get(), B.get(), 0, D.get()), CUBLAS_STATUS_SUCCESS);
  expect_floats(D.download(), {0.841191991f, -0.158808009f, 1.954597694f, -0.045402306f}, kGeluTol);
}

TEST_F(Lt, GeluAuxWritesThePreActivation) {
  // aux (ld 8, a multiple of 8 as cuBLASLt requires): the GELU input {1, -1 | 2, -2}; the 6 padding
  // elements after each column keep their 99. D = gelu of it.
  LtShape s(CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 1, 2, 1, 2);
  DeviceArray<float> A(kGeluA), B(kGeluB), D(std::vector<float>(4, 0)), aux(std::vector<float>(16, 99));
  s.epilogue(CUBLASLT_EPILOGUE_GELU_AUX);
  s.aux(aux.get(), 8);
  ASSERT_EQ(matmul(s, 1, A.get(), B.get(), 0, D.get()), CUBLAS_STATUS_SUCCESS);
  expect_floats(D.download(), {0.841191991f, -0.158808009f, 1.954597694f, -0.045402306f}, kGeluTol);
  expect_floats(aux.download(), {1, -1, 99, 99, 99, 99, 99, 99, 2, -2, 99, 99, 99, 99, 99, 99});
}

TEST_F(Lt, GeluAuxBiasAddsTheBiasBeforeTheGelu) {
  // bias {0.5, -0.5}: pre = {1+0.5, -1-0.5 | 2+0.5, -2-0.5} = {1.5, -1.5, 2.5, -2.5} → aux; D = gelu(pre).
  LtShape s(CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 1, 2, 1, 2);
  DeviceArray<float> A(kGeluA), B(kGeluB), D(std::vector<float>(4, 0)), aux(std::vector<float>(16, 99)),
      bias({0.5f, -0.5f});
  s.epilogue(CUBLASLT_EPILOGUE_GELU_AUX_BIAS);
  s.bias(bias.get());
  s.aux(aux.get(), 8);
  ASSERT_EQ(matmul(s, 1, A.get(), B.get(), 0, D.get()), CUBLAS_STATUS_SUCCESS);
  const std::vector<float> gelu_pre = {1.399571577f, -0.100428423f, 2.484915734f, -0.015084266f};
  expect_floats(D.download(), gelu_pre, kGeluTol);
  const std::vector<float> got_aux = aux.download();
  expect_floats({got_aux[0], got_aux[1], got_aux[8], got_aux[9]}, {1.5f, -1.5f, 2.5f, -2.5f});
  // GELU_BIAS: the same D, no aux.
  LtShape s2(CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 1, 2, 1, 2);
  s2.epilogue(CUBLASLT_EPILOGUE_GELU_BIAS);
  s2.bias(bias.get());
  DeviceArray<float> D2(std::vector<float>(4, 0));
  ASSERT_EQ(matmul(s2, 1, A.get(), B.get(), 0, D2.get()), CUBLAS_STATUS_SUCCESS);
  expect_floats(D2.download(), gelu_pre, kGeluTol);
}

TEST_F(Lt, GeluAuxInStridedBatches) {
  // Two instances; A and B step by 2 elements, D by 4, aux (ld 8) by 16 (a multiple of 8).
  // Instance 0 is the case above: pre {1, -1, 2, -2}. Instance 1: op(A₁) = [0.5 -0.5]ᵀ, op(B₁) = [1 2]:
  //   pre = {0.5, -0.5, 1, -1}, D = {0.345714010, -0.154285990, 0.841191991, -0.158808009}.
  LtShape s(CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 1, 2, 1, 2);
  s.batch(2, 2, 2, 4);
  DeviceArray<float> A({1, -1, 0.5f, -0.5f}), B({1, 2, 1, 2}), D(std::vector<float>(8, 0)),
      aux(std::vector<float>(32, 99));
  s.epilogue(CUBLASLT_EPILOGUE_GELU_AUX);
  s.aux(aux.get(), 8);
  s.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, std::int64_t{16});
  ASSERT_EQ(matmul(s, 1, A.get(), B.get(), 0, D.get()), CUBLAS_STATUS_SUCCESS);
  expect_floats(D.download(),
                {0.841191991f, -0.158808009f, 1.954597694f, -0.045402306f, 0.345714010f, -0.154285990f, 0.841191991f,
                 -0.158808009f},
                kGeluTol);
  const std::vector<float> x = aux.download();
  expect_floats({x[0], x[1], x[8], x[9], x[16], x[17], x[24], x[25], x[2], x[31]}, {1, -1, 2, -2, 0.5f, -0.5f, 1, -1, 99, 99});
}

TEST_F(Lt, BgradaSumsOpAOverK) {
  // BGRADA: bias[i] = Σ_k op(A)[i,k], one per row of D: {1+2+3, 4+5+6} = {6, 15}, overwriting the
  // 999s; D is the plain product. Stored as op T (kAt) the same op(A), so the same sums.
  for (const bool trans : {false, true}) {
    SCOPED_TRACE(trans ? "transa T" : "transa N");
    LtShape s(trans ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, trans ? 3 : 2, 3, 2);
    DeviceArray<float> A(trans ? kAt : kAn), B(kBn), D(std::vector<float>(4, 0)), grad({999, 999});
    s.epilogue(CUBLASLT_EPILOGUE_BGRADA);
    s.bias(grad.get());
    ASSERT_EQ(matmul(s, 1, A.get(), B.get(), 0, D.get()), CUBLAS_STATUS_SUCCESS);
    expect_floats(D.download(), kProduct);
    expect_floats(grad.download(), {6, 15});
  }
}

TEST_F(Lt, BgradbSumsOpBOverK) {
  // BGRADB: bias[j] = Σ_k op(B)[k,j], one per column of D: {7+9+11, 8+10+12} = {27, 30}.
  LtShape s(CUBLAS_OP_N, CUBLAS_OP_T, 2, 2, 3, 2, 2, 2);
  DeviceArray<float> A(kAn), B(kBt), D(std::vector<float>(4, 0)), grad({999, 999});
  s.epilogue(CUBLASLT_EPILOGUE_BGRADB);
  s.bias(grad.get());
  ASSERT_EQ(matmul(s, 1, A.get(), B.get(), 0, D.get()), CUBLAS_STATUS_SUCCESS);
  expect_floats(D.download(), kProduct);
  expect_floats(grad.download(), {27, 30});
}

TEST_F(Lt, Bf16WithBiasRoundsOnce) {
  // bf16 A, B, D and bias (D's type) {0.5, 0.25}: the fp32 results {58.5, 139.25, 64.5, 154.25},
  // each rounded once to bf16 (8 significant bits; between 128 and 256 the spacing is 1, below 128
  // it is 0.5): 58.5 and 64.5 stay, 139.25 → 139, 154.25 → 154.
  LtShape s(CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, 2, 3, 2, CUDA_R_16BF, CUDA_R_16BF);
  DeviceArray<__nv_bfloat16> A(to_bf16(kAn)), B(to_bf16(kBn)), D(to_bf16({0, 0, 0, 0})), bias(to_bf16({0.5f, 0.25f}));
  s.epilogue(CUBLASLT_EPILOGUE_BIAS);
  s.bias(bias.get());
  ASSERT_EQ(matmul(s, 1, A.get(), B.get(), 0, D.get()), CUBLAS_STATUS_SUCCESS);
  expect_floats(to_float(D.download()), {58.5f, 139, 64.5f, 154});
}

TEST_F(Lt, Fp16InputsFp32Output) {
  // [1 1]·[2048 0.5]ᵀ = 2048.5: kept by an fp32 D (an fp16 D would round it to 2048).
  LtShape s(CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 2, 1, 2, 1, CUDA_R_16F, CUDA_R_32F);
  DeviceArray<__half> A(to_fp16({1, 1})), B(to_fp16({2048, 0.5f}));
  DeviceArray<float> D({0});
  ASSERT_EQ(matmul(s, 1, A.get(), B.get(), 0, D.get()), CUBLAS_STATUS_SUCCESS);
  expect_floats(D.download(), {2048.5f});
}

TEST_F(Lt, RunsInOrderOnTheGivenStream) {
  // As GemmEx.RunsInOrderOnTheHandlesStream, with cublasLtMatmul's stream argument.
  StreamOrder order;
  LtShape shape(CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, 2, 3, 2);
  DeviceArray<float> A(std::vector<float>(6, 0)), B(kBn), D(std::vector<float>(4, 0));
  order.fill(A.get());
  ASSERT_EQ(matmul(shape, 1, A.get(), B.get(), 0, D.get(), order.stream), CUBLAS_STATUS_SUCCESS);
  order.release();
  order.read(D.get());
  ASSERT_EQ(cudaStreamSynchronize(order.stream), cudaSuccess);
  expect_floats(order.seen, kProduct);
}

TEST_F(Lt, DevicePointerMode) {
  LtShape s(CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, 2, 3, 2);
  s.set(CUBLASLT_MATMUL_DESC_POINTER_MODE, std::int32_t{CUBLASLT_POINTER_MODE_DEVICE});
  DeviceArray<float> A(kAn), B(kBn), CD({10, 20, 30, 40}), scalars({2, 0.5f});
  ASSERT_EQ(cublasLtMatmul(lt_, s.desc, scalars.get(), A.get(), s.a, B.get(), s.b, scalars.get() + 1, CD.get(), s.c,
                           CD.get(), s.d, nullptr, nullptr, 0, nullptr),
            CUBLAS_STATUS_SUCCESS);
  expect_floats(CD.download(), {121, 288, 143, 328});
}

TEST_F(Lt, HeuristicOffersOneAlgorithmThatRuns) {
  LtShape s(CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, 2, 3, 2);
  cublasLtMatmulHeuristicResult_t result{};
  int found = -1;
  ASSERT_EQ(heuristic(s, 16, result, found), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(found, 1);
  EXPECT_EQ(result.state, CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(result.workspaceSize, 0u);
  DeviceArray<float> A(kAn), B(kBn), D(std::vector<float>(4, 0)), workspace(std::vector<float>(256, 0));
  ASSERT_EQ(matmul(s, 1, A.get(), B.get(), 0, D.get(), nullptr, &result.algo, workspace.get(), 1024),
            CUBLAS_STATUS_SUCCESS);
  expect_floats(D.download(), kProduct);
  // No algorithm for a request of none.
  cublasLtMatmulPreference_t pref = nullptr;
  ASSERT_EQ(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(lt_, s.desc, s.a, s.b, s.c, s.d, pref, 0, &result, &found),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(found, 0);
  cublasLtMatmulPreferenceDestroy(pref);
}

TEST_F(Lt, AlgorithmRefusesPointersLessAlignedThanItWasChosenFor) {
  // Chosen for 16-byte alignment; A one float past a cudaMalloc'd start is only 4-byte aligned.
  LtShape s(CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, 2, 3, 2);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  ASSERT_EQ(heuristic(s, 16, result, found), CUBLAS_STATUS_SUCCESS);
  std::vector<float> shifted = {0};
  shifted.insert(shifted.end(), kAn.begin(), kAn.end());
  DeviceArray<float> A(shifted), B(kBn), D(std::vector<float>(4, 0));
  EXPECT_EQ(matmul(s, 1, A.get() + 1, B.get(), 0, D.get(), nullptr, &result.algo), CUBLAS_STATUS_INVALID_VALUE);
  // Chosen for 4 bytes, it runs.
  ASSERT_EQ(heuristic(s, 4, result, found), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(matmul(s, 1, A.get() + 1, B.get(), 0, D.get(), nullptr, &result.algo), CUBLAS_STATUS_SUCCESS);
  expect_floats(D.download(), kProduct);
}

TEST_F(Lt, AuxLeadingDimensionMustBeAMultipleOf8) {
  // aux ld 2 (≥ the 2 rows, but not a multiple of 8): no algorithm, and cublasLtMatmul refuses it.
  LtShape s(CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 1, 2, 1, 2);
  DeviceArray<float> A(kGeluA), B(kGeluB), D(std::vector<float>(4, 0)), aux(std::vector<float>(16, 0));
  s.epilogue(CUBLASLT_EPILOGUE_GELU_AUX);
  s.aux(aux.get(), 2);
  cublasLtMatmulHeuristicResult_t result{};
  int found = -1;
  EXPECT_NE(heuristic(s, 16, result, found), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(found, 0);
  EXPECT_EQ(matmul(s, 1, A.get(), B.get(), 0, D.get()), CUBLAS_STATUS_INVALID_VALUE);
  // ld 8 is accepted; the heuristic reads the aux pointer only for its alignment (here a stand-in).
  s.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, reinterpret_cast<void*>(std::uintptr_t{16}));
  s.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, std::int64_t{8});
  ASSERT_EQ(heuristic(s, 16, result, found), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(found, 1);
  s.aux(aux.get(), 8);
  EXPECT_EQ(matmul(s, 1, A.get(), B.get(), 0, D.get(), nullptr, &result.algo), CUBLAS_STATUS_SUCCESS);
}

TEST_F(Lt, AttributesRoundTripAndCheckTheirSize) {
  cublasLtMatmulDesc_t desc = nullptr;
  ASSERT_EQ(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
  const std::int32_t t = CUBLAS_OP_T;
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t), CUBLAS_STATUS_SUCCESS);
  std::int32_t got = -1;
  std::size_t written = 0;
  EXPECT_EQ(cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &got, sizeof got, &written),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(got, CUBLAS_OP_T);
  EXPECT_EQ(written, sizeof got);
  // Defaults: epilogue DEFAULT, compute type as created.
  std::uint32_t epi = 0;
  EXPECT_EQ(cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi, nullptr),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(epi, static_cast<std::uint32_t>(CUBLASLT_EPILOGUE_DEFAULT));
  std::int32_t compute = 0;
  EXPECT_EQ(cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, &compute, sizeof compute, nullptr),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(compute, CUBLAS_COMPUTE_32F);
  // A size other than the attribute's, or no buffer: INVALID_VALUE.
  const std::int64_t wide = CUBLAS_OP_N;
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &wide, sizeof wide),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, nullptr, sizeof t),
            CUBLAS_STATUS_INVALID_VALUE);
  // A size query (sizeInBytes 0) answers through sizeWritten, which it then needs.
  written = 0;
  EXPECT_EQ(cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, nullptr, 0, &written),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(written, sizeof(std::int64_t));
  EXPECT_EQ(cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, nullptr, 0, nullptr),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatmulDescDestroy(desc), CUBLAS_STATUS_SUCCESS);

  // A layout initialised in caller-provided storage (the header's cublasLtMatrixLayoutInit).
  cublasLtMatrixLayoutOpaque_t storage{};
  ASSERT_EQ(cublasLtMatrixLayoutInit(&storage, CUDA_R_16BF, 5, 7, 8), CUBLAS_STATUS_SUCCESS);
  std::uint64_t rows = 0;
  std::int64_t ld = 0;
  std::uint32_t type = 0;
  EXPECT_EQ(cublasLtMatrixLayoutGetAttribute(&storage, CUBLASLT_MATRIX_LAYOUT_ROWS, &rows, sizeof rows, nullptr),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatrixLayoutGetAttribute(&storage, CUBLASLT_MATRIX_LAYOUT_LD, &ld, sizeof ld, nullptr),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatrixLayoutGetAttribute(&storage, CUBLASLT_MATRIX_LAYOUT_TYPE, &type, sizeof type, nullptr),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(rows, 5u);
  EXPECT_EQ(ld, 8);
  EXPECT_EQ(type, static_cast<std::uint32_t>(CUDA_R_16BF));

  // Preference defaults: no workspace, 256-byte alignments.
  cublasLtMatmulPreference_t pref = nullptr;
  ASSERT_EQ(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
  std::uint64_t ws = 1;
  std::uint32_t align = 0;
  EXPECT_EQ(cublasLtMatmulPreferenceGetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws, nullptr),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatmulPreferenceGetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align, sizeof align,
                                                 nullptr),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(ws, 0u);
  EXPECT_EQ(align, 256u);
  EXPECT_EQ(cublasLtMatmulPreferenceDestroy(pref), CUBLAS_STATUS_SUCCESS);
}

TEST_F(Lt, InvalidArgumentsGiveTheDocumentedStatus) {
  DeviceArray<float> A(kAn), B(kBn), D({5, 5, 5, 5}), bias({0, 0});
  std::vector<float> host(8, 0);
  const float one = 1, zero = 0;
  const auto shape = [] { return std::make_unique<LtShape>(CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, 2, 3, 2); };
  {  // null handle
    auto s = shape();
    EXPECT_EQ(cublasLtMatmul(nullptr, s->desc, &one, A.get(), s->a, B.get(), s->b, &zero, D.get(), s->c, D.get(), s->d,
                             nullptr, nullptr, 0, nullptr),
              CUBLAS_STATUS_NOT_INITIALIZED);
  }
  {  // a leading dimension below the stored rows
    auto s = shape();
    const std::int64_t ld = 1;
    ASSERT_EQ(cublasLtMatrixLayoutSetAttribute(s->a, CUBLASLT_MATRIX_LAYOUT_LD, &ld, sizeof ld), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(matmul(*s, 1, A.get(), B.get(), 0, D.get()), CUBLAS_STATUS_INVALID_VALUE);
  }
  {  // op(A) has 3 columns, op(B) 2 rows
    auto s = shape();
    const std::uint64_t rows = 2;
    ASSERT_EQ(cublasLtMatrixLayoutSetAttribute(s->b, CUBLASLT_MATRIX_LAYOUT_ROWS, &rows, sizeof rows),
              CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(matmul(*s, 1, A.get(), B.get(), 0, D.get()), CUBLAS_STATUS_INVALID_VALUE);
  }
  {  // batch counts that differ
    auto s = shape();
    const std::int32_t two = 2;
    ASSERT_EQ(cublasLtMatrixLayoutSetAttribute(s->a, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &two, sizeof two),
              CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(matmul(*s, 1, A.get(), B.get(), 0, D.get()), CUBLAS_STATUS_INVALID_VALUE);
  }
  {  // C and D the same matrix, described with different leading dimensions
    auto s = shape();
    const std::int64_t ld = 3;
    ASSERT_EQ(cublasLtMatrixLayoutSetAttribute(s->c, CUBLASLT_MATRIX_LAYOUT_LD, &ld, sizeof ld), CUBLAS_STATUS_SUCCESS);
    DeviceArray<float> CD(std::vector<float>(6, 0));
    EXPECT_EQ(matmul(*s, 1, A.get(), B.get(), 1, CD.get()), CUBLAS_STATUS_INVALID_VALUE);
  }
  {  // row-major order: not supported
    auto s = shape();
    const std::int32_t order = CUBLASLT_ORDER_ROW;
    ASSERT_EQ(cublasLtMatrixLayoutSetAttribute(s->a, CUBLASLT_MATRIX_LAYOUT_ORDER, &order, sizeof order),
              CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(matmul(*s, 1, A.get(), B.get(), 0, D.get()), CUBLAS_STATUS_NOT_SUPPORTED);
  }
  {  // A bf16, B fp32: not supported
    LtShape s(CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, 2, 3, 2);
    const std::uint32_t bf16 = CUDA_R_16BF;
    ASSERT_EQ(cublasLtMatrixLayoutSetAttribute(s.a, CUBLASLT_MATRIX_LAYOUT_TYPE, &bf16, sizeof bf16),
              CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(matmul(s, 1, A.get(), B.get(), 0, D.get()), CUBLAS_STATUS_NOT_SUPPORTED);
  }
  {  // BIAS without a bias pointer; with a host one
    auto s = shape();
    s->epilogue(CUBLASLT_EPILOGUE_BIAS);
    EXPECT_EQ(matmul(*s, 1, A.get(), B.get(), 0, D.get()), CUBLAS_STATUS_INVALID_VALUE);
    s->bias(host.data());
    EXPECT_EQ(matmul(*s, 1, A.get(), B.get(), 0, D.get()), CUBLAS_STATUS_INVALID_VALUE);
  }
  {  // a bias type other than D's
    auto s = shape();
    s->epilogue(CUBLASLT_EPILOGUE_BIAS);
    s->bias(bias.get());
    s->set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, std::int32_t{CUDA_R_16BF});
    EXPECT_EQ(matmul(*s, 1, A.get(), B.get(), 0, D.get()), CUBLAS_STATUS_NOT_SUPPORTED);
  }
  {  // an aux type other than D's (the header: INVALID_VALUE)
    auto s = shape();
    DeviceArray<float> aux(std::vector<float>(16, 0));
    s->epilogue(CUBLASLT_EPILOGUE_GELU_AUX);
    s->aux(aux.get(), 8);
    s->set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, std::int32_t{CUDA_R_16BF});
    EXPECT_EQ(matmul(*s, 1, A.get(), B.get(), 0, D.get()), CUBLAS_STATUS_INVALID_VALUE);
  }
  {  // epilogues outside the implemented set; an unknown value
    auto s = shape();
    s->epilogue(CUBLASLT_EPILOGUE_DGELU_BGRAD);
    EXPECT_EQ(matmul(*s, 1, A.get(), B.get(), 0, D.get()), CUBLAS_STATUS_NOT_SUPPORTED);
    s->set(CUBLASLT_MATMUL_DESC_EPILOGUE, std::uint32_t{12345});
    EXPECT_EQ(matmul(*s, 1, A.get(), B.get(), 0, D.get()), CUBLAS_STATUS_INVALID_VALUE);
  }
  {  // a bias gradient of a batched problem
    auto s = shape();
    s->batch(2, 0, 0, 4);
    s->epilogue(CUBLASLT_EPILOGUE_BGRADA);
    s->bias(bias.get());
    DeviceArray<float> D2(std::vector<float>(8, 0));
    EXPECT_EQ(matmul(*s, 1, A.get(), B.get(), 0, D2.get()), CUBLAS_STATUS_NOT_SUPPORTED);
  }
  {  // vector pointer modes, scale pointers: not supported
    auto s = shape();
    s->set(CUBLASLT_MATMUL_DESC_POINTER_MODE, std::int32_t{CUBLASLT_POINTER_MODE_DEVICE_VECTOR});
    EXPECT_EQ(matmul(*s, 1, A.get(), B.get(), 0, D.get()), CUBLAS_STATUS_NOT_SUPPORTED);
    auto s2 = shape();
    s2->set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(bias.get()));
    EXPECT_EQ(matmul(*s2, 1, A.get(), B.get(), 0, D.get()), CUBLAS_STATUS_NOT_SUPPORTED);
  }
  {  // host memory for an operand, for D, for the workspace
    auto s = shape();
    EXPECT_EQ(matmul(*s, 1, host.data(), B.get(), 0, D.get()), CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_EQ(matmul(*s, 1, A.get(), B.get(), 0, host.data()), CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_EQ(matmul(*s, 1, A.get(), B.get(), 0, D.get(), nullptr, nullptr, host.data(), 16),
              CUBLAS_STATUS_INVALID_VALUE);
  }
  // Refused calls enqueued nothing.
  expect_floats(D.download(), {5, 5, 5, 5});
}

}  // namespace
}  // namespace zinf::cudax
