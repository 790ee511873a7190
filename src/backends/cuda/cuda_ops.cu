// cuda_ops.cu — OpsBackend on the GPU (cuda_ops.h). GEMMs go through cuBLASLt (gemm_plan.h maps and
// caches the call shapes). Row-major matrices are handed to it as their column-major transposes:
// out[R,OC] = inp[R,IC]·W[IC,OC] is outᵀ = Wᵀ·inpᵀ, and so on below.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "cuda/cuda_check.cuh"
#include "cuda/cuda_ops.h"
#include "cuda/gemm_plan.h"
#include "cuda/ops/attention.cuh"
#include "cuda/ops/bias.cuh"
#include "cuda/ops/crossentropy.cuh"
#include "cuda/ops/encoder.cuh"
#include "cuda/ops/gelu.cuh"
#include "cuda/ops/layernorm.cuh"
#include "cuda/ops/llama.cuh"
#include "zinf/error.h"

namespace zinf::cuda {
namespace {

void blas_check(cublasStatus_t st, const char* call) {
  if (st != CUBLAS_STATUS_SUCCESS)
    throw Error(std::string(call) + " failed (cuBLAS status " + std::to_string(static_cast<int>(st)) + ")");
}
#define ZINF_CUBLAS(x) blas_check((x), #x)

// One cached cuBLASLt call shape: its descriptors and the algorithm the heuristic chose (or none, and
// then the call goes to cublasGemmEx).
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

class CudaOps final : public Fp32Ops<CudaOps> {
 public:
  static constexpr const char* kName = "CUDA";  // for the error a non-fp32 view raises
  // cuBLASLt's workspace (split-K and stream-K need one); taken from the device budget.
  static constexpr std::size_t kWorkspaceBytes = 8u << 20;

  CudaOps(Device& dev, Precision p)
      : dev_(dev),
        stream_(static_cast<cudaStream_t>(dev.native_stream(StreamRole::compute))),
        // fp32 runs: plain fp32, as the CPU reference computes (cublasGemmEx's PEDANTIC; cuBLASLt
        // uses TF32 only when asked with FAST_TF32, so plain 32F there); 16-bit runs: tensor cores,
        // inputs rounded to fp16/bf16, fp32 accumulation.
        compute_(p == Precision::bf16   ? CUBLAS_COMPUTE_32F_FAST_16BF
                 : p == Precision::fp16 ? CUBLAS_COMPUTE_32F_FAST_16F
                                        : CUBLAS_COMPUTE_32F_PEDANTIC),
        lt_compute_(compute_ == CUBLAS_COMPUTE_32F_PEDANTIC ? CUBLAS_COMPUTE_32F : compute_) {
    if (!stream_) throw Error("CUDA ops need the CUDA device (this device has no native stream)");
    ZINF_CUBLAS(cublasLtCreate(&lt_));
    ZINF_CUBLAS(cublasCreate(&handle_));
    ZINF_CUBLAS(cublasSetStream(handle_, stream_));
    ZINF_CUBLAS(cublasSetMathMode(handle_, p == Precision::fp32 ? CUBLAS_PEDANTIC_MATH : CUBLAS_DEFAULT_MATH));
    workspace_ = DeviceBuffer(dev_, kWorkspaceBytes, "cuBLASLt workspace");
  }
  ~CudaOps() override {
    plans_.clear();
    cublasDestroy(handle_);
    cublasLtDestroy(lt_);
  }

  // Column-major C = op(A)·op(B) (+ beta·C), fp32 storage, the precision's compute type; through
  // cuBLASLt with the algorithm chosen once per call shape, cublasGemmEx where it offers none.
  void gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const float* a, int lda, const float* b,
            int ldb, float beta, float* c, int ldc) {
    const float one = 1;
    const GemmKey key = make_gemm_key(ta != CUBLAS_OP_N, tb != CUBLAS_OP_N, m, n, k, a, lda, b, ldb, beta, c, ldc);
    LtPlan& plan = plan_for(key, ta, tb);
    if (plan.have_algo) {
      ZINF_CUBLAS(cublasLtMatmul(lt_, plan.op, &one, a, plan.a, b, plan.b, &beta, c, plan.c, c, plan.c, &plan.algo,
                                 workspace_.as<void>(), workspace_.size(), stream_));
      return;
    }
    ZINF_CUBLAS(cublasGemmEx(handle_, ta, tb, m, n, k, &one, a, CUDA_R_32F, lda, b, CUDA_R_32F, ldb, &beta, c,
                             CUDA_R_32F, ldc, compute_, CUBLAS_GEMM_DEFAULT));
  }

  LtPlan& plan_for(const GemmKey& key, cublasOperation_t ta, cublasOperation_t tb) {
    auto it = plans_.find(key);
    if (it != plans_.end()) return *it->second;
    auto plan = std::make_unique<LtPlan>();
    ZINF_CUBLAS(cublasLtMatmulDescCreate(&plan->op, lt_compute_, CUDA_R_32F));
    ZINF_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    ZINF_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    const StoredMatrix sa = stored_matrix(key.ta, key.m, key.k, key.lda, "A");
    const StoredMatrix sb = stored_matrix(key.tb, key.k, key.n, key.ldb, "B");
    const StoredMatrix sc = stored_matrix(false, key.m, key.n, key.ldc, "C");
    ZINF_CUBLAS(cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_32F, sa.rows, sa.cols, sa.ld));
    ZINF_CUBLAS(cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_32F, sb.rows, sb.cols, sb.ld));
    ZINF_CUBLAS(cublasLtMatrixLayoutCreate(&plan->c, CUDA_R_32F, sc.rows, sc.cols, sc.ld));

    cublasLtMatmulPreference_t pref = nullptr;
    ZINF_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    const std::uint64_t ws = workspace_.size();
    cublasStatus_t st =
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
    const std::uint32_t al[4] = {key.align_a, key.align_b, key.align_c, key.align_c};
    const cublasLtMatmulPreferenceAttributes_t which[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4 && st == CUBLAS_STATUS_SUCCESS; ++i)
      st = cublasLtMatmulPreferenceSetAttribute(pref, which[i], &al[i], sizeof(al[i]));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulAlgoGetHeuristic(lt_, plan->op, plan->a, plan->b, plan->c, plan->c, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
      plan->algo = result.algo;
      plan->have_algo = true;
    } else if (!warned_fallback_) {
      warned_fallback_ = true;
      std::fprintf(
          stderr,
          "zinf: cuBLASLt offers no algorithm for a %dx%dx%d GEMM (status %d); using cublasGemmEx for such shapes\n",
          key.m, key.n, key.k, static_cast<int>(st));
    }
    return *plans_.emplace(key, std::move(plan)).first->second;
  }

  // The ops of model/op_list.h on fp32 data: Fp32Ops checks the views and calls these.
  void fp32_matmul_forward(float* out, const float* inp, const float* w, const float* bias, int R, int IC, int OC) {
    gemm(CUBLAS_OP_N, CUBLAS_OP_N, OC, R, IC, w, OC, inp, IC, 0.0f, out, OC);
    if (bias) ops::launch_add_bias(out, bias, R, OC, stream_);
  }
  void fp32_matmul_gelu_forward(float* pre, float* out, const float* inp, const float* w, const float* bias, int R,
                                int IC, int OC) {
    fp32_matmul_forward(pre, inp, w, bias, R, IC, OC);
    ops::launch_gelu_forward(out, pre, static_cast<std::size_t>(R) * OC, stream_);
  }
  void fp32_matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w,
                            int R, int IC, int OC) {
    if (dinp) gemm(CUBLAS_OP_T, CUBLAS_OP_N, IC, R, OC, w, OC, dout, OC, 1.0f, dinp, IC);
    gemm(CUBLAS_OP_N, CUBLAS_OP_T, OC, IC, R, dout, OC, inp, IC, 1.0f, dw, OC);
    if (dbias) ops::launch_column_sum(dbias, dout, R, OC, stream_);
  }
  void fp32_layernorm_forward(float* o, float* m, float* r, const float* i, const float* w, const float* b, int R,
                              int C) {
    ops::launch_layernorm_forward(o, m, r, i, w, b, R, C, stream_);
  }
  void fp32_layernorm_backward(float* di, float* dw, float* db, const float* dout, const float* i, const float* w,
                               const float* m, const float* r, int R, int C) {
    ops::launch_layernorm_backward(di, dw, db, dout, i, w, m, r, R, C, stream_);
  }
  void fp32_gelu_forward(float* o, const float* i, std::size_t n) { ops::launch_gelu_forward(o, i, n, stream_); }
  void fp32_gelu_backward(float* di, const float* i, const float* dout, std::size_t n) {
    ops::launch_gelu_backward(di, i, dout, n, stream_);
  }
  void fp32_add_inplace(float* acc, const float* x, std::size_t n) { ops::launch_add_inplace(acc, x, n, stream_); }
  void fp32_attention_forward(float* o, float* att, const float* qkv, int B, int T, int C, int H) {
    ops::launch_attention_forward(o, att, qkv, B, T, C, H, stream_);
  }
  void fp32_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C,
                               int H) {
    const std::size_t need = static_cast<std::size_t>(B) * H * T * T * sizeof(float);
    if (scratch_.size() < need) scratch_ = DeviceBuffer(dev_, need, "attention backward scratch");
    ops::launch_attention_backward(dqkv, scratch_.as<float>(), dout, qkv, att, B, T, C, H, stream_);
  }
  void fp32_encoder_forward(float* o, const int* t, const float* wte, const float* wpe, int B, int T, int C) {
    ops::launch_encoder_forward(o, t, wte, wpe, B, T, C, stream_);
  }
  void fp32_encoder_backward(float* dwte, float* dwpe, const float* dout, const int* t, int B, int T, int C) {
    ops::launch_encoder_backward(dwte, dwpe, dout, t, B, T, C, stream_);
  }
  void fp32_lm_head_forward(float* probs, float* losses, const float* x, const float* wte, const int* tg, int R, int C,
                            int V) {
    gemm(CUBLAS_OP_T, CUBLAS_OP_N, V, R, C, wte, C, x, C, 0.0f, probs, V);
    ops::launch_softmax_crossentropy(probs, losses, tg, R, V, stream_);  // the host reads the rows at the step's end
  }
  void fp32_lm_head_backward(float* dx, float* dwte, float* dl, const float* probs, const float* x, const float* wte,
                             const int* tg, float dscale, int R, int C, int V) {
    ops::launch_crossentropy_backward(dl, probs, tg, dscale, R, V, stream_);
    gemm(CUBLAS_OP_N, CUBLAS_OP_N, C, R, V, wte, C, dl, V, 0.0f, dx, C);
    gemm(CUBLAS_OP_N, CUBLAS_OP_T, C, V, R, x, C, dl, V, 1.0f, dwte, C);
  }
  void fp32_copy(float* dst, const float* src, std::size_t n) {
    ZINF_CUDA(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
  }
  void fp32_zero(float* p, std::size_t n) { ZINF_CUDA(cudaMemsetAsync(p, 0, n * sizeof(float), stream_)); }

  bool has_llama_ops() const override { return true; }
  void fp32_rmsnorm_forward(float* o, float* rstd, const float* i, const float* w, int R, int C, float eps) {
    ops::launch_rmsnorm_forward(o, rstd, i, w, R, C, eps, stream_);
  }
  void fp32_rmsnorm_backward(float* di, float* dw, const float* dout, const float* i, const float* w, const float* rstd,
                             int R, int C) {
    ops::launch_rmsnorm_backward(di, dw, dout, i, w, rstd, R, C, stream_);
  }
  void fp32_rope_apply(float* x, const float* co, const float* si, int R, int T, int heads, int D, bool backward) {
    ops::launch_rope_apply(x, co, si, R, T, heads, D, backward, stream_);
  }
  void fp32_swiglu_forward(float* o, const float* g, const float* u, std::size_t n) {
    ops::launch_swiglu_forward(o, g, u, n, stream_);
  }
  void fp32_swiglu_backward(float* dg, float* du, const float* dout, const float* g, const float* u, std::size_t n) {
    ops::launch_swiglu_backward(dg, du, dout, g, u, n, stream_);
  }
  void fp32_gqa_attention_forward(float* o, float* att, const float* q, const float* k, const float* v, int B, int T,
                                  int H, int KV, int D) {
    ops::launch_gqa_attention_forward(o, att, q, k, v, B, T, H, KV, D, stream_);
  }
  void fp32_gqa_attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                                   const float* v, const float* att, int B, int T, int H, int KV, int D) {
    const std::size_t need = static_cast<std::size_t>(B) * H * T * sizeof(float);
    if (weighted_.size() < need) {  // per-row scratch, kept for the next call (in stream order)
      ZINF_CUDA(cudaStreamSynchronize(stream_));
      weighted_ = DeviceBuffer(dev_, need, "attention backward scratch");
    }
    ops::launch_gqa_attention_backward(dq, dk, dv, weighted_.as<float>(), dout, q, k, v, att, B, T, H, KV, D, stream_);
  }
  void fp32_embedding_forward(float* o, const int* t, const float* wte, int R, int C) {
    ops::launch_embedding_forward(o, t, wte, R, C, stream_);
  }
  void fp32_embedding_backward(float* dwte, const float* dout, const int* t, int R, int C) {
    ops::launch_embedding_backward(dwte, dout, t, R, C, stream_);
  }

 private:
  Device& dev_;
  cudaStream_t stream_;
  cublasComputeType_t compute_, lt_compute_;
  cublasLtHandle_t lt_ = nullptr;
  cublasHandle_t handle_ = nullptr;
  DeviceBuffer workspace_;
  DeviceBuffer weighted_;  // the attention backward's per-row sums
  std::unordered_map<GemmKey, std::unique_ptr<LtPlan>, GemmKeyHash> plans_;
  bool warned_fallback_ = false;
  DeviceBuffer scratch_;
};

}  // namespace

std::unique_ptr<OpsBackend> make_cuda_ops(Device& dev, Precision p) { return std::make_unique<CudaOps>(dev, p); }

}  // namespace zinf::cuda
