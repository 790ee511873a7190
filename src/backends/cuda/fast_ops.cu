// fast_ops.cu — CudaFastOps (fast_ops.h): every op of model/op_list.h on storage of the run's dtype S,
// composed from the GEMM executor (gemm.h: cuBLASLt with fused epilogues), the flash attention
// (ops/flash_attention.cuh) and the row kernels (ops/rows.cuh). Each view's dtype is checked against
// the storage rule before anything is enqueued.
//
// Scratch (cuBLASLt's workspace, the two-pass column sums' partials, the token sort of the embedding
// gradients, the flash backward's blocks) is kept between calls and grown only after the stream has
// drained: queued kernels may still read the old block.
#include <cuda_runtime.h>

#include <cstddef>
#include <initializer_list>
#include <memory>
#include <string>

#include "cuda/cuda_check.cuh"
#if ZINF_HAVE_CUDNN
#include "cuda/cudnn_attention.h"
#endif
#include "cuda/fast_ops.h"
#include "cuda/gemm.h"
#include "cuda/gemm_plan.h"
#include "cuda/ops/flash_attention.cuh"
#include "cuda/ops/rows.cuh"
#include "cuda/scratch.h"
#include "zinf/device_memory.h"
#include "zinf/error.h"

namespace zinf::cuda {
namespace {

namespace fast = ::zinf::cuda::fast;

class CudaFastOps final : public OpsBackend {
 public:
  // cuBLASLt's workspace: Hopper's kernels ask for up to 32 MiB; taken once from the device budget.
  static constexpr std::size_t kWorkspaceBytes = kGemmWorkspaceBytesFast;

  CudaFastOps(Device& dev, Precision p, Attention attention)
      : dev_(dev),
        stream_(checked(static_cast<cudaStream_t>(dev.native_stream(StreamRole::compute)))),
        S_(dtype_of(p)),
        // 32F compute: 16-bit operands multiply exactly on the tensor cores, sums in fp32; fp32 runs
        // stay plain fp32 (no TF32).
        gemm_(dev, GemmMath::fp32, kWorkspaceBytes) {
    if (attention == Attention::reference || attention == Attention::automatic)
      throw ConfigError("device.attention " + std::string(to_string(attention)) +
                            ": the fast kernels' attention is cudnn or wmma",
                        "set device.attention to auto, cudnn or wmma, or device.kernels to reference");
#if ZINF_HAVE_CUDNN
    if (attention == Attention::cudnn) cudnn_ = std::make_unique<CudnnAttention>(dev, stream_);
#else
    if (attention == Attention::cudnn)
      throw ConfigError("device.attention cudnn: this zinf was built without cuDNN",
                        "install cuDNN 9 beside the CUDA toolkit and rebuild (ZINF_CUDNN=AUTO finds it), or set "
                        "device.attention to wmma");
#endif
  }
  // The caching allocator is not stream-ordered: queued kernels may still use the scratch blocks.
  ~CudaFastOps() override { cudaStreamSynchronize(stream_); }

  // The storage rule, for the model: S for weights, activations and their gradients.
  DType storage_dtype() const override { return S_; }
  // The attention state is the per-row log-sum-exp [B, H, T], not the probabilities.
  std::size_t attention_state_elems(int B, int H, int T) const override {
    return static_cast<std::size_t>(B) * static_cast<std::size_t>(H) * static_cast<std::size_t>(T);
  }
  // The logits rows padded to a multiple of 64 elements, 128-byte aligned in 16-bit storage, for the
  // LM head's GEMMs (model/backend.h).
  LogitsRows logits_rows() const override { return logits_rows_of(DeviceType::cuda, Kernels::fast); }

  // ---- GPT-2 ---------------------------------------------------------------------------------------
  void matmul_forward(TensorView out, ConstTensorView inp, ConstTensorView w, ConstTensorView bias, int R, int IC,
                      int OC) override {
    const char* op = "matmul_forward";
    void* o = act(op, "out", out);
    const void *i = act(op, "inp", inp), *wt = act(op, "w", w), *b = act_opt(op, "bias", bias);
    if (R <= 0) return;
    const GemmCall g = matmul_forward_gemm(o, i, wt, b, R, IC, OC, S_);
    if (gemm_.run(g)) return;
    unfused_bias_act(g, nullptr, o, b, R, OC, false);
  }
  void matmul_gelu_forward(TensorView pre, TensorView out, ConstTensorView inp, ConstTensorView w, ConstTensorView bias,
                           int R, int IC, int OC) override {
    const char* op = "matmul_gelu_forward";
    void *p = act(op, "pre", pre), *o = act(op, "out", out);
    const void *i = act(op, "inp", inp), *wt = act(op, "w", w), *b = act_opt(op, "bias", bias);
    if (R <= 0) return;
    const GemmCall g = matmul_gelu_forward_gemm(p, o, i, wt, b, R, IC, OC, S_);
    if (gemm_.run(g)) return;
    unfused_bias_act(g, p, o, b, R, OC, true);  // GELU_AUX wants OC a multiple of 8
  }
  void matmul_backward(TensorView dinp, TensorView dw, TensorView dbias, ConstTensorView dout, ConstTensorView inp,
                       ConstTensorView w, int R, int IC, int OC) override {
    const char* op = "matmul_backward";
    void* di = act_opt(op, "dinp", dinp);
    float* dwt = grad(op, "dw", dw);
    float* db = grad_opt(op, "dbias", dbias);
    const void *d = act(op, "dout", dout), *i = act(op, "inp", inp), *wt = act(op, "w", w);
    if (R <= 0) return;
    // The dW GEMM's bgrad epilogue writes Σ_r dout into a scratch vector; the op adds it to dbias.
    float* partial =
        db ? static_cast<float*>(bias_grad_.get(dev_, stream_, static_cast<std::size_t>(OC) * 4)) : nullptr;
    const MatmulBackwardGemms g = matmul_backward_gemms(di, dwt, partial, d, i, wt, R, IC, OC, S_);
    if (g.has_dinp) gemm_.run(g.dinp);
    const bool fused = gemm_.run(g.dw);
    if (!fused) gemm_.run(without_epilogue(g.dw));
    if (!db) return;
    if (fused && g.dbias_by_epilogue)
      fast::add_inplace(db, partial, static_cast<std::size_t>(OC), DType::fp32, stream_);
    else
      fast::column_sum(db, d, R, OC, S_, partials(R, OC), stream_);
  }
  void layernorm_forward(TensorView out, TensorView mean, TensorView rstd, ConstTensorView inp, ConstTensorView w,
                         ConstTensorView b, int R, int C) override {
    const char* op = "layernorm_forward";
    fast::layernorm_forward(act(op, "out", out), f32(op, "mean", mean), f32(op, "rstd", rstd), act(op, "inp", inp),
                            act(op, "w", w), act(op, "b", b), R, C, S_, stream_);
  }
  void layernorm_backward(TensorView dinp, TensorView dw, TensorView db, ConstTensorView dout, ConstTensorView inp,
                          ConstTensorView w, ConstTensorView mean, ConstTensorView rstd, int R, int C) override {
    const char* op = "layernorm_backward";
    fast::layernorm_backward(act(op, "dinp", dinp), grad(op, "dw", dw), grad(op, "db", db), act(op, "dout", dout),
                             act(op, "inp", inp), act(op, "w", w), f32(op, "mean", mean), f32(op, "rstd", rstd), R, C,
                             S_, partials(R, C), stream_);
  }
  void gelu_forward(TensorView out, ConstTensorView inp, std::size_t n) override {
    fast::gelu_forward(act("gelu_forward", "out", out), act("gelu_forward", "inp", inp), n, S_, stream_);
  }
  void gelu_backward(TensorView dinp, ConstTensorView inp, ConstTensorView dout, std::size_t n) override {
    const char* op = "gelu_backward";
    fast::gelu_backward(act(op, "dinp", dinp), act(op, "inp", inp), act(op, "dout", dout), n, S_, stream_);
  }
  void add_inplace(TensorView acc, ConstTensorView x, std::size_t n) override {
    fast::add_inplace(act("add_inplace", "acc", acc), act("add_inplace", "x", x), n, S_, stream_);
  }
  void attention_forward(TensorView out, TensorView att, ConstTensorView qkv, int B, int T, int C, int H) override {
    const char* op = "attention_forward";
    void* o = act(op, "out", out);
    float* lse = f32(op, "att", att);
    const void* x = act(op, "qkv", qkv);
    if (B <= 0 || T <= 0) return;
    attention_forward_of(o, lse, x, at(x, C), at(x, 2L * C), packed_shape(B, T, C, H));
  }
  void attention_backward(TensorView dqkv, ConstTensorView dout, ConstTensorView qkv, ConstTensorView att,
                          ConstTensorView out, int B, int T, int C, int H) override {
    const char* op = "attention_backward";
    void* dx = act(op, "dqkv", dqkv);
    const void *d = act(op, "dout", dout), *x = act(op, "qkv", qkv), *o = act(op, "out", out);
    const float* lse = f32(op, "att", att);
    if (B <= 0 || T <= 0) return;
    const fast::AttnShape a = packed_shape(B, T, C, H);
    attention_backward_of(dx, at(dx, C), at(dx, 2L * C), d, x, at(x, C), at(x, 2L * C), o, lse, a);
  }
  void encoder_forward(TensorView out, const int* tokens, ConstTensorView wte, ConstTensorView wpe, int B, int T,
                       int C) override {
    const char* op = "encoder_forward";
    fast::encoder_forward(act(op, "out", out), tokens, act(op, "wte", wte), act(op, "wpe", wpe), B, T, C, S_, stream_);
  }
  void encoder_backward(TensorView dwte, TensorView dwpe, ConstTensorView dout, const int* tokens, int B, int T,
                        int C) override {
    const char* op = "encoder_backward";
    fast::encoder_backward(grad(op, "dwte", dwte), grad(op, "dwpe", dwpe), act(op, "dout", dout), tokens, B, T, C, S_,
                           token_sort(B * T), stream_);
  }
  void lm_head_forward(TensorView probs, TensorView losses, ConstTensorView x, ConstTensorView wte, const int* targets,
                       int R, int C, int V) override {
    const char* op = "lm_head_forward";
    void* p = act(op, "probs", probs);
    float* l = f32(op, "losses", losses);
    const void *xi = act(op, "x", x), *e = act(op, "wte", wte);
    if (R <= 0) return;
    const int ld = logits_ld(op, V, R, {probs});
    gemm_.run(lm_head_forward_gemm(p, xi, e, R, C, V, ld, S_));  // the logits, in the probs buffer
    fast::softmax_crossentropy(p, l, targets, R, V, ld, S_, stream_);
  }
  void lm_head_backward(TensorView dx, TensorView dwte, TensorView dlogits, ConstTensorView probs, ConstTensorView x,
                        ConstTensorView wte, const int* targets, float dscale, int R, int C, int V) override {
    const char* op = "lm_head_backward";
    void *d = act(op, "dx", dx), *dl = act(op, "dlogits", dlogits);
    float* de = grad(op, "dwte", dwte);
    const void *p = act(op, "probs", probs), *xi = act(op, "x", x), *e = act(op, "wte", wte);
    if (R <= 0) return;
    const int ld = logits_ld(op, V, R, {dlogits, probs});
    fast::crossentropy_backward(dl, p, targets, dscale, R, V, ld, S_, stream_);
    const LmHeadBackwardGemms g = lm_head_backward_gemms(d, de, dl, xi, e, R, C, V, ld, S_);
    gemm_.run(g.dx);
    gemm_.run(g.dwte);
  }
  // Plain memory: any dtype, the same on both sides.
  void copy(TensorView dst, ConstTensorView src, std::size_t n) override {
    if (n == 0) return;
    if (dst.empty() || src.empty()) missing("copy", dst.empty() ? "dst" : "src");
    if (dst.dtype() != src.dtype())
      throw Error(std::string("CUDA fast op copy: argument 'src' is ") + std::string(to_string(src.dtype())) +
                  " but 'dst' is " + std::string(to_string(dst.dtype())) + "; copy does not convert");
    ZINF_CUDA(cudaMemcpyAsync(dst.data(), src.data(), n * dtype_bytes(dst.dtype()), cudaMemcpyDeviceToDevice, stream_));
  }
  void zero(TensorView p, std::size_t n) override {
    if (n == 0) return;
    if (p.empty()) missing("zero", "p");
    ZINF_CUDA(cudaMemsetAsync(p.data(), 0, n * dtype_bytes(p.dtype()), stream_));
  }

  // ---- Llama ---------------------------------------------------------------------------------------
  void rmsnorm_forward(TensorView out, TensorView rstd, ConstTensorView inp, ConstTensorView w, int R, int C,
                       float eps) override {
    const char* op = "rmsnorm_forward";
    fast::rmsnorm_forward(act(op, "out", out), f32(op, "rstd", rstd), act(op, "inp", inp), act(op, "w", w), R, C, eps,
                          S_, stream_);
  }
  void rmsnorm_backward(TensorView dinp, TensorView dw, ConstTensorView dout, ConstTensorView inp, ConstTensorView w,
                        ConstTensorView rstd, int R, int C) override {
    const char* op = "rmsnorm_backward";
    fast::rmsnorm_backward(act(op, "dinp", dinp), grad(op, "dw", dw), act(op, "dout", dout), act(op, "inp", inp),
                           act(op, "w", w), f32(op, "rstd", rstd), R, C, S_, partials(R, C), stream_);
  }
  void rope_apply(TensorView x, ConstTensorView cos_t, ConstTensorView sin_t, int R, int T, int heads, int D,
                  bool backward) override {
    const char* op = "rope_apply";
    fast::rope_apply(act(op, "x", x), f32(op, "cos_t", cos_t), f32(op, "sin_t", sin_t), R, T, heads, D, backward, S_,
                     stream_);
  }
  void swiglu_forward(TensorView out, ConstTensorView gate, ConstTensorView up, std::size_t n) override {
    const char* op = "swiglu_forward";
    fast::swiglu_forward(act(op, "out", out), act(op, "gate", gate), act(op, "up", up), n, S_, stream_);
  }
  void swiglu_backward(TensorView dgate, TensorView dup, ConstTensorView dout, ConstTensorView gate, ConstTensorView up,
                       std::size_t n) override {
    const char* op = "swiglu_backward";
    fast::swiglu_backward(act(op, "dgate", dgate), act(op, "dup", dup), act(op, "dout", dout), act(op, "gate", gate),
                          act(op, "up", up), n, S_, stream_);
  }
  void gqa_attention_forward(TensorView out, TensorView att, ConstTensorView q, ConstTensorView k, ConstTensorView v,
                             int B, int T, int H, int KV, int D, int W) override {
    const char* op = "gqa_attention_forward";
    void* o = act(op, "out", out);
    float* lse = f32(op, "att", att);
    const void *qp = act(op, "q", q), *kp = act(op, "k", k), *vp = act(op, "v", v);
    if (B <= 0 || T <= 0) return;
    attention_forward_of(o, lse, qp, kp, vp, gqa_shape(B, T, H, KV, D, W));
  }
  void gqa_attention_backward(TensorView dq, TensorView dk, TensorView dv, ConstTensorView dout, ConstTensorView q,
                              ConstTensorView k, ConstTensorView v, ConstTensorView att, ConstTensorView out, int B,
                              int T, int H, int KV, int D, int W) override {
    const char* op = "gqa_attention_backward";
    void *dqp = act(op, "dq", dq), *dkp = act(op, "dk", dk), *dvp = act(op, "dv", dv);
    const void *d = act(op, "dout", dout), *qp = act(op, "q", q), *kp = act(op, "k", k), *vp = act(op, "v", v);
    const void* o = act(op, "out", out);
    const float* lse = f32(op, "att", att);
    if (B <= 0 || T <= 0) return;
    attention_backward_of(dqp, dkp, dvp, d, qp, kp, vp, o, lse, gqa_shape(B, T, H, KV, D, W));
  }
  void embedding_forward(TensorView out, const int* tokens, ConstTensorView wte, int R, int C) override {
    fast::embedding_forward(act("embedding_forward", "out", out), tokens, act("embedding_forward", "wte", wte), R, C,
                            S_, stream_);
  }
  void embedding_backward(TensorView dwte, ConstTensorView dout, const int* tokens, int R, int C) override {
    const char* op = "embedding_backward";
    fast::embedding_backward(grad(op, "dwte", dwte), act(op, "dout", dout), tokens, R, C, S_, token_sort(R), stream_);
  }

  // ---- generation ----------------------------------------------------------------------------------
  // Generation (model/generate.h) runs on the reference kernels in fp32; the fast kernels have no
  // decode ops, and say so.
  void attention_decode(TensorView, ConstTensorView, ConstTensorView, ConstTensorView, int, int, int, int, int, int,
                        int) override {
    no_decode("attention_decode");
  }
  void lm_head_logits(TensorView, ConstTensorView, ConstTensorView, int, int, int) override {
    no_decode("lm_head_logits");
  }

 private:
  [[noreturn]] static void no_decode(const char* op) {
    throw Error(std::string("CUDA fast ops: ") + op + " is not implemented by the fast kernels",
                "generation runs on the reference kernels (device.kernels reference, fp32)");
  }
  static cudaStream_t checked(cudaStream_t s) {
    if (!s) throw Error("CUDA fast ops need the CUDA device (this device has no native stream)");
    return s;
  }

  // ---- the storage rule, checked per argument ------------------------------------------------------
  [[noreturn]] static void missing(const char* op, const char* name) {
    throw Error(std::string("CUDA fast op ") + op + ": argument '" + name + "' is missing (a null view)");
  }
  // v's data once its dtype is `want` (an empty view: unless required, its null data).
  template <class View>
  auto checked(const char* op, const char* name, const View& v, DType want, bool required) const {
    if (v.empty()) {
      if (required) missing(op, name);
      return v.data();
    }
    if (v.dtype() == want) return v.data();
    throw Error(std::string("CUDA fast op ") + op + ": argument '" + name + "' is " +
                    std::string(to_string(v.dtype())) + ", but the fast kernels of a " + std::string(to_string(S_)) +
                    " run take it in " + std::string(to_string(want)),
                "under device.kernels = \"fast\" weights, activations and their gradients are held in the run's "
                "precision; weight gradients, norm statistics, the attention state and row losses in fp32");
  }
  // Activations, weights and their gradients: S.
  void* act(const char* op, const char* name, const TensorView& v) const { return checked(op, name, v, S_, true); }
  const void* act(const char* op, const char* name, const ConstTensorView& v) const {
    return checked(op, name, v, S_, true);
  }
  void* act_opt(const char* op, const char* name, const TensorView& v) const { return checked(op, name, v, S_, false); }
  const void* act_opt(const char* op, const char* name, const ConstTensorView& v) const {
    return checked(op, name, v, S_, false);
  }
  // Weight gradients: fp32, accumulated.
  float* grad(const char* op, const char* name, const TensorView& v) const {
    return static_cast<float*>(checked(op, name, v, DType::fp32, true));
  }
  float* grad_opt(const char* op, const char* name, const TensorView& v) const {
    return static_cast<float*>(checked(op, name, v, DType::fp32, false));
  }
  // Statistics, the attention state, losses, RoPE tables: fp32.
  float* f32(const char* op, const char* name, const TensorView& v) const {
    return static_cast<float*>(checked(op, name, v, DType::fp32, true));
  }
  const float* f32(const char* op, const char* name, const ConstTensorView& v) const {
    return static_cast<const float*>(checked(op, name, v, DType::fp32, true));
  }

  // ---- helpers ---------------------------------------------------------------------------------------
  // The logits buffers' row stride, after checking that each view (sized by its caller) holds R rows
  // of it: a buffer sized for R·V elements would be overrun by rows ld apart.
  int logits_ld(const char* op, int V, int R, std::initializer_list<ConstTensorView> views) const {
    const int ld = logits_row_stride(V, logits_rows());
    const std::size_t need = static_cast<std::size_t>(R) * static_cast<std::size_t>(ld);
    for (const ConstTensorView& v : views)
      if (v.numel() != kUnsized && v.numel() < need)
        throw Error(std::string("CUDA fast op ") + op + ": a logits buffer of " + std::to_string(v.numel()) +
                        " elements holds fewer than R = " + std::to_string(R) + " rows of " + std::to_string(ld),
                    "the fast kernels pad each logits row to a multiple of 64 classes: size the buffers with "
                    "OpsBackend::logits_rows() and logits_row_stride()");
    return ld;
  }
  // p advanced by `elems` elements of S.
  const void* at(const void* p, long elems) const {
    return static_cast<const char*>(p) + elems * static_cast<long>(dtype_bytes(S_));
  }
  void* at(void* p, long elems) const { return static_cast<char*>(p) + elems * static_cast<long>(dtype_bytes(S_)); }

  // GPT's packed qkv [B, T, 3C]: q, k, v at offsets 0, C, 2C of each row; out [B, T, C].
  static fast::AttnShape packed_shape(int B, int T, int C, int H) {
    fast::AttnShape a{};
    a.B = B, a.T = T, a.H = H, a.KV = H, a.D = C / H;
    a.q_stride = a.k_stride = a.v_stride = 3L * C;
    a.o_stride = C;
    return a;
  }
  // Llama's q [R, H·D], k and v [R, KV·D], out [R, H·D].
  static fast::AttnShape gqa_shape(int B, int T, int H, int KV, int D, int W) {
    fast::AttnShape a{};
    a.B = B, a.T = T, a.H = H, a.KV = KV, a.D = D, a.W = W;
    a.q_stride = static_cast<long>(H) * D;
    a.k_stride = a.v_stride = static_cast<long>(KV) * D;
    a.o_stride = static_cast<long>(H) * D;
    return a;
  }

  // The attention: cuDNN's where it was chosen and accepts the shape (the plans are built on the
  // shape's first forward; a refused shape was said once and runs the wmma kernel both ways, one whose
  // backward alone was refused runs the wmma kernel's backward), else the wmma flash kernel.
  bool cudnn_runs(const fast::AttnShape& a, bool backward = false) {
#if ZINF_HAVE_CUDNN
    return cudnn_ && cudnn_->accepts(a, S_) && (!backward || cudnn_->accepts_backward(a, S_));
#else
    (void)a, (void)backward;
    return false;
#endif
  }
  void attention_forward_of(void* out, float* lse, const void* q, const void* k, const void* v,
                            const fast::AttnShape& a) {
#if ZINF_HAVE_CUDNN
    if (cudnn_runs(a)) return cudnn_->forward(out, lse, q, k, v, a, S_);
#endif
    fast::flash_attention_forward(out, lse, q, k, v, a, S_, stream_);
  }
  // The backward reads the forward's output `out` and the lse the forward kept.
  void attention_backward_of(void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k,
                             const void* v, const void* out, const float* lse, const fast::AttnShape& a) {
#if ZINF_HAVE_CUDNN
    if (cudnn_runs(a, true)) return cudnn_->backward(dq, dk, dv, dout, q, k, v, out, lse, a, S_);
#endif
    void* scratch = flash_.get(dev_, stream_, fast::flash_backward_scratch_bytes(a));
    fast::flash_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, a, S_, scratch, stream_);
  }
  // A GEMM cuBLASLt could not fuse with its epilogue: the GEMM into an fp32 block, then bias (and GELU)
  // from it with one rounding per output, as the fused epilogue rounds (rounding the GEMM's result to
  // S first would round twice). The block (R·OC floats) is outside the planned ops scratch: shapes
  // whose widths are multiples of 8, every model's, fuse.
  void unfused_bias_act(const GemmCall& g, void* pre, void* out, const void* bias, int R, int OC, bool gelu) {
    GemmCall plain = without_epilogue(g);
    plain.plan.c_type = DType::fp32;
    float* acc = static_cast<float*>(unfused_.get(dev_, stream_, static_cast<std::size_t>(R) * OC * sizeof(float)));
    plain.ops.c = acc;
    gemm_.run(plain);
    fast::bias_act_from_fp32(pre, out, acc, bias, R, OC, gelu, S_, stream_);
  }
  float* partials(int R, int C) {
    return static_cast<float*>(partials_.get(dev_, stream_, fast::column_partials_floats(R, C) * sizeof(float)));
  }
  int* token_sort(int R) {
    return static_cast<int*>(token_sort_.get(dev_, stream_, fast::token_sort_ints(R) * sizeof(int)));
  }

  Device& dev_;
  cudaStream_t stream_;
  DType S_;
  GemmExecutor gemm_;
  Scratch partials_{"fast ops: column-sum partials"};
  Scratch token_sort_{"fast ops: embedding-gradient token sort"};
  Scratch flash_{"fast ops: flash attention backward scratch"};
  Scratch bias_grad_{"fast ops: bias-gradient vector"};
  Scratch unfused_{"fast ops: unfused GEMM result"};
#if ZINF_HAVE_CUDNN
  std::unique_ptr<CudnnAttention> cudnn_;  // null: the wmma kernel
#endif
};

}  // namespace

std::unique_ptr<OpsBackend> make_cuda_fast_ops(Device& dev, Precision p, Attention attention) {
  return std::make_unique<CudaFastOps>(dev, p, attention);
}

}  // namespace zinf::cuda
