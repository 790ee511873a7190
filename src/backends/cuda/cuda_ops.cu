// cuda_ops.cu — OpsBackend on the GPU (cuda_ops.h), the reference kernels: fp32 storage. GEMMs are the
// plans of gemm_plan.h (row-major ops handed to cuBLAS as their column-major transposes) without
// fused epilogues, run by the cuBLASLt executor of gemm.h.
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>

#include "cuda/cuda_check.cuh"
#include "cuda/cuda_ops.h"
#include "cuda/gemm.h"
#include "cuda/gemm_plan.h"
#include "cuda/ops/attention.cuh"
#include "cuda/ops/bias.cuh"
#include "cuda/ops/crossentropy.cuh"
#include "cuda/ops/encoder.cuh"
#include "cuda/ops/gelu.cuh"
#include "cuda/ops/layernorm.cuh"
#include "cuda/ops/llama.cuh"
#include "cuda/scratch.h"
#include "zinf/device_memory.h"
#include "zinf/error.h"

namespace zinf::cuda {
namespace {

class CudaOps final : public Fp32Ops<CudaOps> {
 public:
  static constexpr const char* kName = "CUDA";  // for the error a non-fp32 view raises
  // cuBLASLt's workspace (split-K and stream-K need one); taken from the device budget.
  static constexpr std::size_t kWorkspaceBytes = kGemmWorkspaceBytesReference;

  CudaOps(Device& dev, Precision p)
      : dev_(dev),
        stream_(checked(static_cast<cudaStream_t>(dev.native_stream(StreamRole::compute)))),
        // fp32 runs: plain fp32, as the CPU reference computes; 16-bit runs: tensor cores, inputs
        // rounded to fp16/bf16, fp32 accumulation.
        gemm_(dev,
              p == Precision::bf16   ? GemmMath::fast_16bf
              : p == Precision::fp16 ? GemmMath::fast_16f
                                     : GemmMath::fp32_pedantic,
              kWorkspaceBytes) {}

  static cudaStream_t checked(cudaStream_t s) {
    if (!s) throw Error("CUDA ops need the CUDA device (this device has no native stream)");
    return s;
  }

  // The ops of model/op_list.h on fp32 data: Fp32Ops checks the views and calls these.
  void fp32_matmul_forward(float* out, const float* inp, const float* w, const float* bias, int R, int IC, int OC) {
    gemm_.run(without_epilogue(matmul_forward_gemm(out, inp, w, bias, R, IC, OC, DType::fp32)));
    if (bias) ops::launch_add_bias(out, bias, R, OC, stream_);
  }
  void fp32_matmul_gelu_forward(float* pre, float* out, const float* inp, const float* w, const float* bias, int R,
                                int IC, int OC) {
    fp32_matmul_forward(pre, inp, w, bias, R, IC, OC);
    ops::launch_gelu_forward(out, pre, static_cast<std::size_t>(R) * OC, stream_);
  }
  void fp32_matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w,
                            int R, int IC, int OC) {
    const MatmulBackwardGemms g = matmul_backward_gemms(dinp, dw, nullptr, dout, inp, w, R, IC, OC, DType::fp32);
    if (g.has_dinp) gemm_.run(g.dinp);
    gemm_.run(g.dw);
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
  // `out` (the forward's output) is not read: these kernels keep the probabilities in att.
  void fp32_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, const float* /*out*/,
                               int B, int T, int C, int H) {
    const std::size_t need = static_cast<std::size_t>(B) * H * T * T * sizeof(float);
    ops::launch_attention_backward(dqkv, static_cast<float*>(scores_.get(dev_, stream_, need)), dout, qkv, att, B, T, C,
                                   H, stream_);
  }
  void fp32_encoder_forward(float* o, const int* t, const float* wte, const float* wpe, int B, int T, int C) {
    ops::launch_encoder_forward(o, t, wte, wpe, B, T, C, stream_);
  }
  void fp32_encoder_backward(float* dwte, float* dwpe, const float* dout, const int* t, int B, int T, int C) {
    ops::launch_encoder_backward(dwte, dwpe, dout, t, B, T, C, stream_);
  }
  void fp32_lm_head_forward(float* probs, float* losses, const float* x, const float* wte, const int* tg, int R, int C,
                            int V) {
    gemm_.run(lm_head_forward_gemm(probs, x, wte, R, C, V, V, DType::fp32));
    ops::launch_softmax_crossentropy(probs, losses, tg, R, V, stream_);  // the host reads the rows at the step's end
  }
  void fp32_lm_head_backward(float* dx, float* dwte, float* dl, const float* probs, const float* x, const float* wte,
                             const int* tg, float dscale, int R, int C, int V) {
    ops::launch_crossentropy_backward(dl, probs, tg, dscale, R, V, stream_);
    const LmHeadBackwardGemms g = lm_head_backward_gemms(dx, dwte, dl, x, wte, R, C, V, V, DType::fp32);
    gemm_.run(g.dx);
    gemm_.run(g.dwte);
  }
  void fp32_copy(float* dst, const float* src, std::size_t n) {
    ZINF_CUDA(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
  }
  void fp32_zero(float* p, std::size_t n) { ZINF_CUDA(cudaMemsetAsync(p, 0, n * sizeof(float), stream_)); }

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
                                  int H, int KV, int D, int W) {
    ops::launch_gqa_attention_forward(o, att, q, k, v, B, T, H, KV, D, W, stream_);
  }
  // `out` is not read, as in fp32_attention_backward.
  void fp32_gqa_attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                                   const float* v, const float* att, const float* /*out*/, int B, int T, int H, int KV,
                                   int D, int W) {
    const std::size_t need = static_cast<std::size_t>(B) * H * T * sizeof(float);
    ops::launch_gqa_attention_backward(dq, dk, dv, static_cast<float*>(weighted_.get(dev_, stream_, need)), dout, q, k,
                                       v, att, B, T, H, KV, D, W, stream_);
  }
  void fp32_embedding_forward(float* o, const int* t, const float* wte, int R, int C) {
    ops::launch_embedding_forward(o, t, wte, R, C, stream_);
  }
  void fp32_embedding_backward(float* dwte, const float* dout, const int* t, int R, int C) {
    ops::launch_embedding_backward(dwte, dout, t, R, C, stream_);
  }
  void fp32_attention_decode(float* o, const float* q, const float* k, const float* v, int Q, int pos, int H, int KV,
                             int D, int q_stride, int kv_stride) {
    if (Q <= 0) return;
    // Each query row keeps its own scores (up to pos + Q of them per head). A long prompt's prefill runs
    // in chunks of rows so the scratch stays under a cap (rows are independent: the same bits), and the
    // scratch grows in powers of two so decoding token by token does not reallocate at every step.
    constexpr std::size_t kScoresCap = std::size_t{256} << 20;
    const std::size_t row = static_cast<std::size_t>(H) * (static_cast<std::size_t>(pos) + Q) * sizeof(float);
    const int chunk = static_cast<int>(std::clamp<std::size_t>(kScoresCap / row, 1, static_cast<std::size_t>(Q)));
    std::size_t bytes = 1;  // a power of two at least chunk · row (the CUDA sources are C++17: no std::bit_ceil)
    while (bytes < chunk * row) bytes <<= 1;
    float* scores = static_cast<float*>(decode_scores_.get(dev_, stream_, bytes));
    for (int t0 = 0; t0 < Q; t0 += chunk) {  // in stream order on the compute stream: the scratch is reused safely
      const int n = std::min(chunk, Q - t0);
      ops::launch_attention_decode(o + static_cast<std::size_t>(t0) * H * D, scores,
                                   q + static_cast<std::size_t>(t0) * q_stride, k, v, n, pos + t0, H, KV, D, q_stride,
                                   kv_stride, stream_);
    }
  }
  void fp32_lm_head_logits(float* logits, const float* x, const float* wte, int R, int C, int V) {
    gemm_.run(lm_head_forward_gemm(logits, x, wte, R, C, V, V, DType::fp32));
  }

 private:
  Device& dev_;
  cudaStream_t stream_;
  GemmExecutor gemm_;
  Scratch weighted_{"attention backward scratch"};     // the GQA backward's per-row sums
  Scratch scores_{"attention backward scratch"};       // the attention backward's [B,H,T,T] gradient of the scores
  Scratch decode_scores_{"decode attention scratch"};  // attention_decode's scores, one row per (query, head)
};

}  // namespace

std::unique_ptr<OpsBackend> make_cuda_ops(Device& dev, Precision p) { return std::make_unique<CudaOps>(dev, p); }

}  // namespace zinf::cuda
