// llama.cpp — the Llama family's forward and backward over layer units (llama.h).
#include "model/llama.h"

#include <cmath>
#include <random>

#include "model/host_math.h"
#include "model/init.h"
#include "model/unit_walk.h"
#include "zinf/error.h"

namespace zinf {

namespace {

// The block's tensors in order, each from take(elements); the biases only with qkv_bias.
template <class V, class Take>
LlamaBlock<V> llama_block(const ModelShape& s, Take take) {
  const std::size_t C = static_cast<std::size_t>(s.d_model),
                    KVD = static_cast<std::size_t>(s.kv_heads()) * s.head_dim(), F = static_cast<std::size_t>(s.d_ff);
  LlamaBlock<V> v{};
  v.attn_norm = take(C);
  v.wq = take(C * C);
  if (s.qkv_bias) v.bq = take(C);
  v.wk = take(C * KVD);
  if (s.qkv_bias) v.bk = take(KVD);
  v.wv = take(C * KVD);
  if (s.qkv_bias) v.bv = take(KVD);
  v.wo = take(C * C);
  v.ffn_norm = take(C);
  v.w_gate = take(C * F);
  v.w_up = take(C * F);
  v.w_down = take(F * C);
  return v;
}

}  // namespace

LlamaBlockView llama_block_view(float* p, const ModelShape& s) { return llama_block<float*>(s, take_in_order(p)); }
LlamaBlock<ConstTensorView> llama_block_view(const ConstTensorView& base, const ModelShape& s) {
  return llama_block<ConstTensorView>(s, take_in_order(base));
}
LlamaBlock<TensorView> llama_block_view(const TensorView& base, const ModelShape& s) {
  return llama_block<TensorView>(s, take_in_order(base));
}

LlamaActs LlamaModel::carve(ViewCursor& c) const {
  const std::size_t R = static_cast<std::size_t>(R_), C = static_cast<std::size_t>(C_),
                    KVD = static_cast<std::size_t>(KV_) * D_, F = static_cast<std::size_t>(F_),
                    att = ops_.attention_state_elems(B_, H_, T_);
  LlamaActs a{};
  a.an = c.take(R * C);
  a.an_rstd = c.take_fp32(R);
  a.q = c.take(R * C);
  a.k = c.take(R * KVD);
  a.v = c.take(R * KVD);
  a.att = c.take_fp32(att);
  a.atty = c.take(R * C);
  a.res2 = c.take(R * C);
  a.fn = c.take(R * C);
  a.fn_rstd = c.take_fp32(R);
  a.gate = c.take(R * F);
  a.up = c.take(R * F);
  a.h = c.take(R * F);
  a.out = c.take(R * C);
  return a;
}

LlamaModel::LlamaModel(const ModelShape& s, int B, bool checkpointing, Device& dev, OpsBackend& ops,
                       bool offload_checkpoints, bool pin_checkpoints, int micro_batches)
    : FamilyModel(s, B, checkpointing, dev, ops, micro_batches),
      T_(s.seq_len),
      C_(s.d_model),
      H_(s.n_head),
      KV_(s.kv_heads()),
      D_(s.head_dim()),
      F_(s.d_ff) {
  ZINF_CHECK(s.family == ModelFamily::llama && H_ % KV_ == 0 && D_ % 2 == 0 && F_ > 0);
  allocate(offload_checkpoints, pin_checkpoints, false, "final norm and logits");
  // Rotary tables, computed once on the host and copied to the device.
  std::vector<float> co, si;
  llama_rope_tables(s, T_, co, si);
  rope_buf_ = DeviceBuffer(dev, 2 * co.size() * sizeof(float), "rotary tables");
  cos_ = TensorView(rope_buf_.as<float>(), co.size());
  sin_ = TensorView(rope_buf_.as<float>() + co.size(), si.size());
  dev.copy_to_device(cos_.data(), co.data(), co.size() * sizeof(float), StreamRole::h2d);
  dev.copy_to_device(sin_.data(), si.data(), si.size() * sizeof(float), StreamRole::h2d);
  dev.synchronize(StreamRole::h2d);
}

// The backward scratch of the Llama blocks (between FamilyModel's and d(logits)).
void LlamaModel::carve_scratch(ViewCursor& c) {
  const std::size_t R = static_cast<std::size_t>(R_), KVD = static_cast<std::size_t>(KV_) * D_,
                    F = static_cast<std::size_t>(F_);
  dq_ = c.take(R * static_cast<std::size_t>(C_));
  dk_ = c.take(R * KVD);
  dv_ = c.take(R * KVD);
  dh_ = c.take(R * F);
  dgate_ = c.take(R * F);
  dup_ = c.take(R * F);
}

void LlamaModel::block_forward(const Weights& w, ConstTensorView x, const LlamaActs& a, int layer) {
  const int W = shape_.layer_window(layer);
  const int R = R_, C = C_, KVD = KV_ * D_, F = F_;
  const std::size_t RC = static_cast<std::size_t>(R) * C;
  const float eps = static_cast<float>(shape_.norm_eps);
  ops_.rmsnorm_forward(a.an, a.an_rstd, x, w.attn_norm, R, C, eps);
  ops_.matmul_forward(a.q, a.an, w.wq, w.bq, R, C, C);
  ops_.matmul_forward(a.k, a.an, w.wk, w.bk, R, C, KVD);
  ops_.matmul_forward(a.v, a.an, w.wv, w.bv, R, C, KVD);
  ops_.rope_apply(a.q, cos_, sin_, R, T_, H_, D_, false);
  ops_.rope_apply(a.k, cos_, sin_, R, T_, KV_, D_, false);
  ops_.gqa_attention_forward(a.atty, a.att, a.q, a.k, a.v, B_, T_, H_, KV_, D_, W);
  ops_.matmul_forward(a.res2, a.atty, w.wo, nullptr, R, C, C);
  ops_.add_inplace(a.res2, x, RC);
  ops_.rmsnorm_forward(a.fn, a.fn_rstd, a.res2, w.ffn_norm, R, C, eps);
  ops_.matmul_forward(a.gate, a.fn, w.w_gate, nullptr, R, C, F);
  ops_.matmul_forward(a.up, a.fn, w.w_up, nullptr, R, C, F);
  ops_.swiglu_forward(a.h, a.gate, a.up, static_cast<std::size_t>(R) * F);
  ops_.matmul_forward(a.out, a.h, w.w_down, nullptr, R, F, C);
  ops_.add_inplace(a.out, a.res2, RC);
}

void LlamaModel::block_backward(const Weights& w, const Grads& g, ConstTensorView x, const LlamaActs& a,
                                ConstTensorView dout, TensorView dx, int layer) {
  const int W = shape_.layer_window(layer);
  const int R = R_, C = C_, KVD = KV_ * D_, F = F_;
  const std::size_t RC = static_cast<std::size_t>(R) * C;
  ops_.copy(dres2_, dout, RC);  // the residual path: d(res2) starts as d(out)
  ops_.zero(dh_, static_cast<std::size_t>(R) * F);
  ops_.matmul_backward(dh_, g.w_down, nullptr, dout, a.h, w.w_down, R, F, C);
  ops_.swiglu_backward(dgate_, dup_, dh_, a.gate, a.up, static_cast<std::size_t>(R) * F);
  ops_.zero(dnorm_, RC);
  ops_.matmul_backward(dnorm_, g.w_gate, nullptr, dgate_, a.fn, w.w_gate, R, C, F);
  ops_.matmul_backward(dnorm_, g.w_up, nullptr, dup_, a.fn, w.w_up, R, C, F);
  ops_.rmsnorm_backward(dres2_, g.ffn_norm, dnorm_, a.res2, w.ffn_norm, a.fn_rstd, R, C);
  ops_.zero(datty_, RC);
  ops_.matmul_backward(datty_, g.wo, nullptr, dres2_, a.atty, w.wo, R, C, C);
  ops_.gqa_attention_backward(dq_, dk_, dv_, datty_, a.q, a.k, a.v, a.att, a.atty, B_, T_, H_, KV_, D_, W);
  ops_.rope_apply(dq_, cos_, sin_, R, T_, H_, D_, true);  // the gradient before the rotation
  ops_.rope_apply(dk_, cos_, sin_, R, T_, KV_, D_, true);
  ops_.zero(dnorm_, RC);
  ops_.matmul_backward(dnorm_, g.wq, g.bq, dq_, a.an, w.wq, R, C, C);
  ops_.matmul_backward(dnorm_, g.wk, g.bk, dk_, a.an, w.wk, R, C, KVD);
  ops_.matmul_backward(dnorm_, g.wv, g.bv, dv_, a.an, w.wv, R, C, KVD);
  ops_.copy(dx, dres2_, RC);
  ops_.rmsnorm_backward(dx, g.attn_norm, dnorm_, x, w.attn_norm, a.an_rstd, R, C);
}

// The family's steps of the unit walk (unit_walk.h). Untied, the LM head is unit L+1's matrix after
// the norm's weight; tied, unit 0's embedding.
void LlamaModel::embed_forward(ConstTensorView emb, const int* tokens) {
  ops_.embedding_forward(acts_.x0, tokens, slice(emb, 0, static_cast<std::size_t>(shape_.vocab_size) * C_), R_, C_);
}

LlamaModel::Weights LlamaModel::block_weights(ConstTensorView unit) const { return llama_block_view(unit, shape_); }
LlamaModel::Grads LlamaModel::block_grads(float* unit) const { return llama_block_view(TensorView(unit), shape_); }

void LlamaModel::norm_forward(ConstTensorView fin, ConstTensorView x) {
  ops_.rmsnorm_forward(lnf_, lnf_rstd_, x, slice(fin, 0, C_), R_, C_, static_cast<float>(shape_.norm_eps));
}

void LlamaModel::head_forward(ConstTensorView unit, const int* targets) {
  const int V = shape_.vocab_size;
  const std::size_t off = shape_.tie_embeddings ? 0 : static_cast<std::size_t>(C_);
  ops_.lm_head_forward(probs_, losses_, lnf_, slice(unit, off, static_cast<std::size_t>(V) * C_), targets, R_, C_, V);
}

void LlamaModel::head_backward(ConstTensorView unit, float* dunit, const int* targets, float dscale) {
  const int V = shape_.vocab_size;
  const std::size_t VC = static_cast<std::size_t>(V) * C_;
  const std::size_t off = shape_.tie_embeddings ? 0 : static_cast<std::size_t>(C_);
  ops_.lm_head_backward(dnorm_, slice(TensorView(dunit, off + VC), off, VC), dlogits_, probs_, lnf_,
                        slice(unit, off, VC), targets, dscale, R_, C_, V);
}

void LlamaModel::norm_backward(ConstTensorView fin, float* dfin, ConstTensorView x) {
  ops_.rmsnorm_backward(dres_a_, slice(TensorView(dfin, static_cast<std::size_t>(C_)), 0, C_), dnorm_, x,
                        slice(fin, 0, C_), lnf_rstd_, R_, C_);
}

void LlamaModel::embed_backward(float* dwte, ConstTensorView dout, const int* tokens) {
  ops_.embedding_backward(TensorView(dwte, static_cast<std::size_t>(shape_.vocab_size) * C_), dout, tokens, R_, C_);
}

void llama_init_unit(float* p, std::size_t unit, const ModelShape& s, std::uint64_t seed) {
  std::mt19937_64 rng(seed * 1000003ull + unit * 7919ull + 29);
  auto normal = [&](float* dst, std::size_t n, double stdv) { normal_fill(rng, dst, n, stdv); };
  const std::size_t C = static_cast<std::size_t>(s.d_model), V = static_cast<std::size_t>(s.vocab_size),
                    L = static_cast<std::size_t>(s.n_layer),
                    KVD = static_cast<std::size_t>(s.kv_heads()) * s.head_dim(), F = static_cast<std::size_t>(s.d_ff);
  if (unit == 0) {
    normal(p, V * C, 0.02);
  } else if (unit == L + 1) {
    std::fill(p, p + C, 1.0f);
    if (!s.tie_embeddings) normal(p + C, V * C, 0.02);
  } else {
    const LlamaBlockView b = llama_block_view(p, s);
    const double proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(L));
    std::fill(b.attn_norm, b.attn_norm + C, 1.0f);
    std::fill(b.ffn_norm, b.ffn_norm + C, 1.0f);
    normal(b.wq, C * C, 0.02);
    normal(b.wk, C * KVD, 0.02);
    normal(b.wv, C * KVD, 0.02);
    if (s.qkv_bias) {
      std::fill(b.bq, b.bq + C, 0.0f);
      std::fill(b.bk, b.bk + KVD, 0.0f);
      std::fill(b.bv, b.bv + KVD, 0.0f);
    }
    normal(b.wo, C * C, proj_std);
    normal(b.w_gate, C * F, 0.02);
    normal(b.w_up, C * F, 0.02);
    normal(b.w_down, F * C, proj_std);
  }
}

void llama_rope_tables(const ModelShape& s, int T, std::vector<float>& cos_t, std::vector<float>& sin_t) {
  const ops::RopeScaling sc = llama_rope_scaling(s);
  ops::rope_tables(ops::rope_inv_freq(s.head_dim(), s.rope_theta, sc, T), T, cos_t, sin_t,
                   ops::rope_attention_factor(sc));
}

}  // namespace zinf
