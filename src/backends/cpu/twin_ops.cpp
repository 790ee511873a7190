// twin_ops.cpp — see twin_ops.h.
#include "cpu/twin_ops.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cpu/ops_attention_tiled.h"
#include "cpu/ops_llama.h"
#include "zinf/cpu_adam/spec.h"

namespace zinf::cpu {
namespace {

float widen_one(std::uint16_t h, DType t) {
  return t == DType::bf16 ? cpu_adam::spec::bf16_to_fp32(h) : cpu_adam::spec::fp16_to_fp32(h);
}
std::uint16_t narrow_one(float x, DType t) {
  return t == DType::bf16 ? cpu_adam::spec::fp32_to_bf16(x) : cpu_adam::spec::fp32_to_fp16(x);
}

[[noreturn]] void unsized(const OpArgSite& at, DType t) {
  throw Error(std::string("CPU twin op ") + at.op + ": argument '" + std::string(at.arg()) + "' is an unsized " +
                  std::string(to_string(t)) + " view, so it cannot be widened to fp32",
              "pass the view with its element count (TensorView(p, dtype, n))");
}

// One op's arguments as the fp32 reference takes them: 16-bit views widened into scratch, fp32
// views as they are; finish() rounds each written 16-bit view back, once.
class Staging {
 public:
  float* arg(const TensorView& v, const OpArgSite& at) {
    if (v.empty()) return nullptr;
    if (v.dtype() == DType::fp32) return static_cast<float*>(v.data());
    float* f = widen(v.data(), v.dtype(), v.numel(), at);
    written_.emplace_back(v, f);
    return f;
  }
  const float* arg(const ConstTensorView& v, const OpArgSite& at) {
    if (v.empty()) return nullptr;
    if (v.dtype() == DType::fp32) return static_cast<const float*>(v.data());
    return widen(v.data(), v.dtype(), v.numel(), at);
  }
  template <class T>
  T arg(T x, const OpArgSite&) {  // sizes, flags, scales, token ids
    return x;
  }
  void finish() {
    for (const auto& [v, f] : written_) {
      auto* h = static_cast<std::uint16_t*>(v.data());
      for (std::size_t i = 0; i < v.numel(); ++i) h[i] = narrow_one(f[i], v.dtype());
    }
  }

 private:
  float* widen(const void* data, DType t, std::size_t n, const OpArgSite& at) {
    if (n == kUnsized) unsized(at, t);
    scratch_.emplace_back(n);
    float* f = scratch_.back().data();
    const auto* h = static_cast<const std::uint16_t*>(data);
    for (std::size_t i = 0; i < n; ++i) f[i] = widen_one(h[i], t);
    return f;
  }
  std::vector<std::vector<float>> scratch_;
  std::vector<std::pair<TensorView, float*>> written_;
};

template <class F, class... A, std::size_t... I>
void staged_at(const char* op, const char* names, F&& f, std::index_sequence<I...>, const A&... a) {
  Staging st;
  f(st.arg(a, OpArgSite{"CPU twin", op, names, I})...);
  st.finish();
}
// Runs f (the fp32 reference) on op's arguments, staged as the twin stores them.
template <class F, class... A>
void staged(const char* op, const char* names, F&& f, const A&... a) {
  staged_at(op, names, std::forward<F>(f), std::index_sequence_for<A...>{}, a...);
}

// The attention the twin computes: the fast kernels keep each row's log-sum-exp [B,H,T] as the
// attention state, walk the keys in tiles with an online softmax and round the P and dS tiles to S
// before their products; cpu/ops_attention_tiled.h mirrors them, and the twin calls it with the
// CUDA kernels' tiling. Their backward reads the forward's output as the forward stored it (rounded
// to S) and the lse it kept; the staging hands both over widened, so the twin does the same.
void tiled_forward(ops::ChunkPool& p, float* out, float* lse, const float* q, const float* k, const float* v,
                   const ops::AttnShapeCpu& a, DType S) {
  ops::tiled_attention_forward(p, out, lse, q, k, v, a, ops::cuda_tiling(a.D, S));
}
void tiled_backward(ops::ChunkPool& p, float* dq, float* dk, float* dv, const float* dout, const float* q,
                    const float* k, const float* v, const float* out, const float* lse, const ops::AttnShapeCpu& a,
                    DType S) {
  ops::tiled_attention_backward(p, dq, dk, dv, dout, q, k, v, out, lse, a, ops::cuda_tiling(a.D, S));
}
ops::AttnShapeCpu packed_shape(int B, int T, int C, int H) {  // GPT's qkv [B,T,3C]
  const long c3 = 3L * C;
  return ops::AttnShapeCpu{B, T, H, H, C / H, c3, c3, c3, static_cast<long>(C)};
}
ops::AttnShapeCpu gqa_shape(int B, int T, int H, int KV, int D, int W) {  // Llama's q [R,H·D], k and v [R,KV·D]
  const long kvd = static_cast<long>(KV) * D;
  return ops::AttnShapeCpu{B, T, H, KV, D, static_cast<long>(H) * D, kvd, kvd, static_cast<long>(H) * D, W};
}

void twin_attention_forward(ops::ChunkPool& p, DType S, float* out, float* att, const float* qkv, int B, int T, int C,
                            int H) {
  tiled_forward(p, out, att, qkv, qkv + C, qkv + 2L * C, packed_shape(B, T, C, H), S);
}
void twin_attention_backward(ops::ChunkPool& p, DType S, float* dqkv, const float* dout, const float* qkv,
                             const float* att, const float* out, int B, int T, int C, int H) {
  tiled_backward(p, dqkv, dqkv + C, dqkv + 2L * C, dout, qkv, qkv + C, qkv + 2L * C, out, att, packed_shape(B, T, C, H),
                 S);
}
void twin_gqa_attention_forward(ops::ChunkPool& p, DType S, float* out, float* att, const float* q, const float* k,
                                const float* v, int B, int T, int H, int KV, int D, int W) {
  tiled_forward(p, out, att, q, k, v, gqa_shape(B, T, H, KV, D, W), S);
}
void twin_gqa_attention_backward(ops::ChunkPool& p, DType S, float* dq, float* dk, float* dv, const float* dout,
                                 const float* q, const float* k, const float* v, const float* att, const float* out,
                                 int B, int T, int H, int KV, int D, int W) {
  tiled_backward(p, dq, dk, dv, dout, q, k, v, out, att, gqa_shape(B, T, H, KV, D, W), S);
}

// The LM head as the fast kernels run it: the logits GEMM writes the S probs buffer and the softmax
// reads it back; the gradient of the logits lands in the S dlogits buffer before the two GEMMs read
// it. So the twin rounds there too — the two rounding points inside an op besides attention's.
void round_through(float* x, std::size_t n, DType S) {  // x as an S buffer holds it
  if (S == DType::fp32) return;
  for (std::size_t i = 0; i < n; ++i) x[i] = widen_one(narrow_one(x[i], S), S);
}
void twin_lm_head_forward(ops::ChunkPool& p, DType S, float* probs, float* losses, const float* x, const float* wte,
                          const int* targets, int R, int C, int V) {
  ops::lm_head_logits(p, probs, x, wte, R, C, V);
  round_through(probs, static_cast<std::size_t>(R) * static_cast<std::size_t>(V), S);
  ops::softmax_crossentropy(p, probs, losses, targets, R, V);
}
void twin_lm_head_backward(ops::ChunkPool& p, DType S, float* dx, float* dwte, float* dlogits, const float* probs,
                           const float* x, const float* wte, const int* targets, float dscale, int R, int C, int V) {
  ops::crossentropy_backward(p, dlogits, probs, targets, dscale, R, V);
  round_through(dlogits, static_cast<std::size_t>(R) * static_cast<std::size_t>(V), S);
  ops::lm_head_backward_gemms(p, dx, dwte, dlogits, x, wte, R, C, V);
}

// Every op of the list through the staging, on the fp32 reference.
class TwinOpsBase : public OpsBackend {
 public:
  TwinOpsBase(DType storage, int threads) : storage_(storage), pool_(threads) {}

#define ZINF_TWIN_OP(name, info, params, args)                                              \
  void name params override {                                                               \
    staged(                                                                                 \
        #name, #args, [this](auto... a) { ops::name(pool_, a...); }, ZINF_OP_UNPAREN args); \
  }
  ZINF_OPS(ZINF_TWIN_OP)
#undef ZINF_TWIN_OP
  DType storage_dtype() const override { return storage_; }

 protected:
  DType storage_;
  ops::ChunkPool pool_;
};

// The twin: the attention ops through the twin's attention above.
class TwinOps final : public TwinOpsBase {
 public:
  using TwinOpsBase::TwinOpsBase;

  void attention_forward(TensorView out, TensorView att, ConstTensorView qkv, int B, int T, int C, int H) override {
    staged(
        "attention_forward", "(out, att, qkv, B, T, C, H)",
        [this](auto... a) { twin_attention_forward(pool_, storage_, a...); }, out, att, qkv, B, T, C, H);
  }
  void attention_backward(TensorView dqkv, ConstTensorView dout, ConstTensorView qkv, ConstTensorView att,
                          ConstTensorView out, int B, int T, int C, int H) override {
    staged(
        "attention_backward", "(dqkv, dout, qkv, att, out, B, T, C, H)",
        [this](auto... a) { twin_attention_backward(pool_, storage_, a...); }, dqkv, dout, qkv, att, out, B, T, C, H);
  }
  void gqa_attention_forward(TensorView out, TensorView att, ConstTensorView q, ConstTensorView k, ConstTensorView v,
                             int B, int T, int H, int KV, int D, int W) override {
    staged(
        "gqa_attention_forward", "(out, att, q, k, v, B, T, H, KV, D, W)",
        [this](auto... a) { twin_gqa_attention_forward(pool_, storage_, a...); }, out, att, q, k, v, B, T, H, KV, D, W);
  }
  void gqa_attention_backward(TensorView dq, TensorView dk, TensorView dv, ConstTensorView dout, ConstTensorView q,
                              ConstTensorView k, ConstTensorView v, ConstTensorView att, ConstTensorView out, int B,
                              int T, int H, int KV, int D, int W) override {
    staged(
        "gqa_attention_backward", "(dq, dk, dv, dout, q, k, v, att, out, B, T, H, KV, D, W)",
        [this](auto... a) { twin_gqa_attention_backward(pool_, storage_, a...); }, dq, dk, dv, dout, q, k, v, att, out,
        B, T, H, KV, D, W);
  }
  void lm_head_forward(TensorView probs, TensorView losses, ConstTensorView x, ConstTensorView wte, const int* targets,
                       int R, int C, int V) override {
    staged(
        "lm_head_forward", "(probs, losses, x, wte, targets, R, C, V)",
        [this](auto... a) { twin_lm_head_forward(pool_, storage_, a...); }, probs, losses, x, wte, targets, R, C, V);
  }
  void lm_head_backward(TensorView dx, TensorView dwte, TensorView dlogits, ConstTensorView probs, ConstTensorView x,
                        ConstTensorView wte, const int* targets, float dscale, int R, int C, int V) override {
    staged(
        "lm_head_backward", "(dx, dwte, dlogits, probs, x, wte, targets, dscale, R, C, V)",
        [this](auto... a) { twin_lm_head_backward(pool_, storage_, a...); }, dx, dwte, dlogits, probs, x, wte, targets,
        dscale, R, C, V);
  }
  std::size_t attention_state_elems(int B, int H, int T) const override {
    const std::size_t rows = static_cast<std::size_t>(B) * static_cast<std::size_t>(H) * static_cast<std::size_t>(T);
    return rows;  // one log-sum-exp per row
  }
};

}  // namespace

std::unique_ptr<OpsBackend> make_twin_ops(Precision precision, int threads) {
  return std::make_unique<TwinOps>(dtype_of(precision), threads);
}

}  // namespace zinf::cpu
