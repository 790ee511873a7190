// gemm.cu — the cuBLASLt executor of gemm.h.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <unordered_map>

#include "cuda/gemm.h"
#include "zinf/error.h"

namespace zinf::cuda {
namespace {

void blas_check(cublasStatus_t st, const char* call) {
  if (st != CUBLAS_STATUS_SUCCESS)
    throw Error(std::string(call) + " failed (cuBLAS status " + std::to_string(static_cast<int>(st)) + ")");
}
#define ZINF_CUBLAS(x) blas_check((x), #x)

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::fp32: return CUDA_R_32F;
    case DType::fp16: return CUDA_R_16F;
    case DType::bf16: return CUDA_R_16BF;
  }
  return CUDA_R_32F;
}

cublasLtEpilogue_t lt_epilogue(const GemmKey& k) {
  switch (k.epilogue) {
    case Epilogue::none: return CUBLASLT_EPILOGUE_DEFAULT;
    case Epilogue::bias: return CUBLASLT_EPILOGUE_BIAS;
    case Epilogue::gelu_aux_bias: return k.has_bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    case Epilogue::bgrad: return CUBLASLT_EPILOGUE_BGRADA;  // Σ over k of op(A): one value per row of D
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

// One cached call shape: its descriptors and the algorithm the heuristic chose (or none: then a call
// without an epilogue goes to cublasGemmEx, one with an epilogue back to its caller).
struct LtPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool have_algo = false;
  LtPlan() = default;
  LtPlan(const LtPlan&) = delete;
  LtPlan& operator=(const LtPlan&) = delete;
  ~LtPlan() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

template <class T>
cublasStatus_t set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t what, const T& v) {
  return cublasLtMatmulDescSetAttribute(d, what, &v, sizeof(v));
}

}  // namespace

struct GemmExecutor::Impl {
  cudaStream_t stream;
  cublasComputeType_t compute, lt_compute;
  cublasLtHandle_t lt = nullptr;
  cublasHandle_t handle = nullptr;
  DeviceBuffer workspace;
  std::unordered_map<GemmKey, std::unique_ptr<LtPlan>, GemmKeyHash> plans;
  bool warned_fallback = false;

  Impl(Device& dev, cudaStream_t s, GemmMath math, std::size_t ws)
      : stream(s),
        // fp32 reference runs: plain fp32, as the CPU reference computes (cublasGemmEx's PEDANTIC;
        // cuBLASLt uses TF32 only when asked with FAST_TF32, so plain 32F there); the reference's
        // 16-bit runs: inputs rounded to fp16/bf16, fp32 accumulation; the fast path: 32F, whose
        // 16-bit operands are exact on the tensor cores.
        compute(math == GemmMath::fast_16bf  ? CUBLAS_COMPUTE_32F_FAST_16BF
                : math == GemmMath::fast_16f ? CUBLAS_COMPUTE_32F_FAST_16F
                : math == GemmMath::fp32     ? CUBLAS_COMPUTE_32F
                                             : CUBLAS_COMPUTE_32F_PEDANTIC),
        lt_compute(compute == CUBLAS_COMPUTE_32F_PEDANTIC ? CUBLAS_COMPUTE_32F : compute) {
    workspace = DeviceBuffer(dev, ws, "cuBLASLt workspace");  // first: nothing to undo if it fails
    ZINF_CUBLAS(cublasLtCreate(&lt));
    ZINF_CUBLAS(cublasCreate(&handle));
    ZINF_CUBLAS(cublasSetStream(handle, stream));
    ZINF_CUBLAS(
        cublasSetMathMode(handle, math == GemmMath::fp32_pedantic ? CUBLAS_PEDANTIC_MATH : CUBLAS_DEFAULT_MATH));
  }
  ~Impl() {
    cudaStreamSynchronize(stream);  // queued GEMMs may still use the workspace the allocator gets back
    plans.clear();
    cublasDestroy(handle);
    cublasLtDestroy(lt);
  }

  LtPlan& plan_for(const GemmKey& key) {
    auto it = plans.find(key);
    if (it != plans.end()) return *it->second;
    auto plan = std::make_unique<LtPlan>();
    const cublasOperation_t ta = key.ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = key.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    ZINF_CUBLAS(cublasLtMatmulDescCreate(&plan->op, lt_compute, CUDA_R_32F));
    ZINF_CUBLAS(set_desc(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, ta));
    ZINF_CUBLAS(set_desc(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, tb));
    const StoredMatrix sa = stored_matrix(key.ta, key.m, key.k, key.lda, "A");
    const StoredMatrix sb = stored_matrix(key.tb, key.k, key.n, key.ldb, "B");
    const StoredMatrix sc = stored_matrix(false, key.m, key.n, key.ldc, "C");
    ZINF_CUBLAS(cublasLtMatrixLayoutCreate(&plan->a, cuda_type(key.a_type), sa.rows, sa.cols, sa.ld));
    ZINF_CUBLAS(cublasLtMatrixLayoutCreate(&plan->b, cuda_type(key.b_type), sb.rows, sb.cols, sb.ld));
    ZINF_CUBLAS(cublasLtMatrixLayoutCreate(&plan->c, cuda_type(key.c_type), sc.rows, sc.cols, sc.ld));
    if (key.batch > 1) {
      const std::int32_t count = key.batch;
      const std::int64_t strides[3] = {key.stride_a, key.stride_b, key.stride_c};
      cublasLtMatrixLayout_t layouts[3] = {plan->a, plan->b, plan->c};
      for (int i = 0; i < 3; ++i) {
        ZINF_CUBLAS(
            cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
        ZINF_CUBLAS(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                     &strides[i], sizeof(strides[i])));
      }
    }
    // The epilogue: its kind and types here; its pointers are set per call (run()). The heuristic
    // looks at the pointers' alignment, so give it aligned stand-ins of the key's alignment.
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    if (key.epilogue != Epilogue::none) {
      const cublasLtEpilogue_t epi = lt_epilogue(key);
      st = set_desc(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE, epi);
      // Bias and aux types default to D's; set them only where they differ.
      if (st == CUBLAS_STATUS_SUCCESS && key.has_bias) {
        const DType bt = key.epilogue == Epilogue::bgrad ? DType::fp32 : key.bias_type;
        if (bt != key.c_type)
          st = set_desc(plan->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<std::int32_t>(cuda_type(bt)));
      }
      if (st == CUBLAS_STATUS_SUCCESS && key.epilogue == Epilogue::gelu_aux_bias) {
        st = set_desc(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, std::int64_t{key.aux_ld});
        if (st == CUBLAS_STATUS_SUCCESS && key.aux_type != key.c_type)
          st = set_desc(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE,
                        static_cast<std::int32_t>(cuda_type(key.aux_type)));
        if (st == CUBLAS_STATUS_SUCCESS && key.batch > 1)
          st = set_desc(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE,
                        std::int64_t{static_cast<std::int64_t>(key.aux_ld) * key.n});
      }
      const auto stand_in = [](std::uint32_t align) { return reinterpret_cast<void*>(std::uintptr_t{align}); };
      if (st == CUBLAS_STATUS_SUCCESS && key.has_bias)
        st = set_desc(plan->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, stand_in(key.align_bias));
      if (st == CUBLAS_STATUS_SUCCESS && key.epilogue == Epilogue::gelu_aux_bias)
        st = set_desc(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, stand_in(key.align_aux));
    }

    cublasLtMatmulPreference_t pref = nullptr;
    ZINF_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    const std::uint64_t ws = workspace.size();
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
    const std::uint32_t al[4] = {key.align_a, key.align_b, key.align_c, key.align_c};
    const cublasLtMatmulPreferenceAttributes_t which[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4 && st == CUBLAS_STATUS_SUCCESS; ++i)
      st = cublasLtMatmulPreferenceSetAttribute(pref, which[i], &al[i], sizeof(al[i]));
    // Split-K may add its parts in the output's type (INPLACE, OUTPUT_TYPE): for a 16-bit output that
    // rounds partial sums, and an output is to be rounded once. Allow only fp32 reductions there.
    const std::uint32_t schemes = key.c_type == DType::fp32
                                      ? CUBLASLT_REDUCTION_SCHEME_MASK
                                      : (CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE);
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes,
                                                sizeof(schemes));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulAlgoGetHeuristic(lt, plan->op, plan->a, plan->b, plan->c, plan->c, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
      plan->algo = result.algo;
      plan->have_algo = true;
    } else if (key.epilogue == Epilogue::none && !warned_fallback) {
      warned_fallback = true;
      std::fprintf(
          stderr,
          "zinf: cuBLASLt offers no algorithm for a %dx%dx%d GEMM (status %d); using cublasGemmEx for such shapes\n",
          key.m, key.n, key.k, static_cast<int>(st));
    }
    return *plans.emplace(key, std::move(plan)).first->second;
  }

  bool run(const GemmCall& call) {
    const GemmPlan& p = call.plan;
    const GemmOperands& o = call.ops;
    const GemmKey key = make_gemm_key(p, o);
    LtPlan& plan = plan_for(key);
    const float one = 1, beta = p.beta;
    if (plan.have_algo) {
      if (key.has_bias) {
        const void* bias = p.epilogue == Epilogue::bgrad ? o.bias_grad : o.bias;
        ZINF_CUBLAS(set_desc(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias));
      }
      if (p.epilogue == Epilogue::gelu_aux_bias)
        ZINF_CUBLAS(set_desc(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, o.aux));
      const cublasStatus_t st = cublasLtMatmul(lt, plan.op, &one, o.a, plan.a, o.b, plan.b, &beta, o.c, plan.c, o.c,
                                               plan.c, &plan.algo, workspace.as<void>(), workspace.size(), stream);
      // Some epilogue type combinations are refused only here, not by the heuristic: a refused call
      // enqueued nothing, so the caller's unfused path takes this shape from now on.
      if (p.epilogue != Epilogue::none && (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE)) {
        plan.have_algo = false;
        return false;
      }
      blas_check(st, "cublasLtMatmul");
      return true;
    }
    if (p.epilogue != Epilogue::none) return false;
    const cublasOperation_t ta = p.ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = p.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (p.batch > 1) {
      ZINF_CUBLAS(cublasGemmStridedBatchedEx(handle, ta, tb, p.m, p.n, p.k, &one, o.a, cuda_type(p.a_type), p.lda,
                                             p.stride_a, o.b, cuda_type(p.b_type), p.ldb, p.stride_b, &beta, o.c,
                                             cuda_type(p.c_type), p.ldc, p.stride_c, p.batch, compute,
                                             CUBLAS_GEMM_DEFAULT));
      return true;
    }
    ZINF_CUBLAS(cublasGemmEx(handle, ta, tb, p.m, p.n, p.k, &one, o.a, cuda_type(p.a_type), p.lda, o.b,
                             cuda_type(p.b_type), p.ldb, &beta, o.c, cuda_type(p.c_type), p.ldc, compute,
                             CUBLAS_GEMM_DEFAULT));
    return true;
  }
};

GemmExecutor::GemmExecutor(Device& dev, GemmMath math, std::size_t workspace_bytes) {
  const auto stream = static_cast<cudaStream_t>(dev.native_stream(StreamRole::compute));
  if (!stream) throw Error("the GEMM executor needs the CUDA device (this device has no native stream)");
  impl_ = std::make_unique<Impl>(dev, stream, math, workspace_bytes);
}
GemmExecutor::~GemmExecutor() = default;

bool GemmExecutor::run(const GemmCall& call) { return impl_->run(call); }

bool GemmExecutor::fuses(const GemmCall& call) { return impl_->plan_for(make_gemm_key(call.plan, call.ops)).have_algo; }

}  // namespace zinf::cuda
