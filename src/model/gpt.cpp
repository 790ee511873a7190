// gpt.cpp — GPT-2 forward/backward over layer units (gpt.h).
#include "model/gpt.h"

#include <cstring>

namespace zinf {

BlockView block_view(float* p, int C) {
  const std::size_t c = static_cast<std::size_t>(C);
  auto take = [&p](std::size_t n) {  // the next n floats of the block
    float* start = p;
    p += n;
    return start;
  };
  BlockView v{};
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
  v.fcprojb = p;
  return v;
}

std::size_t GptModel::block_acts_floats() const {
  const std::size_t R = static_cast<std::size_t>(R_), C = static_cast<std::size_t>(shape_.d_model);
  const std::size_t att = static_cast<std::size_t>(B_) * shape_.n_head * shape_.seq_len * shape_.seq_len;
  return R * C * 6 + R * 4 + R * 3 * C + att +
         R * 4 * C * 2;  // ln1 atty res2 ln2 out(+1 spare) | stats | qkv | att | fch fchg
}

GptModel::BlockActs GptModel::carve(float*& p) const {
  const std::size_t R = static_cast<std::size_t>(R_), C = static_cast<std::size_t>(shape_.d_model);
  const std::size_t att = static_cast<std::size_t>(B_) * shape_.n_head * shape_.seq_len * shape_.seq_len;
  BlockActs a{};
  auto take = [&](std::size_t n) {
    float* r = p;
    p += n;
    return r;
  };
  a.ln1 = take(R * C);
  a.ln1_mean = take(R);
  a.ln1_rstd = take(R);
  a.qkv = take(R * 3 * C);
  a.att = take(att);
  a.atty = take(R * C);
  a.res2 = take(R * C);
  a.ln2 = take(R * C);
  a.ln2_mean = take(R);
  a.ln2_rstd = take(R);
  a.fch = take(R * 4 * C);
  a.fchg = take(R * 4 * C);
  a.out = take(R * C);
  take(R * C);  // keeps carve() within block_acts_floats()
  return a;
}

GptModel::GptModel(const ModelShape& s, int B, bool checkpointing, Device& dev, OpsBackend& ops)
    : shape_(s), B_(B), R_(B * s.seq_len), ckpt_(checkpointing), dev_(dev), ops_(ops) {
  const std::size_t R = static_cast<std::size_t>(R_), C = static_cast<std::size_t>(s.d_model),
                    V = static_cast<std::size_t>(s.vocab_size), L = static_cast<std::size_t>(s.n_layer);
  acts_.allocate(dev, R * C, L, block_acts_floats(), ckpt_, [this](float*& p) { return carve(p); });
  head_buf_ = DeviceBuffer(dev, (R * C + 3 * R + R * V) * sizeof(float), "final LayerNorm and logits");
  float* p = head_buf_.as<float>();
  lnf_ = p, p += R * C;
  lnf_mean_ = p, p += R;
  lnf_rstd_ = p, p += R;
  losses_ = p, p += R;
  probs_ = p;
  grad_buf_ = DeviceBuffer(dev, (R * C * 5 + R * 3 * C + R * 4 * C * 2 + R * V) * sizeof(float), "backward scratch");
  p = grad_buf_.as<float>();
  dres_a_ = p, p += R * C;
  dres_b_ = p, p += R * C;
  dres2_ = p, p += R * C;
  dln_ = p, p += R * C;
  datty_ = p, p += R * C;
  dqkv_ = p, p += R * 3 * C;
  dfch_ = p, p += R * 4 * C;
  dfchg_ = p, p += R * 4 * C;
  dlogits_ = p;
}

void GptModel::block_forward(const BlockView& w, const float* x, const BlockActs& a) {
  const int R = R_, C = shape_.d_model;
  const std::size_t RC = static_cast<std::size_t>(R) * C;
  ops_.layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, w.ln1w, w.ln1b, R, C);
  ops_.matmul_forward(a.qkv, a.ln1, w.qkvw, w.qkvb, R, C, 3 * C);
  ops_.attention_forward(a.atty, a.att, a.qkv, B_, shape_.seq_len, C, shape_.n_head);
  ops_.matmul_forward(a.res2, a.atty, w.projw, w.projb, R, C, C);
  ops_.add_inplace(a.res2, x, RC);
  ops_.layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, w.ln2w, w.ln2b, R, C);
  ops_.matmul_forward(a.fch, a.ln2, w.fcw, w.fcb, R, C, 4 * C);
  ops_.gelu_forward(a.fchg, a.fch, RC * 4);
  ops_.matmul_forward(a.out, a.fchg, w.fcprojw, w.fcprojb, R, 4 * C, C);
  ops_.add_inplace(a.out, a.res2, RC);
}

void GptModel::block_backward(const BlockView& w, const BlockView& g, const float* x, const BlockActs& a,
                              const float* dout, float* dx) {
  const int R = R_, C = shape_.d_model;
  const std::size_t RC = static_cast<std::size_t>(R) * C;
  ops_.copy(dres2_, dout, RC);  // the residual path: d(res2) starts as d(out)
  ops_.zero(dfchg_, RC * 4);
  ops_.matmul_backward(dfchg_, g.fcprojw, g.fcprojb, dout, a.fchg, w.fcprojw, R, 4 * C, C);
  ops_.gelu_backward(dfch_, a.fch, dfchg_, RC * 4);
  ops_.zero(dln_, RC);
  ops_.matmul_backward(dln_, g.fcw, g.fcb, dfch_, a.ln2, w.fcw, R, C, 4 * C);
  ops_.layernorm_backward(dres2_, g.ln2w, g.ln2b, dln_, a.res2, w.ln2w, a.ln2_mean, a.ln2_rstd, R, C);
  ops_.zero(datty_, RC);
  ops_.matmul_backward(datty_, g.projw, g.projb, dres2_, a.atty, w.projw, R, C, C);
  ops_.attention_backward(dqkv_, datty_, a.qkv, a.att, B_, shape_.seq_len, C, shape_.n_head);
  ops_.zero(dln_, RC);
  ops_.matmul_backward(dln_, g.qkvw, g.qkvb, dqkv_, a.ln1, w.qkvw, R, C, 3 * C);
  ops_.copy(dx, dres2_, RC);
  ops_.layernorm_backward(dx, g.ln1w, g.ln1b, dln_, x, w.ln1w, a.ln1_mean, a.ln1_rstd, R, C);
}

void GptModel::forward(UnitSource& src, const int* tokens, const int* targets) {
  const std::size_t L = static_cast<std::size_t>(shape_.n_layer);
  const int C = shape_.d_model, V = shape_.vocab_size, T = shape_.seq_len;
  const float* wte = src.weights(0);
  {
    BusyScope busy(dev_, StreamRole::compute);
    ops_.encoder_forward(acts_.x0, tokens, wte, wte + static_cast<std::size_t>(V) * C, B_, T, C);
  }
  src.done_with(0);
  const float* x = acts_.x0;
  for (std::size_t l = 0; l < L; ++l) {
    const BlockView bw = block_view(const_cast<float*>(src.weights(l + 1)), C);
    {
      BusyScope busy(dev_, StreamRole::compute);
      if (ckpt_) {
        block_forward(bw, x, acts_.recompute);
        ops_.copy(acts_.blocks[l].out, acts_.recompute.out, static_cast<std::size_t>(R_) * C);
      } else {
        block_forward(bw, x, acts_.blocks[l]);
      }
    }
    src.done_with(l + 1);
    x = acts_.blocks[l].out;
  }
  const float* lnf = src.weights(L + 1);
  {
    BusyScope busy(dev_, StreamRole::compute);
    ops_.layernorm_forward(lnf_, lnf_mean_, lnf_rstd_, x, lnf, lnf + C, R_, C);
  }
  src.done_with(L + 1);
  wte = src.weights(0);
  {
    BusyScope busy(dev_, StreamRole::compute);
    ops_.lm_head_forward(probs_, losses_, lnf_, wte, targets, R_, C, V);
  }
  src.done_with(0);
}

void GptModel::backward(UnitSource& src, const int* tokens, const int* targets, float dscale) {
  const std::size_t L = static_cast<std::size_t>(shape_.n_layer);
  const int C = shape_.d_model, V = shape_.vocab_size, T = shape_.seq_len;
  const std::size_t RC = static_cast<std::size_t>(R_) * C;
  const float* wte = src.weights(0);
  float* dwte = src.grads(0);
  {
    BusyScope busy(dev_, StreamRole::compute);
    ops_.lm_head_backward(dln_, dwte, dlogits_, probs_, lnf_, wte, targets, dscale, R_, C, V);
  }
  src.done_with(0);
  const float* last = L > 0 ? acts_.blocks[L - 1].out : acts_.x0;
  // The backward's last unit (the final norm) and the handoff of its gradients are written as in
  // llama.cpp: each family names its own norm op and buffers, which a shared helper would have to take
  // as a dozen parameters.
  const float* lnf = src.weights(L + 1);
  float* dlnf = src.grads(L + 1);
  {
    BusyScope busy(dev_, StreamRole::compute);
    ops_.zero(dres_a_, RC);
    ops_.layernorm_backward(dres_a_, dlnf, dlnf + C, dln_, last, lnf, lnf_mean_, lnf_rstd_, R_, C);
  }
  src.grads_done(L + 1);
  src.done_with(L + 1);
  float* dout = dres_a_;
  float* dx = dres_b_;
  for (std::size_t l = L; l-- > 0;) {
    const float* x = l > 0 ? acts_.blocks[l - 1].out : acts_.x0;
    const BlockView bw = block_view(const_cast<float*>(src.weights(l + 1)), C);
    const BlockView bg = block_view(src.grads(l + 1), C);
    {
      BusyScope busy(dev_, StreamRole::compute);
      const BlockActs* a = &acts_.blocks[l];
      if (ckpt_) {  // recompute this block's activations from its kept input
        block_forward(bw, x, acts_.recompute);
        a = &acts_.recompute;
      }
      block_backward(bw, bg, x, *a, dout, dx);
    }
    src.grads_done(l + 1);
    src.done_with(l + 1);
    std::swap(dout, dx);
  }
  dwte = src.grads(0);
  {
    BusyScope busy(dev_, StreamRole::compute);
    ops_.encoder_backward(dwte, dwte + static_cast<std::size_t>(V) * C, dout, tokens, B_, T, C);
  }
  src.grads_done(0);
}

}  // namespace zinf
