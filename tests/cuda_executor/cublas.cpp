// cublas.cpp — cuBLAS and cuBLASLt for the CPU executor (tests/cuda_executor): the entry points of
// NVIDIA's <cublas_v2.h> and <cublasLt.h> that zinf's CUDA backend calls, with the headers' own
// declarations, computed on the CPU over the executor's host-memory runtime (cudax/runtime.h). Written
// from NVIDIA's documentation of the two libraries (and the comments in their headers), not from the
// code that calls them.
//
// What it assumes
//   - Column-major matrices, as cuBLAS defines them: element (i, j) of a stored matrix with leading
//     dimension ld is at i + j·ld; op(X) is X (CUBLAS_OP_N) or its transpose (CUBLAS_OP_T, and
//     CUBLAS_OP_C, which is the same for real types). D = alpha·op(A)·op(B) + beta·C, op(A) m×k,
//     op(B) k×n, C and D m×n. Batches: instance t of X starts t·stride elements after X.
//   - Every matrix, vector, workspace and device-mode scalar is cudaMalloc memory. The fake checks
//     this (zinf::cudax::is_device_range over every byte a call touches) and answers
//     CUBLAS_STATUS_INVALID_VALUE otherwise; cuBLAS leaves host pointers undefined, the fake is strict.
//   - Work is enqueued in stream order (zinf::cudax::enqueue) on the handle's stream (cublasSetStream)
//     or cublasLtMatmul's stream argument; every argument is checked before anything is enqueued, so
//     a refused call enqueues nothing. Host-mode alpha/beta are read during the call, device-mode ones
//     when the work runs. The work re-checks its memory when it runs (memory gone since the call: the
//     stream's error becomes cudaErrorIllegalAddress; cudaFree synchronises first, so this is a guard).
//   - Scale type (alpha, beta) fp32.
//
// Arithmetic
//   - Inputs are fp32, fp16 or bf16, all exact in float. CUBLAS_COMPUTE_32F_FAST_16BF / _FAST_16F /
//     _FAST_TF32 "allow down-converting" the fp32 inputs: the fake always does, rounding each A and B
//     element to bf16 / fp16 / TF32 (10 mantissa bits) to nearest even, as tensor cores would; C and
//     bias are not converted.
//   - CUBLAS_COMPUTE_32F (the default kind: "at least the same precision and range" as fp32): products
//     and sums in double, then alpha, beta·C, bias and GELU in double; the result is rounded once to
//     the output type. This is more precise than fp32 accumulation, which the default type allows.
//   - CUBLAS_COMPUTE_32F_PEDANTIC ("exact specified internal storage format"): the sum over k in fp32,
//     one fused multiply-add per step in increasing k (the order is the fake's choice), then every
//     epilogue step in fp32; a 16-bit output is one more rounding of that fp32 value.
//   - Stores (D, the GELU input in aux, the bias gradient) round to nearest even with NVIDIA's host
//     conversions (__double2half, __double2bfloat16, or double → float): for the default compute
//     types that is the only rounding after the inputs.
//   - Math modes (cublasSetMathMode) are stored and reported; they never change the arithmetic here,
//     which the computeType alone decides (TF32 math mode only allows TF32, it does not require it).
//   - beta == 0: C is not read (cuBLAS: C need not be a valid input then), so NaN in C does not spread.
//
// cuBLASLt epilogues (CUBLASLT_MATMUL_DESC_EPILOGUE), with x = alpha·(op(A)·op(B))[i,j] + beta·C[i,j]:
//   DEFAULT        D = x
//   BIAS           D = x + bias[i]: bias has one element per row of D, broadcast over the columns
//   GELU           D = gelu(x)
//   GELU_BIAS      D = gelu(x + bias[i])
//   GELU_AUX       aux = x (the GELU input, rounded to aux's type), D = gelu(x) from the unrounded x
//   GELU_AUX_BIAS  aux = x + bias[i], D = gelu(x + bias[i])
//   BGRADA         D = x; bias[i] = Σ_k op(A)[i,k] (m elements; written, not added to; not scaled)
//   BGRADB         D = x; bias[j] = Σ_k op(B)[k,j] (n elements)
// gelu: NVIDIA documents the epilogue only as "x := GELU(x)", without saying which GELU; the fake
// computes the tanh approximation (the form frameworks pair with this epilogue),
//   gelu(x) = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))),
// not the erf form x·Φ(x); the two differ by at most about 5e-4 (near |x| = 2.7).
// Bias and bias-gradient elements have D's type (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE may name it
// again); aux has D's type (CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE likewise), leading dimension
// CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD (a multiple of 8, at least D's rows) and, for batches, batch
// stride CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE (a multiple of 8). Batched bias vectors step
// by CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE (default 0: one vector for every instance).
//
// Type combinations (NVIDIA's tables for cublasGemmEx and cublasLtMatmul, the real-valued rows):
//   COMPUTE_32F, COMPUTE_32F_PEDANTIC:  A = B = fp32 → C = D fp32;  fp16 → fp16 or fp32;  bf16 → bf16 or fp32
//   COMPUTE_32F_FAST_16F / _FAST_16BF / _FAST_TF32:  A = B = C = D = fp32
// The heuristic (cublasLtMatmulAlgoGetHeuristic) offers one algorithm for every problem that
// cublasLtMatmul would run, with no workspace; it records the alignments it was asked to assume (the
// preference's CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_{A,B,C,D}_BYTES, default 256, and the alignment of
// the descriptor's bias and aux pointer values, which it never dereferences; a null one promises
// nothing) and cublasLtMatmul refuses that algorithm, with INVALID_VALUE, for pointers less aligned
// than that. A null algo runs the implicit heuristic (no alignment asked).
//
// Refused (status in parentheses; nothing is enqueued):
//   - a null handle (NOT_INITIALIZED); a null descriptor or one not made by the fake's Create/Init
//     functions (INVALID_VALUE);
//   - negative sizes or batch counts, leading dimensions below the stored rows, op values other than
//     N/T/C, null alpha/beta, layouts whose sizes disagree, differing batch counts (INVALID_VALUE);
//   - type combinations outside the table above, A and B of different types, C and D of different
//     types, compute types 16F, 32I, 64F and the emulated ones, scale types other than fp32 (NOT_SUPPORTED);
//   - cuBLASLt: row-major or tiled orders, pointer-array batches, planar complex, TRANSC ≠ N, fill modes
//     other than FULL, vector pointer modes, scale/amax pointers, scale modes, an emulation
//     descriptor, the RELU and DRELU/DGELU epilogues, bias gradients of batched problems, bias types
//     other than D's (NOT_SUPPORTED); aux types other than D's, aux leading dimensions that are not a
//     multiple of 8 or below D's rows, a missing bias/aux pointer, C == D with different layouts, a
//     workspace that is not device memory (INVALID_VALUE);
//   - any pointer the call would touch that is not cudaMalloc memory (INVALID_VALUE).
// Ignored, being performance hints: CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, _FAST_ACCUM (fp8 only),
// _ALPHA_VECTOR_BATCH_STRIDE (vector pointer modes only), the preference's search mode, reduction
// scheme mask (the fake never splits k), wave count and implementation mask.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <thread>
#include <type_traits>
#include <vector>

#include "cudax/runtime.h"

// The objects behind the two handle types; the headers name these structs and hand out pointers.
struct cublasContext {
  std::uint64_t magic = 0;
  cudaStream_t stream = nullptr;
  cublasPointerMode_t pointer_mode = CUBLAS_POINTER_MODE_HOST;
  cublasMath_t math_mode = CUBLAS_DEFAULT_MATH;
};
struct cublasLtContext {
  std::uint64_t magic = 0;
};

namespace zinf::cudax {
namespace {

constexpr std::uint64_t kHandleMagic = 0x7a696e66626c6173ULL;      // "zinfblas"
constexpr std::uint64_t kLtHandleMagic = 0x7a696e66626c746cULL;    // "zinfbltl"
constexpr std::uint64_t kLayoutMagic = 0x7a696e666c61796fULL;      // "zinflayo"
constexpr std::uint64_t kDescMagic = 0x7a696e666d646573ULL;        // "zinfmdes"
constexpr std::uint64_t kPreferenceMagic = 0x7a696e6670726566ULL;  // "zinfpref"
constexpr std::uint64_t kAlgoMagic = 0x7a696e66616c676fULL;        // "zinfalgo"

// ---- element types -----------------------------------------------------------------------------

bool is_storage_type(std::int64_t t) { return t == CUDA_R_32F || t == CUDA_R_16F || t == CUDA_R_16BF; }

std::int64_t element_size(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }

float load_element(cudaDataType t, const void* base, std::int64_t i) {
  const auto* p = static_cast<const unsigned char*>(base) + i * element_size(t);
  switch (t) {
    case CUDA_R_16F: {
      __half h;
      std::memcpy(static_cast<void*>(&h), p, sizeof h);
      return __half2float(h);
    }
    case CUDA_R_16BF: {
      __nv_bfloat16 h;
      std::memcpy(static_cast<void*>(&h), p, sizeof h);
      return __bfloat162float(h);
    }
    default: {
      float f;
      std::memcpy(&f, p, sizeof f);
      return f;
    }
  }
}

// Rounds v once, to nearest even, into element i of base.
void store_element(cudaDataType t, void* base, std::int64_t i, double v) {
  auto* p = static_cast<unsigned char*>(base) + i * element_size(t);
  switch (t) {
    case CUDA_R_16F: {
      const __half h = __double2half(v);
      std::memcpy(p, static_cast<const void*>(&h), sizeof h);
      return;
    }
    case CUDA_R_16BF: {
      const __nv_bfloat16 h = __double2bfloat16(v);
      std::memcpy(p, static_cast<const void*>(&h), sizeof h);
      return;
    }
    default: {
      const float f = static_cast<float>(v);
      std::memcpy(p, &f, sizeof f);
      return;
    }
  }
}

// How a FAST compute type down-converts fp32 inputs.
enum class InputRounding { exact, bf16, fp16, tf32 };

float round_input(float v, InputRounding r) {
  switch (r) {
    case InputRounding::exact: return v;
    case InputRounding::bf16: return __bfloat162float(__float2bfloat16(v));
    case InputRounding::fp16: return __half2float(__float2half(v));
    case InputRounding::tf32: {
      std::uint32_t u;
      std::memcpy(&u, &v, sizeof u);
      if ((u & 0x7f800000u) != 0x7f800000u) {  // finite: keep 10 of the 23 mantissa bits, ties to even
        u += 0x0fffu + ((u >> 13) & 1u);
        u &= ~0x1fffu;
      }
      std::memcpy(&v, &u, sizeof v);
      return v;
    }
  }
  return v;
}

// The compute types the fake runs, and the inputs each admits.
struct ComputeMode {
  InputRounding rounding = InputRounding::exact;
  bool pedantic = false;   // fp32 accumulation
  bool fp32_only = false;  // A, B, C, D all fp32
};

cublasStatus_t compute_mode(std::int64_t compute, ComputeMode& out) {
  out = ComputeMode{};
  switch (compute) {
    case CUBLAS_COMPUTE_32F: return CUBLAS_STATUS_SUCCESS;
    case CUBLAS_COMPUTE_32F_PEDANTIC: out.pedantic = true; return CUBLAS_STATUS_SUCCESS;
    case CUBLAS_COMPUTE_32F_FAST_16F:
      out.rounding = InputRounding::fp16, out.fp32_only = true;
      return CUBLAS_STATUS_SUCCESS;
    case CUBLAS_COMPUTE_32F_FAST_16BF:
      out.rounding = InputRounding::bf16, out.fp32_only = true;
      return CUBLAS_STATUS_SUCCESS;
    case CUBLAS_COMPUTE_32F_FAST_TF32:
      out.rounding = InputRounding::tf32, out.fp32_only = true;
      return CUBLAS_STATUS_SUCCESS;
    case CUBLAS_COMPUTE_16F:
    case CUBLAS_COMPUTE_16F_PEDANTIC:
    case CUBLAS_COMPUTE_32F_EMULATED_16BFX9:
    case CUBLAS_COMPUTE_64F:
    case CUBLAS_COMPUTE_64F_PEDANTIC:
    case CUBLAS_COMPUTE_64F_EMULATED_FIXEDPOINT:
    case CUBLAS_COMPUTE_32I:
    case CUBLAS_COMPUTE_32I_PEDANTIC: return CUBLAS_STATUS_NOT_SUPPORTED;
    default: return CUBLAS_STATUS_INVALID_VALUE;
  }
}

// A = B of type ab, C = D of type cd: a row of the tables in the file's header comment.
bool supported_types(cudaDataType ab, cudaDataType cd, const ComputeMode& mode) {
  if (mode.fp32_only) return ab == CUDA_R_32F && cd == CUDA_R_32F;
  switch (ab) {
    case CUDA_R_32F: return cd == CUDA_R_32F;
    case CUDA_R_16F: return cd == CUDA_R_16F || cd == CUDA_R_32F;
    case CUDA_R_16BF: return cd == CUDA_R_16BF || cd == CUDA_R_32F;
    default: return false;
  }
}

bool valid_op(std::int64_t op) { return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C; }

// The largest power of two, up to 256, dividing the address (null: 256).
std::uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t al = 256;
  while (al > 1 && a % al != 0) al /= 2;
  return al;
}

// ---- the problem the work computes -------------------------------------------------------------

// A stored column-major matrix; batch instance t starts t·stride elements after ptr.
struct Matrix {
  const void* ptr = nullptr;
  cudaDataType type = CUDA_R_32F;
  std::int64_t rows = 0, cols = 0, ld = 0;
  std::int64_t stride = 0;
};

// Whether every element of the `batch` instances of m lies in one device allocation.
bool on_device(const Matrix& m, std::int64_t batch) {
  if (m.rows == 0 || m.cols == 0 || batch == 0) return true;
  if (m.ptr == nullptr) return false;
  const std::int64_t last = (batch - 1) * m.stride;
  const std::int64_t lo = std::min<std::int64_t>(0, last);
  const std::int64_t hi = std::max<std::int64_t>(0, last) + (m.cols - 1) * m.ld + m.rows;
  const std::int64_t es = element_size(m.type);
  const auto first = reinterpret_cast<std::uintptr_t>(m.ptr) + static_cast<std::uintptr_t>(lo * es);
  return is_device_range(reinterpret_cast<const void*>(first), static_cast<std::size_t>((hi - lo) * es));
}

struct Epilogue {
  bool add_bias = false;     // bias[i] added to every column
  bool gelu = false;         // D = gelu(pre)
  bool write_aux = false;    // aux = pre
  bool bias_grad_a = false;  // bias[i] = Σ_k op(A)[i,k]
  bool bias_grad_b = false;  // bias[j] = Σ_k op(B)[k,j]
};

struct Problem {
  bool trans_a = false, trans_b = false;
  std::int64_t m = 0, n = 0, k = 0, batch = 1;
  Matrix a, b, c, d;  // d.ptr is written (C and D may be the same matrix)
  bool reads_c = false;
  ComputeMode mode;
  bool device_scalars = false;  // alpha_ptr/beta_ptr, read when the work runs
  float alpha = 1, beta = 0;
  const float* alpha_ptr = nullptr;
  const float* beta_ptr = nullptr;
  Epilogue epi;
  Matrix bias;  // a column of m (or, for BGRADB, n) elements; stride = the bias batch stride
  Matrix aux;   // m × n, written
};

bool memory_still_valid(const Problem& p) {
  if (p.m == 0 || p.n == 0) return true;
  if (p.k > 0 && (!on_device(p.a, p.batch) || !on_device(p.b, p.batch))) return false;
  if (!on_device(p.d, p.batch) || (p.reads_c && !on_device(p.c, p.batch))) return false;
  if (p.device_scalars && (!is_device_range(p.alpha_ptr, sizeof(float)) || !is_device_range(p.beta_ptr, sizeof(float))))
    return false;
  const Epilogue& e = p.epi;
  if ((e.add_bias || e.bias_grad_a || e.bias_grad_b) && !on_device(p.bias, p.batch)) return false;
  if (e.write_aux && !on_device(p.aux, p.batch)) return false;
  return true;
}

template <class Acc>
Acc gelu_tanh(Acc x) {
  const Acc sqrt_2_over_pi = static_cast<Acc>(0.79788456080286535588);
  const Acc cubic = static_cast<Acc>(0.044715);
  return static_cast<Acc>(0.5) * x * (static_cast<Acc>(1) + std::tanh(sqrt_2_over_pi * (x + cubic * x * x * x)));
}

// Σ_l x[l]·y[l]: in double (exact products, four running sums in a fixed order), or, pedantic, in
// fp32 with one fused multiply-add per l.
template <class Acc>
Acc dot(const float* x, const float* y, std::int64_t k) {
  if constexpr (std::is_same_v<Acc, float>) {
    float s = 0;
    for (std::int64_t l = 0; l < k; ++l) s = std::fma(x[l], y[l], s);
    return s;
  } else {
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    std::int64_t l = 0;
    for (; l + 4 <= k; l += 4) {
      s0 += static_cast<double>(x[l]) * y[l];
      s1 += static_cast<double>(x[l + 1]) * y[l + 1];
      s2 += static_cast<double>(x[l + 2]) * y[l + 2];
      s3 += static_cast<double>(x[l + 3]) * y[l + 3];
    }
    for (; l < k; ++l) s0 += static_cast<double>(x[l]) * y[l];
    return (s0 + s1) + (s2 + s3);
  }
}

template <class Acc>
Acc sum(const float* x, std::int64_t k) {
  Acc s = 0;
  for (std::int64_t l = 0; l < k; ++l) s += static_cast<Acc>(x[l]);
  return s;
}

// Instance t of p: reads everything it needs before it writes anything.
template <class Acc>
void run_instance(const Problem& p, std::int64_t t, float alpha, float beta) {
  const std::int64_t m = p.m, n = p.n, k = p.k;
  // op(A) as m rows of k and op(B) as n rows of k, so each dot product reads two contiguous rows.
  std::vector<float> op_a(static_cast<std::size_t>(m * k)), op_b(static_cast<std::size_t>(n * k));
  const std::int64_t a0 = t * p.a.stride, b0 = t * p.b.stride;
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t l = 0; l < k; ++l) {
      const std::int64_t at = p.trans_a ? l + i * p.a.ld : i + l * p.a.ld;
      op_a[static_cast<std::size_t>(i * k + l)] = round_input(load_element(p.a.type, p.a.ptr, a0 + at), p.mode.rounding);
    }
  for (std::int64_t j = 0; j < n; ++j)
    for (std::int64_t l = 0; l < k; ++l) {
      const std::int64_t at = p.trans_b ? j + l * p.b.ld : l + j * p.b.ld;
      op_b[static_cast<std::size_t>(j * k + l)] = round_input(load_element(p.b.type, p.b.ptr, b0 + at), p.mode.rounding);
    }
  const bool read_c = p.reads_c && beta != 0.0f;
  const std::int64_t c0 = t * p.c.stride, bias0 = t * p.bias.stride;
  std::vector<Acc> out(static_cast<std::size_t>(m * n)), pre;
  if (p.epi.write_aux) pre.resize(out.size());

  const auto columns = [&](std::int64_t j_begin, std::int64_t j_end) {
    for (std::int64_t j = j_begin; j < j_end; ++j)
      for (std::int64_t i = 0; i < m; ++i) {
        Acc x = static_cast<Acc>(alpha) * dot<Acc>(op_a.data() + i * k, op_b.data() + j * k, k);
        if (read_c) x += static_cast<Acc>(beta) * static_cast<Acc>(load_element(p.c.type, p.c.ptr, c0 + i + j * p.c.ld));
        if (p.epi.add_bias) x += static_cast<Acc>(load_element(p.bias.type, p.bias.ptr, bias0 + i));
        const auto at = static_cast<std::size_t>(i + j * m);
        if (p.epi.write_aux) pre[at] = x;
        out[at] = p.epi.gelu ? gelu_tanh(x) : x;
      }
  };
  // Large problems: columns split over threads (each element is computed alone, so the result does
  // not depend on the split).
  const std::int64_t work = m * n * std::max<std::int64_t>(k, 1);
  const std::int64_t threads = std::min<std::int64_t>(
      {static_cast<std::int64_t>(std::max(1u, std::thread::hardware_concurrency())), 16, n, work >> 20});
  if (threads <= 1) {
    columns(0, n);
  } else {
    std::vector<std::thread> pool;
    for (std::int64_t w = 0; w < threads; ++w)
      pool.emplace_back([&columns, lo = n * w / threads, hi = n * (w + 1) / threads] {
        const DeviceAccess device_work;  // this thread's own: the guard is per thread where it can be
        columns(lo, hi);
      });
    for (std::thread& th : pool) th.join();
  }

  void* d = const_cast<void*>(p.d.ptr);
  const std::int64_t d0 = t * p.d.stride;
  for (std::int64_t j = 0; j < n; ++j)
    for (std::int64_t i = 0; i < m; ++i)
      store_element(p.d.type, d, d0 + i + j * p.d.ld, static_cast<double>(out[static_cast<std::size_t>(i + j * m)]));
  if (p.epi.write_aux) {
    void* aux = const_cast<void*>(p.aux.ptr);
    const std::int64_t x0 = t * p.aux.stride;
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t i = 0; i < m; ++i)
        store_element(p.aux.type, aux, x0 + i + j * p.aux.ld, static_cast<double>(pre[static_cast<std::size_t>(i + j * m)]));
  }
  void* bias = const_cast<void*>(p.bias.ptr);
  if (p.epi.bias_grad_a)
    for (std::int64_t i = 0; i < m; ++i)
      store_element(p.bias.type, bias, bias0 + i,
                    static_cast<double>(sum<Acc>(op_a.data() + i * k, k)));
  if (p.epi.bias_grad_b)
    for (std::int64_t j = 0; j < n; ++j)
      store_element(p.bias.type, bias, bias0 + j,
                    static_cast<double>(sum<Acc>(op_b.data() + j * k, k)));
}

// The stream work of one call.
cudaError_t run_problem(const Problem& p) {
  if (!memory_still_valid(p)) return cudaErrorIllegalAddress;
  const float alpha = p.device_scalars ? *p.alpha_ptr : p.alpha;
  const float beta = p.device_scalars ? *p.beta_ptr : p.beta;
  for (std::int64_t t = 0; t < p.batch; ++t) {
    if (p.mode.pedantic)
      run_instance<float>(p, t, alpha, beta);
    else
      run_instance<double>(p, t, alpha, beta);
  }
  return cudaSuccess;
}

cublasStatus_t enqueue_problem(cudaStream_t stream, const Problem& p) {
  const cudaError_t e = enqueue(stream, [p] { return run_problem(p); });
  return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

// ---- cuBLAS ------------------------------------------------------------------------------------

bool valid_handle(cublasHandle_t h) { return h != nullptr && h->magic == kHandleMagic; }

// cublasGemmEx and cublasGemmStridedBatchedEx (batch 1, strides unused, for the former).
cublasStatus_t gemm_ex(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, std::int64_t m,
                       std::int64_t n, std::int64_t k, const void* alpha, const void* A, cudaDataType a_type,
                       std::int64_t lda, std::int64_t stride_a, const void* B, cudaDataType b_type, std::int64_t ldb,
                       std::int64_t stride_b, const void* beta, void* C, cudaDataType c_type, std::int64_t ldc,
                       std::int64_t stride_c, std::int64_t batch, cublasComputeType_t compute_type,
                       cublasGemmAlgo_t algo) {
  if (!valid_handle(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  // The documented INVALID_VALUE cases: sizes, ops, leading dimensions, scalars.
  if (m < 0 || n < 0 || k < 0 || batch < 0) return CUBLAS_STATUS_INVALID_VALUE;
  if (!valid_op(transa) || !valid_op(transb)) return CUBLAS_STATUS_INVALID_VALUE;
  const bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;
  if (lda < std::max<std::int64_t>(1, ta ? k : m) || ldb < std::max<std::int64_t>(1, tb ? n : k) ||
      ldc < std::max<std::int64_t>(1, m))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (alpha == nullptr || beta == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  ComputeMode mode;
  if (const cublasStatus_t st = compute_mode(compute_type, mode); st != CUBLAS_STATUS_SUCCESS) return st;
  if (a_type != b_type || !supported_types(a_type, c_type, mode)) return CUBLAS_STATUS_NOT_SUPPORTED;
  const bool known_algo = algo == CUBLAS_GEMM_DEFAULT || algo == CUBLAS_GEMM_DEFAULT_TENSOR_OP ||
                          algo == CUBLAS_GEMM_AUTOTUNE || (algo >= CUBLAS_GEMM_ALGO0 && algo <= CUBLAS_GEMM_ALGO23) ||
                          (algo >= CUBLAS_GEMM_ALGO0_TENSOR_OP && algo <= CUBLAS_GEMM_ALGO15_TENSOR_OP);
  if (!known_algo) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;  // nothing to compute or write

  Problem p;
  p.trans_a = ta, p.trans_b = tb;
  p.m = m, p.n = n, p.k = k, p.batch = batch;
  p.a = {A, a_type, ta ? k : m, ta ? m : k, lda, stride_a};
  p.b = {B, b_type, tb ? n : k, tb ? k : n, ldb, stride_b};
  p.c = {C, c_type, m, n, ldc, stride_c};
  p.d = p.c;
  p.mode = mode;
  if (handle->pointer_mode == CUBLAS_POINTER_MODE_DEVICE) {
    p.device_scalars = true;
    p.alpha_ptr = static_cast<const float*>(alpha), p.beta_ptr = static_cast<const float*>(beta);
    if (!is_device_range(alpha, sizeof(float)) || !is_device_range(beta, sizeof(float)))
      return CUBLAS_STATUS_INVALID_VALUE;
    p.reads_c = true;
  } else {
    std::memcpy(&p.alpha, alpha, sizeof(float));
    std::memcpy(&p.beta, beta, sizeof(float));
    p.reads_c = p.beta != 0.0f;
  }
  if (k > 0 && (!on_device(p.a, batch) || !on_device(p.b, batch))) return CUBLAS_STATUS_INVALID_VALUE;
  if (!on_device(p.d, batch)) return CUBLAS_STATUS_INVALID_VALUE;
  return enqueue_problem(handle->stream, p);
}

// ---- cuBLASLt descriptors ----------------------------------------------------------------------
//
// Each descriptor's state lives inside NVIDIA's semi-opaque storage (so the *Init functions work on
// caller-provided storage too), copied in and out with memcpy and marked with a magic number.

template <class State, class Opaque>
bool load_state(const Opaque* o, std::uint64_t magic, State& s) {
  static_assert(sizeof(State) <= sizeof(Opaque) && std::is_trivially_copyable_v<State>);
  if (o == nullptr) return false;
  std::memcpy(&s, o, sizeof s);
  return s.magic == magic;
}

template <class State, class Opaque>
void save_state(Opaque* o, const State& s) {
  std::memcpy(static_cast<void*>(o), &s, sizeof s);
}

// An attribute: where its value lives in a state struct and its size in bytes (what the header says
// the attribute's type is).
struct Slot {
  int attr;
  std::size_t offset;
  std::size_t size;
};

template <class State, std::size_t N>
cublasStatus_t set_slot(State& s, const Slot (&slots)[N], int attr, const void* buf, std::size_t size) {
  for (const Slot& slot : slots) {
    if (slot.attr != attr) continue;
    if (buf == nullptr || size != slot.size) return CUBLAS_STATUS_INVALID_VALUE;
    std::memcpy(reinterpret_cast<unsigned char*>(&s) + slot.offset, buf, size);
    return CUBLAS_STATUS_SUCCESS;
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

template <class State, std::size_t N>
cublasStatus_t get_slot(const State& s, const Slot (&slots)[N], int attr, void* buf, std::size_t size,
                        std::size_t* written) {
  for (const Slot& slot : slots) {
    if (slot.attr != attr) continue;
    if (size == 0) {  // a query of the size
      if (written == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
      *written = slot.size;
      return CUBLAS_STATUS_SUCCESS;
    }
    if (buf == nullptr || size != slot.size) return CUBLAS_STATUS_INVALID_VALUE;
    std::memcpy(buf, reinterpret_cast<const unsigned char*>(&s) + slot.offset, size);
    if (written != nullptr) *written = slot.size;
    return CUBLAS_STATUS_SUCCESS;
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

#define ZINF_SLOT(attr, State, field) Slot{attr, offsetof(State, field), sizeof(State::field)}

struct LayoutState {
  std::uint64_t magic;
  std::uint32_t type;
  std::int32_t order;
  std::uint64_t rows, cols;
  std::int64_t ld;
  std::int32_t batch_count;
  std::uint32_t batch_mode;
  std::int64_t batch_stride;
  std::int64_t plane_offset;
};

constexpr Slot kLayoutSlots[] = {
    ZINF_SLOT(CUBLASLT_MATRIX_LAYOUT_TYPE, LayoutState, type),
    ZINF_SLOT(CUBLASLT_MATRIX_LAYOUT_ORDER, LayoutState, order),
    ZINF_SLOT(CUBLASLT_MATRIX_LAYOUT_ROWS, LayoutState, rows),
    ZINF_SLOT(CUBLASLT_MATRIX_LAYOUT_COLS, LayoutState, cols),
    ZINF_SLOT(CUBLASLT_MATRIX_LAYOUT_LD, LayoutState, ld),
    ZINF_SLOT(CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, LayoutState, batch_count),
    ZINF_SLOT(CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, LayoutState, batch_stride),
    ZINF_SLOT(CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET, LayoutState, plane_offset),
    ZINF_SLOT(CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, LayoutState, batch_mode),
};

LayoutState new_layout(cudaDataType type, std::uint64_t rows, std::uint64_t cols, std::int64_t ld) {
  LayoutState s{};
  s.magic = kLayoutMagic;
  s.type = static_cast<std::uint32_t>(type);
  s.order = CUBLASLT_ORDER_COL;
  s.rows = rows, s.cols = cols, s.ld = ld;
  s.batch_count = 1;
  s.batch_mode = CUBLASLT_BATCH_MODE_STRIDED;
  return s;
}

struct DescState {
  std::uint64_t magic;
  std::int32_t compute_type, scale_type, pointer_mode;
  std::int32_t transa, transb, transc, fill_mode;
  std::uint32_t epilogue;
  void* bias_pointer;
  std::int64_t bias_batch_stride;
  void* aux_pointer;
  std::int64_t aux_ld, aux_batch_stride, alpha_vector_batch_stride;
  std::int32_t sm_count_target;
  std::int32_t aux_data_type, bias_data_type;
  std::int32_t a_scale_mode, b_scale_mode, c_scale_mode, d_scale_mode, aux_scale_mode, d_out_scale_mode;
  void* a_scale_pointer;
  void* b_scale_pointer;
  void* c_scale_pointer;
  void* d_scale_pointer;
  void* amax_d_pointer;
  void* aux_scale_pointer;
  void* aux_amax_pointer;
  void* d_out_scale_pointer;
  cublasLtEmulationDesc_t emulation;
  std::int8_t fast_accum;
};

constexpr Slot kDescSlots[] = {
    ZINF_SLOT(CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, DescState, compute_type),
    ZINF_SLOT(CUBLASLT_MATMUL_DESC_SCALE_TYPE, DescState, scale_type),
    ZINF_SLOT(CUBLASLT_MATMUL_DESC_POINTER_MODE, DescState, pointer_mode),
    ZINF_SLOT(CUBLASLT_MATMUL_DESC_TRANSA, DescState, transa),
    ZINF_SLOT(CUBLASLT_MATMUL_DESC_TRANSB, DescState, transb),
    ZINF_SLOT(CUBLASLT_MATMUL_DESC_TRANSC, DescState, transc),
    ZINF_SLOT(CUBLASLT_MATMUL_DESC_FILL_MODE, DescState, fill_mode),
    ZINF_SLOT(CUBLASLT_MATMUL_DESC_EPILOGUE, DescState, epilogue),
    ZINF_SLOT(CUBLASLT_MATMUL_DESC_BIAS_POINTER, DescState, bias_pointer),
    ZINF_SLOT(CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, DescState, bias_batch_stride),
    ZINF_SLOT(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, DescState, aux_pointer),
    ZINF_SLOT(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, DescState, aux_ld),
    ZINF_SLOT(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, DescState, aux_batch_stride),
    ZINF_SLOT(CUBLASLT_MATMUL_DESC_ALPHA_VECTOR_BATCH_STRIDE, DescState, alpha_vector_batch_stride),
    ZINF_SLOT(CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, DescState, sm_count_target),
    ZINF_SLOT(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, DescState, a_scale_pointer),
    ZINF_SLOT(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, DescState, b_scale_pointer),
    ZINF_SLOT(CUBLASLT_MATMUL_DESC_C_SCALE_POINTER, DescState, c_scale_pointer),
    ZINF_SLOT(CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, DescState, d_scale_pointer),
    ZINF_SLOT(CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, DescState, amax_d_pointer),
    ZINF_SLOT(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, DescState, aux_data_type),
    ZINF_SLOT(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_POINTER, DescState, aux_scale_pointer),
    ZINF_SLOT(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_AMAX_POINTER, DescState, aux_amax_pointer),
    ZINF_SLOT(CUBLASLT_MATMUL_DESC_FAST_ACCUM, DescState, fast_accum),
    ZINF_SLOT(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, DescState, bias_data_type),
    ZINF_SLOT(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, DescState, a_scale_mode),
    ZINF_SLOT(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, DescState, b_scale_mode),
    ZINF_SLOT(CUBLASLT_MATMUL_DESC_C_SCALE_MODE, DescState, c_scale_mode),
    ZINF_SLOT(CUBLASLT_MATMUL_DESC_D_SCALE_MODE, DescState, d_scale_mode),
    ZINF_SLOT(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_MODE, DescState, aux_scale_mode),
    ZINF_SLOT(CUBLASLT_MATMUL_DESC_D_OUT_SCALE_POINTER, DescState, d_out_scale_pointer),
    ZINF_SLOT(CUBLASLT_MATMUL_DESC_D_OUT_SCALE_MODE, DescState, d_out_scale_mode),
    ZINF_SLOT(CUBLASLT_MATMUL_DESC_EMULATION_DESCRIPTOR, DescState, emulation),
};

DescState new_desc(cublasComputeType_t compute, cudaDataType_t scale) {
  DescState s{};
  s.magic = kDescMagic;
  s.compute_type = static_cast<std::int32_t>(compute);
  s.scale_type = static_cast<std::int32_t>(scale);
  s.pointer_mode = CUBLASLT_POINTER_MODE_HOST;
  s.transa = s.transb = s.transc = CUBLAS_OP_N;
  s.fill_mode = CUBLAS_FILL_MODE_FULL;
  s.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  s.aux_data_type = s.bias_data_type = -1;  // -1: D's type
  return s;
}

struct PreferenceState {
  std::uint64_t magic;
  std::uint32_t search_mode;
  std::uint32_t reduction_scheme_mask;
  std::uint64_t max_workspace_bytes;
  std::uint32_t min_alignment_a, min_alignment_b, min_alignment_c, min_alignment_d;
  float max_waves_count;
  std::uint64_t impl_mask;
};

constexpr Slot kPreferenceSlots[] = {
    ZINF_SLOT(CUBLASLT_MATMUL_PREF_SEARCH_MODE, PreferenceState, search_mode),
    ZINF_SLOT(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, PreferenceState, max_workspace_bytes),
    ZINF_SLOT(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, PreferenceState, reduction_scheme_mask),
    ZINF_SLOT(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, PreferenceState, min_alignment_a),
    ZINF_SLOT(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, PreferenceState, min_alignment_b),
    ZINF_SLOT(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, PreferenceState, min_alignment_c),
    ZINF_SLOT(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, PreferenceState, min_alignment_d),
    ZINF_SLOT(CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT, PreferenceState, max_waves_count),
    ZINF_SLOT(CUBLASLT_MATMUL_PREF_IMPL_MASK, PreferenceState, impl_mask),
};

#undef ZINF_SLOT

PreferenceState new_preference() {
  PreferenceState s{};
  s.magic = kPreferenceMagic;
  s.search_mode = CUBLASLT_SEARCH_BEST_FIT;
  s.reduction_scheme_mask = CUBLASLT_REDUCTION_SCHEME_MASK;
  s.max_workspace_bytes = 0;
  s.min_alignment_a = s.min_alignment_b = s.min_alignment_c = s.min_alignment_d = 256;
  s.impl_mask = ~std::uint64_t{0};
  return s;
}

// The heuristic's one algorithm: the alignments it was chosen for and the workspace it needs (none).
struct AlgoState {
  std::uint64_t magic;
  std::uint32_t align_a, align_b, align_c, align_d, align_bias, align_aux;
  std::uint64_t workspace_bytes;
};

// ---- cuBLASLt problems -------------------------------------------------------------------------

cublasStatus_t check_layout(const LayoutState& l) {
  if (l.order != CUBLASLT_ORDER_COL || l.batch_mode != CUBLASLT_BATCH_MODE_STRIDED || l.plane_offset != 0)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (!is_storage_type(l.type)) return CUBLAS_STATUS_NOT_SUPPORTED;
  constexpr auto kMaxDim = static_cast<std::uint64_t>(std::numeric_limits<std::int32_t>::max());
  if (l.rows > kMaxDim || l.cols > kMaxDim) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (l.ld < 1 || l.ld < static_cast<std::int64_t>(l.rows)) return CUBLAS_STATUS_INVALID_VALUE;
  if (l.batch_count < 1) return CUBLAS_STATUS_INVALID_VALUE;
  return CUBLAS_STATUS_SUCCESS;
}

Matrix matrix_of(const LayoutState& l, const void* ptr) {
  return {ptr, static_cast<cudaDataType>(l.type), static_cast<std::int64_t>(l.rows), static_cast<std::int64_t>(l.cols),
          l.ld, l.batch_stride};
}

cublasStatus_t decode_epilogue(std::uint32_t e, Epilogue& out) {
  out = Epilogue{};
  switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT: return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_EPILOGUE_BIAS: out.add_bias = true; return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_EPILOGUE_GELU: out.gelu = true; return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_EPILOGUE_GELU_BIAS: out.gelu = out.add_bias = true; return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_EPILOGUE_GELU_AUX: out.gelu = out.write_aux = true; return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: out.gelu = out.write_aux = out.add_bias = true; return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_EPILOGUE_BGRADA: out.bias_grad_a = true; return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_EPILOGUE_BGRADB: out.bias_grad_b = true; return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_EPILOGUE_RELU:
    case CUBLASLT_EPILOGUE_RELU_AUX:
    case CUBLASLT_EPILOGUE_RELU_BIAS:
    case CUBLASLT_EPILOGUE_RELU_AUX_BIAS:
    case CUBLASLT_EPILOGUE_DRELU:
    case CUBLASLT_EPILOGUE_DRELU_BGRAD:
    case CUBLASLT_EPILOGUE_DGELU:
    case CUBLASLT_EPILOGUE_DGELU_BGRAD: return CUBLAS_STATUS_NOT_SUPPORTED;
    default: return CUBLAS_STATUS_INVALID_VALUE;
  }
}

bool uses_bias(const Epilogue& e) { return e.add_bias || e.bias_grad_a || e.bias_grad_b; }

// Everything cublasLtMatmul checks that does not depend on the pointers (the heuristic checks the
// same): fills p's shapes, types and epilogue.
cublasStatus_t build_lt_problem(const DescState& desc, const LayoutState& la, const LayoutState& lb,
                                const LayoutState& lc, const LayoutState& ld, Problem& p) {
  ComputeMode mode;
  if (const cublasStatus_t st = compute_mode(desc.compute_type, mode); st != CUBLAS_STATUS_SUCCESS) return st;
  if (desc.scale_type != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (!valid_op(desc.transa) || !valid_op(desc.transb) || !valid_op(desc.transc)) return CUBLAS_STATUS_INVALID_VALUE;
  if (desc.transc != CUBLAS_OP_N || desc.fill_mode != CUBLAS_FILL_MODE_FULL) return CUBLAS_STATUS_NOT_SUPPORTED;
  switch (desc.pointer_mode) {
    case CUBLASLT_POINTER_MODE_HOST:
    case CUBLASLT_POINTER_MODE_DEVICE: break;
    case CUBLASLT_POINTER_MODE_DEVICE_VECTOR:
    case CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_ZERO:
    case CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_HOST: return CUBLAS_STATUS_NOT_SUPPORTED;
    default: return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (desc.a_scale_pointer || desc.b_scale_pointer || desc.c_scale_pointer || desc.d_scale_pointer ||
      desc.amax_d_pointer || desc.aux_scale_pointer || desc.aux_amax_pointer || desc.d_out_scale_pointer ||
      desc.emulation || desc.a_scale_mode || desc.b_scale_mode || desc.c_scale_mode || desc.d_scale_mode ||
      desc.aux_scale_mode || desc.d_out_scale_mode)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  for (const LayoutState* l : {&la, &lb, &lc, &ld})
    if (const cublasStatus_t st = check_layout(*l); st != CUBLAS_STATUS_SUCCESS) return st;

  const bool ta = desc.transa != CUBLAS_OP_N, tb = desc.transb != CUBLAS_OP_N;
  const auto m = static_cast<std::int64_t>(ta ? la.cols : la.rows);
  const auto k = static_cast<std::int64_t>(ta ? la.rows : la.cols);
  const auto kb = static_cast<std::int64_t>(tb ? lb.cols : lb.rows);
  const auto n = static_cast<std::int64_t>(tb ? lb.rows : lb.cols);
  if (k != kb) return CUBLAS_STATUS_INVALID_VALUE;
  for (const LayoutState* l : {&lc, &ld})
    if (static_cast<std::int64_t>(l->rows) != m || static_cast<std::int64_t>(l->cols) != n)
      return CUBLAS_STATUS_INVALID_VALUE;
  const std::int32_t batch = ld.batch_count;
  if (la.batch_count != batch || lb.batch_count != batch || lc.batch_count != batch) return CUBLAS_STATUS_INVALID_VALUE;
  const auto d_type = static_cast<cudaDataType>(ld.type);
  if (la.type != lb.type || lc.type != ld.type || !supported_types(static_cast<cudaDataType>(la.type), d_type, mode))
    return CUBLAS_STATUS_NOT_SUPPORTED;

  p = Problem{};
  p.trans_a = ta, p.trans_b = tb;
  p.m = m, p.n = n, p.k = k, p.batch = batch;
  p.a = matrix_of(la, nullptr), p.b = matrix_of(lb, nullptr), p.c = matrix_of(lc, nullptr), p.d = matrix_of(ld, nullptr);
  p.mode = mode;
  if (const cublasStatus_t st = decode_epilogue(desc.epilogue, p.epi); st != CUBLAS_STATUS_SUCCESS) return st;
  if (uses_bias(p.epi)) {
    if (desc.bias_data_type != -1 && desc.bias_data_type != static_cast<std::int32_t>(d_type))
      return CUBLAS_STATUS_NOT_SUPPORTED;
    if ((p.epi.bias_grad_a || p.epi.bias_grad_b) && batch > 1) return CUBLAS_STATUS_NOT_SUPPORTED;
    const std::int64_t len = p.epi.bias_grad_b ? n : m;
    p.bias = {nullptr, d_type, len, 1, std::max<std::int64_t>(len, 1), desc.bias_batch_stride};
  }
  if (p.epi.write_aux) {
    if (desc.aux_data_type != -1 && desc.aux_data_type != static_cast<std::int32_t>(d_type))
      return CUBLAS_STATUS_INVALID_VALUE;
    if (desc.aux_ld < std::max<std::int64_t>(m, 1) || desc.aux_ld % 8 != 0) return CUBLAS_STATUS_INVALID_VALUE;
    if (batch > 1 && desc.aux_batch_stride % 8 != 0) return CUBLAS_STATUS_INVALID_VALUE;
    p.aux = {nullptr, d_type, m, n, desc.aux_ld, desc.aux_batch_stride};
  }
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t load_lt_states(cublasLtMatmulDesc_t computeDesc, cublasLtMatrixLayout_t Adesc,
                              cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                              DescState& desc, LayoutState& la, LayoutState& lb, LayoutState& lc, LayoutState& ld) {
  if (!load_state(computeDesc, kDescMagic, desc) || !load_state(Adesc, kLayoutMagic, la) ||
      !load_state(Bdesc, kLayoutMagic, lb) || !load_state(Cdesc, kLayoutMagic, lc) ||
      !load_state(Ddesc, kLayoutMagic, ld))
    return CUBLAS_STATUS_INVALID_VALUE;
  return CUBLAS_STATUS_SUCCESS;
}

bool valid_lt_handle(cublasLtHandle_t h) { return h != nullptr && h->magic == kLtHandleMagic; }

bool same_layout(const Matrix& x, const Matrix& y) {
  return x.type == y.type && x.rows == y.rows && x.cols == y.cols && x.ld == y.ld && x.stride == y.stride;
}

const char* status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

const char* status_string(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the handle was not created (or was destroyed)";
    case CUBLAS_STATUS_ALLOC_FAILED: return "a resource could not be allocated";
    case CUBLAS_STATUS_INVALID_VALUE: return "an unsupported value or parameter was passed to the function";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "the device lacks a feature the function needs";
    case CUBLAS_STATUS_MAPPING_ERROR: return "GPU memory could not be accessed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the work could not be run on the device";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the requested functionality is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "license error";
  }
  return "unknown cuBLAS status";
}

}  // namespace
}  // namespace zinf::cudax

// ---- the entry points, as the headers declare them ----------------------------------------------

namespace cx = zinf::cudax;

extern "C" {

cublasStatus_t CUBLASWINAPI cublasCreate_v2(cublasHandle_t* handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new cublasContext{cx::kHandleMagic, nullptr, CUBLAS_POINTER_MODE_HOST, CUBLAS_DEFAULT_MATH};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasDestroy_v2(cublasHandle_t handle) {
  if (!cx::valid_handle(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->magic = 0;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId) {
  if (!cx::valid_handle(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = streamId;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasGetStream_v2(cublasHandle_t handle, cudaStream_t* streamId) {
  if (!cx::valid_handle(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (streamId == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *streamId = handle->stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasGetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t* mode) {
  if (!cx::valid_handle(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *mode = handle->pointer_mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasSetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t mode) {
  if (!cx::valid_handle(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode != CUBLAS_POINTER_MODE_HOST && mode != CUBLAS_POINTER_MODE_DEVICE) return CUBLAS_STATUS_INVALID_VALUE;
  handle->pointer_mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasGetMathMode(cublasHandle_t handle, cublasMath_t* mode) {
  if (!cx::valid_handle(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *mode = handle->math_mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  if (!cx::valid_handle(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  const int base = static_cast<int>(mode) & ~static_cast<int>(CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
  switch (base) {
    case CUBLAS_DEFAULT_MATH:
    case CUBLAS_TENSOR_OP_MATH:
    case CUBLAS_PEDANTIC_MATH:
    case CUBLAS_TF32_TENSOR_OP_MATH:
    case CUBLAS_FP32_EMULATED_BF16X9_MATH:
    case CUBLAS_FP64_EMULATED_FIXEDPOINT_MATH: break;
    default: return CUBLAS_STATUS_INVALID_VALUE;
  }
  handle->math_mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}

const char* CUBLASWINAPI cublasGetStatusName(cublasStatus_t status) { return cx::status_name(status); }

const char* CUBLASWINAPI cublasGetStatusString(cublasStatus_t status) { return cx::status_string(status); }

cublasStatus_t CUBLASWINAPI cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                         int m, int n, int k, const void* alpha, const void* A, cudaDataType Atype,
                                         int lda, const void* B, cudaDataType Btype, int ldb, const void* beta,
                                         void* C, cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                                         cublasGemmAlgo_t algo) {
  return cx::gemm_ex(handle, transa, transb, m, n, k, alpha, A, Atype, lda, 0, B, Btype, ldb, 0, beta, C, Ctype, ldc,
                     0, 1, computeType, algo);
}

cublasStatus_t CUBLASWINAPI cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                                       cublasOperation_t transb, int m, int n, int k,
                                                       const void* alpha, const void* A, cudaDataType Atype, int lda,
                                                       long long int strideA, const void* B, cudaDataType Btype,
                                                       int ldb, long long int strideB, const void* beta, void* C,
                                                       cudaDataType Ctype, int ldc, long long int strideC,
                                                       int batchCount, cublasComputeType_t computeType,
                                                       cublasGemmAlgo_t algo) {
  return cx::gemm_ex(handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb, strideB, beta, C,
                     Ctype, ldc, strideC, batchCount, computeType, algo);
}

// ---- cuBLASLt ----

cublasStatus_t CUBLASWINAPI cublasLtCreate(cublasLtHandle_t* lightHandle) {
  if (lightHandle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *lightHandle = new cublasLtContext{cx::kLtHandleMagic};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtDestroy(cublasLtHandle_t lightHandle) {
  if (!cx::valid_lt_handle(lightHandle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  lightHandle->magic = 0;
  delete lightHandle;
  return CUBLAS_STATUS_SUCCESS;
}

const char* CUBLASWINAPI cublasLtGetStatusName(cublasStatus_t status) { return cx::status_name(status); }

const char* CUBLASWINAPI cublasLtGetStatusString(cublasStatus_t status) { return cx::status_string(status); }

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutInit_internal(cublasLtMatrixLayout_t matLayout, size_t size,
                                                              cudaDataType type, uint64_t rows, uint64_t cols,
                                                              int64_t ld) {
  if (matLayout == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (size < sizeof(cx::LayoutState)) return CUBLAS_STATUS_ALLOC_FAILED;
  cx::save_state(matLayout, cx::new_layout(type, rows, cols, ld));
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* matLayout, cudaDataType type,
                                                       uint64_t rows, uint64_t cols, int64_t ld) {
  if (matLayout == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *matLayout = new cublasLtMatrixLayoutOpaque_t{};
  cx::save_state(*matLayout, cx::new_layout(type, rows, cols, ld));
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
  delete matLayout;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout,
                                                             cublasLtMatrixLayoutAttribute_t attr, const void* buf,
                                                             size_t sizeInBytes) {
  cx::LayoutState s;
  if (!cx::load_state(matLayout, cx::kLayoutMagic, s)) return CUBLAS_STATUS_INVALID_VALUE;
  const cublasStatus_t st = cx::set_slot(s, cx::kLayoutSlots, attr, buf, sizeInBytes);
  if (st == CUBLAS_STATUS_SUCCESS) cx::save_state(matLayout, s);
  return st;
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t matLayout,
                                                             cublasLtMatrixLayoutAttribute_t attr, void* buf,
                                                             size_t sizeInBytes, size_t* sizeWritten) {
  cx::LayoutState s;
  if (!cx::load_state(matLayout, cx::kLayoutMagic, s)) return CUBLAS_STATUS_INVALID_VALUE;
  return cx::get_slot(s, cx::kLayoutSlots, attr, buf, sizeInBytes, sizeWritten);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescInit_internal(cublasLtMatmulDesc_t matmulDesc, size_t size,
                                                            cublasComputeType_t computeType, cudaDataType_t scaleType) {
  if (matmulDesc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (size < sizeof(cx::DescState)) return CUBLAS_STATUS_ALLOC_FAILED;
  cx::save_state(matmulDesc, cx::new_desc(computeType, scaleType));
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* matmulDesc, cublasComputeType_t computeType,
                                                     cudaDataType_t scaleType) {
  if (matmulDesc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *matmulDesc = new cublasLtMatmulDescOpaque_t{};
  cx::save_state(*matmulDesc, cx::new_desc(computeType, scaleType));
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
  delete matmulDesc;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                                           cublasLtMatmulDescAttributes_t attr, const void* buf,
                                                           size_t sizeInBytes) {
  cx::DescState s;
  if (!cx::load_state(matmulDesc, cx::kDescMagic, s)) return CUBLAS_STATUS_INVALID_VALUE;
  const cublasStatus_t st = cx::set_slot(s, cx::kDescSlots, attr, buf, sizeInBytes);
  if (st == CUBLAS_STATUS_SUCCESS) cx::save_state(matmulDesc, s);
  return st;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                                           cublasLtMatmulDescAttributes_t attr, void* buf,
                                                           size_t sizeInBytes, size_t* sizeWritten) {
  cx::DescState s;
  if (!cx::load_state(matmulDesc, cx::kDescMagic, s)) return CUBLAS_STATUS_INVALID_VALUE;
  return cx::get_slot(s, cx::kDescSlots, attr, buf, sizeInBytes, sizeWritten);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceInit_internal(cublasLtMatmulPreference_t pref, size_t size) {
  if (pref == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (size < sizeof(cx::PreferenceState)) return CUBLAS_STATUS_ALLOC_FAILED;
  cx::save_state(pref, cx::new_preference());
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  if (pref == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *pref = new cublasLtMatmulPreferenceOpaque_t{};
  cx::save_state(*pref, cx::new_preference());
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                                 cublasLtMatmulPreferenceAttributes_t attr,
                                                                 const void* buf, size_t sizeInBytes) {
  cx::PreferenceState s;
  if (!cx::load_state(pref, cx::kPreferenceMagic, s)) return CUBLAS_STATUS_INVALID_VALUE;
  const cublasStatus_t st = cx::set_slot(s, cx::kPreferenceSlots, attr, buf, sizeInBytes);
  if (st == CUBLAS_STATUS_SUCCESS) cx::save_state(pref, s);
  return st;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceGetAttribute(cublasLtMatmulPreference_t pref,
                                                                 cublasLtMatmulPreferenceAttributes_t attr, void* buf,
                                                                 size_t sizeInBytes, size_t* sizeWritten) {
  cx::PreferenceState s;
  if (!cx::load_state(pref, cx::kPreferenceMagic, s)) return CUBLAS_STATUS_INVALID_VALUE;
  return cx::get_slot(s, cx::kPreferenceSlots, attr, buf, sizeInBytes, sizeWritten);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle,
                                                           cublasLtMatmulDesc_t operationDesc,
                                                           cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                                           cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                                           cublasLtMatmulPreference_t preference,
                                                           int requestedAlgoCount,
                                                           cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                                           int* returnAlgoCount) {
  if (returnAlgoCount != nullptr) *returnAlgoCount = 0;
  if (!cx::valid_lt_handle(lightHandle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (requestedAlgoCount <= 0 || heuristicResultsArray == nullptr || returnAlgoCount == nullptr)
    return CUBLAS_STATUS_INVALID_VALUE;
  cx::DescState desc;
  cx::LayoutState la, lb, lc, ld;
  cx::PreferenceState pref;
  if (const cublasStatus_t st = cx::load_lt_states(operationDesc, Adesc, Bdesc, Cdesc, Ddesc, desc, la, lb, lc, ld);
      st != CUBLAS_STATUS_SUCCESS)
    return st;
  if (!cx::load_state(preference, cx::kPreferenceMagic, pref)) return CUBLAS_STATUS_INVALID_VALUE;
  cx::Problem p;
  if (const cublasStatus_t st = cx::build_lt_problem(desc, la, lb, lc, ld, p); st != CUBLAS_STATUS_SUCCESS) return st;

  // The pointers in the descriptor are not dereferenced here, only read for their alignment.
  cx::AlgoState algo{};
  algo.magic = cx::kAlgoMagic;
  algo.align_a = std::max(1u, pref.min_alignment_a);
  algo.align_b = std::max(1u, pref.min_alignment_b);
  algo.align_c = std::max(1u, pref.min_alignment_c);
  algo.align_d = std::max(1u, pref.min_alignment_d);
  // A null pointer promises nothing.
  const auto promised = [](const void* ptr) { return ptr == nullptr ? 1u : cx::alignment_of(ptr); };
  algo.align_bias = cx::uses_bias(p.epi) ? promised(desc.bias_pointer) : 1;
  algo.align_aux = p.epi.write_aux ? promised(desc.aux_pointer) : 1;
  algo.workspace_bytes = 0;
  cublasLtMatmulHeuristicResult_t& r = heuristicResultsArray[0];
  r = cublasLtMatmulHeuristicResult_t{};
  cx::save_state(&r.algo, algo);
  r.workspaceSize = 0;
  r.state = CUBLAS_STATUS_SUCCESS;
  r.wavesCount = 1.0f;
  *returnAlgoCount = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
                                           const void* alpha, const void* A, cublasLtMatrixLayout_t Adesc,
                                           const void* B, cublasLtMatrixLayout_t Bdesc, const void* beta,
                                           const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                                           cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo,
                                           void* workspace, size_t workspaceSizeInBytes, cudaStream_t stream) {
  if (!cx::valid_lt_handle(lightHandle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  cx::DescState desc;
  cx::LayoutState la, lb, lc, ld;
  if (const cublasStatus_t st = cx::load_lt_states(computeDesc, Adesc, Bdesc, Cdesc, Ddesc, desc, la, lb, lc, ld);
      st != CUBLAS_STATUS_SUCCESS)
    return st;
  cx::Problem p;
  if (const cublasStatus_t st = cx::build_lt_problem(desc, la, lb, lc, ld, p); st != CUBLAS_STATUS_SUCCESS) return st;
  if (alpha == nullptr || beta == nullptr) return CUBLAS_STATUS_INVALID_VALUE;

  p.a.ptr = A, p.b.ptr = B, p.c.ptr = C, p.d.ptr = D;
  if (desc.pointer_mode == CUBLASLT_POINTER_MODE_DEVICE) {
    p.device_scalars = true;
    p.alpha_ptr = static_cast<const float*>(alpha), p.beta_ptr = static_cast<const float*>(beta);
    if (!cx::is_device_range(alpha, sizeof(float)) || !cx::is_device_range(beta, sizeof(float)))
      return CUBLAS_STATUS_INVALID_VALUE;
    p.reads_c = true;
  } else {
    std::memcpy(&p.alpha, alpha, sizeof(float));
    std::memcpy(&p.beta, beta, sizeof(float));
    p.reads_c = p.beta != 0.0f;
  }
  cx::AlgoState chosen{};
  if (algo != nullptr) {
    if (!cx::load_state(algo, cx::kAlgoMagic, chosen)) return CUBLAS_STATUS_INVALID_VALUE;
    if (chosen.workspace_bytes > workspaceSizeInBytes) return CUBLAS_STATUS_INVALID_VALUE;
  } else {
    chosen.align_a = chosen.align_b = chosen.align_c = chosen.align_d = chosen.align_bias = chosen.align_aux = 1;
  }
  if (workspaceSizeInBytes > 0 && !cx::is_device_range(workspace, workspaceSizeInBytes))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (p.epi.add_bias || p.epi.bias_grad_a || p.epi.bias_grad_b) {
    if (desc.bias_pointer == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    p.bias.ptr = desc.bias_pointer;
  }
  if (p.epi.write_aux) {
    if (desc.aux_pointer == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    p.aux.ptr = desc.aux_pointer;
  }
  if (p.m == 0 || p.n == 0) return CUBLAS_STATUS_SUCCESS;  // nothing to compute or write

  if (p.k > 0 && (!cx::on_device(p.a, p.batch) || !cx::on_device(p.b, p.batch))) return CUBLAS_STATUS_INVALID_VALUE;
  if (!cx::on_device(p.d, p.batch)) return CUBLAS_STATUS_INVALID_VALUE;
  if (p.reads_c && !cx::on_device(p.c, p.batch)) return CUBLAS_STATUS_INVALID_VALUE;
  if (p.c.ptr != nullptr && p.c.ptr == p.d.ptr && !cx::same_layout(p.c, p.d)) return CUBLAS_STATUS_INVALID_VALUE;
  if (cx::uses_bias(p.epi) && !cx::on_device(p.bias, p.batch)) return CUBLAS_STATUS_INVALID_VALUE;
  if (p.epi.write_aux && !cx::on_device(p.aux, p.batch)) return CUBLAS_STATUS_INVALID_VALUE;
  // The algorithm was chosen for the alignments it records; less aligned pointers are refused.
  const auto aligned = [](const void* ptr, std::uint32_t need) { return cx::alignment_of(ptr) >= std::min(need, 256u); };
  if ((p.k > 0 && (!aligned(A, chosen.align_a) || !aligned(B, chosen.align_b))) || !aligned(D, chosen.align_d) ||
      (p.reads_c && !aligned(C, chosen.align_c)) || (cx::uses_bias(p.epi) && !aligned(p.bias.ptr, chosen.align_bias)) ||
      (p.epi.write_aux && !aligned(p.aux.ptr, chosen.align_aux)))
    return CUBLAS_STATUS_INVALID_VALUE;
  return cx::enqueue_problem(stream, p);
}

}  // extern "C"
