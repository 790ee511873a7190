// gpt.cpp — GPT-2 forward/backward over layer units (gpt.h).
#include "model/gpt.h"

#include <cstring>

#include "model/unit_walk.h"

namespace zinf {

namespace {

// The block's tensors in order, each from take(elements).
template <class V, class Take>
GptBlock<V> gpt_block(int C, Take take) {
  const std::size_t c = static_cast<std::size_t>(C);
  GptBlock<V> v{};
  v.ln1w = take(c);
  v.ln1b = take(c);
  v.qkvw = take(c * 3 * c);
  v.qkvb = take(3 * c);
  v.projw = take(c * c);
  v.projb = take(c);
  v.ln2w = take(c);
  v.ln2b = take(c);
  v.fcw = take(c * 4 * c);
  v.fcb = take(4 * c);
  v.fcprojw = take(4 * c * c);
  v.fcprojb = take(c);
  return v;
}

}  // namespace

BlockView block_view(float* p, int C) { return gpt_block<float*>(C, take_in_order(p)); }
GptBlock<ConstTensorView> block_view(const ConstTensorView& base, int C) {
  return gpt_block<ConstTensorView>(C, take_in_order(base));
}
GptBlock<TensorView> block_view(const TensorView& base, int C) { return gpt_block<TensorView>(C, take_in_order(base)); }

GptActs GptModel::carve(ViewCursor& c) const {
  const std::size_t R = static_cast<std::size_t>(R_), C = static_cast<std::size_t>(shape_.d_model);
  const std::size_t att = ops_.attention_state_elems(B_, shape_.n_head, shape_.seq_len);
  GptActs a{};
  a.ln1 = c.take(R * C);
  a.ln1_mean = c.take_fp32(R);
  a.ln1_rstd = c.take_fp32(R);
  a.qkv = c.take(R * 3 * C);
  a.att = c.take_fp32(att);
  a.atty = c.take(R * C);
  a.res2 = c.take(R * C);
  a.ln2 = c.take(R * C);
  a.ln2_mean = c.take_fp32(R);
  a.ln2_rstd = c.take_fp32(R);
  a.fch = c.take(R * 4 * C);
  a.fchg = c.take(R * 4 * C);
  a.out = c.take(R * C);
  c.take(R * C);  // one spare row, as the buffer has always been sized
  return a;
}

GptModel::GptModel(const ModelShape& s, int B, bool checkpointing, Device& dev, OpsBackend& ops,
                   bool offload_checkpoints, bool pin_checkpoints, int micro_batches)
    : FamilyModel(s, B, checkpointing, dev, ops, micro_batches) {
  allocate(offload_checkpoints, pin_checkpoints, true, "final LayerNorm and logits");
}

// The backward scratch of GPT-2's blocks (between FamilyModel's and d(logits)).
void GptModel::carve_scratch(ViewCursor& c) {
  const std::size_t R = static_cast<std::size_t>(R_), C = static_cast<std::size_t>(shape_.d_model);
  dqkv_ = c.take(R * 3 * C);
  dfch_ = c.take(R * 4 * C);
  dfchg_ = c.take(R * 4 * C);
}

void GptModel::block_forward(const Weights& w, ConstTensorView x, const GptActs& a, int /*layer*/) {
  const int R = R_, C = shape_.d_model;
  const std::size_t RC = static_cast<std::size_t>(R) * C;
  ops_.layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, w.ln1w, w.ln1b, R, C);
  ops_.matmul_forward(a.qkv, a.ln1, w.qkvw, w.qkvb, R, C, 3 * C);
  ops_.attention_forward(a.atty, a.att, a.qkv, B_, shape_.seq_len, C, shape_.n_head);
  ops_.matmul_forward(a.res2, a.atty, w.projw, w.projb, R, C, C);
  ops_.add_inplace(a.res2, x, RC);
  ops_.layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, w.ln2w, w.ln2b, R, C);
  ops_.matmul_gelu_forward(a.fch, a.fchg, a.ln2, w.fcw, w.fcb, R, C, 4 * C);  // fch = ln2·W + b, fchg = gelu(fch)
  ops_.matmul_forward(a.out, a.fchg, w.fcprojw, w.fcprojb, R, 4 * C, C);
  ops_.add_inplace(a.out, a.res2, RC);
}

void GptModel::block_backward(const Weights& w, const Grads& g, ConstTensorView x, const GptActs& a,
                              ConstTensorView dout, TensorView dx, int /*layer*/) {
  const int R = R_, C = shape_.d_model;
  const std::size_t RC = static_cast<std::size_t>(R) * C;
  ops_.copy(dres2_, dout, RC);  // the residual path: d(res2) starts as d(out)
  ops_.zero(dfchg_, RC * 4);
  ops_.matmul_backward(dfchg_, g.fcprojw, g.fcprojb, dout, a.fchg, w.fcprojw, R, 4 * C, C);
  ops_.gelu_backward(dfch_, a.fch, dfchg_, RC * 4);
  ops_.zero(dnorm_, RC);
  ops_.matmul_backward(dnorm_, g.fcw, g.fcb, dfch_, a.ln2, w.fcw, R, C, 4 * C);
  ops_.layernorm_backward(dres2_, g.ln2w, g.ln2b, dnorm_, a.res2, w.ln2w, a.ln2_mean, a.ln2_rstd, R, C);
  ops_.zero(datty_, RC);
  ops_.matmul_backward(datty_, g.projw, g.projb, dres2_, a.atty, w.projw, R, C, C);
  ops_.attention_backward(dqkv_, datty_, a.qkv, a.att, a.atty, B_, shape_.seq_len, C, shape_.n_head);
  ops_.zero(dnorm_, RC);
  ops_.matmul_backward(dnorm_, g.qkvw, g.qkvb, dqkv_, a.ln1, w.qkvw, R, C, 3 * C);
  ops_.copy(dx, dres2_, RC);
  ops_.layernorm_backward(dx, g.ln1w, g.ln1b, dnorm_, x, w.ln1w, a.ln1_mean, a.ln1_rstd, R, C);
}

// The family's steps of the unit walk (unit_walk.h).
void GptModel::embed_forward(ConstTensorView emb, const int* tokens) {
  const int C = shape_.d_model, T = shape_.seq_len;
  const std::size_t VC = static_cast<std::size_t>(shape_.vocab_size) * C, TC = static_cast<std::size_t>(T) * C;
  ops_.encoder_forward(acts_.x0, tokens, slice(emb, 0, VC), slice(emb, VC, TC), B_, T, C);
}

GptModel::Weights GptModel::block_weights(ConstTensorView unit) const { return block_view(unit, shape_.d_model); }
GptModel::Grads GptModel::block_grads(float* unit) const { return block_view(TensorView(unit), shape_.d_model); }

void GptModel::norm_forward(ConstTensorView lnf, ConstTensorView x) {
  const int C = shape_.d_model;
  ops_.layernorm_forward(lnf_, lnf_mean_, lnf_rstd_, x, slice(lnf, 0, C), slice(lnf, C, C), R_, C);
}

void GptModel::head_forward(ConstTensorView emb, const int* targets) {
  const int C = shape_.d_model, V = shape_.vocab_size;
  ops_.lm_head_forward(probs_, losses_, lnf_, slice(emb, 0, static_cast<std::size_t>(V) * C), targets, R_, C, V);
}

void GptModel::head_backward(ConstTensorView emb, float* demb, const int* targets, float dscale) {
  const int C = shape_.d_model, V = shape_.vocab_size;
  const std::size_t VC = static_cast<std::size_t>(V) * C;
  ops_.lm_head_backward(dnorm_, slice(TensorView(demb, VC), 0, VC), dlogits_, probs_, lnf_, slice(emb, 0, VC), targets,
                        dscale, R_, C, V);
}

void GptModel::norm_backward(ConstTensorView lnf, float* dlnf_p, ConstTensorView x) {
  const int C = shape_.d_model;
  const TensorView dlnf(dlnf_p, 2 * static_cast<std::size_t>(C));
  ops_.layernorm_backward(dres_a_, slice(dlnf, 0, C), slice(dlnf, C, C), dnorm_, x, slice(lnf, 0, C), lnf_mean_,
                          lnf_rstd_, R_, C);
}

void GptModel::embed_backward(float* demb_p, ConstTensorView dout, const int* tokens) {
  const int C = shape_.d_model, T = shape_.seq_len;
  const std::size_t VC = static_cast<std::size_t>(shape_.vocab_size) * C, TC = static_cast<std::size_t>(T) * C;
  const TensorView demb(demb_p, VC + TC);
  ops_.encoder_backward(slice(demb, 0, VC), slice(demb, VC, TC), dout, tokens, B_, T, C);
}

}  // namespace zinf
