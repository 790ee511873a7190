// unit_walk.h — the one walk of a forward and a backward over a model's units, shared by GPT-2
// (gpt.cpp) and the Llama family (llama.cpp): which unit's weights are asked for when, when the model
// is done with them, when a unit's gradients are asked for and complete (the UnitSource protocol,
// lm.h), the activation checkpoints' hooks and the profiler's scopes. A family adds its ops, not its
// schedule.
//
// The units: 0 the token embedding (GPT-2: with the positions), 1..L the blocks, L+1 the final norm;
// the LM head is the embedding's matrix (tied, in unit 0) or its own (untied, in unit L+1).
//   forward   0: embed; 1..L: each block (with checkpointing: recomputed from its kept input in the
//             backward, only its output kept); L+1: the norm, then the head (in L+1, or after L+1
//             is done, in 0 again)
//   backward  the head (in 0, done with it; or in L+1); L+1: the norm; L..1: each block; 0: the
//             embedding's gradient, which is complete last
// A family M derives from FamilyModel<M, Acts> below (which holds shape_, R_, ckpt_, dev_, ops_, acts_
// and the residual gradients dres_a_ / dres_b_, [R, C] each), befriends UnitWalk<M> and has:
//   embed_forward(w0, tokens)                  writes acts_.x0
//   block_weights(view), block_grads(float*)   one block's Weights / Grads over its unit
//   block_forward(w, x, acts, layer), block_backward(w, g, x, acts, dout, dx, layer)  (layer 0..L-1)
//   norm_forward(fin, x)                       the final norm of x, from unit L+1's weights
//   head_in_embedding()                        true when the LM head is unit 0's matrix
//   head_forward(unit, targets)                the LM head from its unit's weights
//   head_backward(unit, grads, targets, dscale)
//   norm_backward(fin, dfin, x)                adds the final norm's input gradient into dres_a_ (zeroed)
//   embed_backward(d0, dout, tokens)
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "model/lm.h"
#include "zinf/device.h"
#include "zinf/error.h"

namespace zinf {

// A unit's tensors one after another from `base` (a float*, a ConstTensorView or a TensorView):
// each call take(n) gives the next n elements, as a pointer or a view like base.
template <class V>
auto take_in_order(V base) {
  return [base, at = std::size_t{0}](std::size_t n) mutable {
    V v;
    if constexpr (std::is_pointer_v<V>)
      v = base + at;
    else
      v = slice(base, at, n);
    at += n;
    return v;
  };
}

template <class M>
struct UnitWalk {
  static void forward(M& m, UnitSource& src, const int* tokens, const int* targets) {
    const std::size_t L = static_cast<std::size_t>(m.shape_.n_layer);
    const std::size_t RC = static_cast<std::size_t>(m.R_) * static_cast<std::size_t>(m.shape_.d_model);
    const ConstTensorView emb = src.weights(0);
    m.acts_.before_write(0);
    {
      BusyScope busy(m.dev_, StreamRole::compute, {"forward", 0});
      m.embed_forward(emb, tokens);
    }
    m.acts_.written(0);
    src.done_with(0);
    ConstTensorView x = m.acts_.x0;
    for (std::size_t l = 0; l < L; ++l) {
      const auto bw = m.block_weights(src.weights(l + 1));
      {
        BusyScope busy(m.dev_, StreamRole::compute, {"forward", static_cast<std::int64_t>(l + 1)});
        if (m.ckpt_) {
          m.block_forward(bw, x, m.acts_.recompute, static_cast<int>(l));
          m.acts_.before_write(l + 1);
          m.ops_.copy(m.acts_.blocks[l].out, m.acts_.recompute.out, RC);
          m.acts_.written(l + 1);
        } else {
          m.block_forward(bw, x, m.acts_.blocks[l], static_cast<int>(l));
        }
      }
      src.done_with(l + 1);
      x = m.acts_.blocks[l].out;
    }
    const ConstTensorView fin = src.weights(L + 1);
    if (m.head_in_embedding()) {
      {
        BusyScope busy(m.dev_, StreamRole::compute, {"forward", static_cast<std::int64_t>(L + 1)});
        m.norm_forward(fin, x);
      }
      src.done_with(L + 1);
      const ConstTensorView w0 = src.weights(0);
      {
        BusyScope busy(m.dev_, StreamRole::compute, {"forward", 0});
        m.head_forward(w0, targets);
      }
      src.done_with(0);
    } else {
      {
        BusyScope busy(m.dev_, StreamRole::compute, {"forward", static_cast<std::int64_t>(L + 1)});
        m.norm_forward(fin, x);
        m.head_forward(fin, targets);
      }
      src.done_with(L + 1);
    }
  }

  static void backward(M& m, UnitSource& src, const int* tokens, const int* targets, float dscale) {
    const std::size_t L = static_cast<std::size_t>(m.shape_.n_layer);
    const std::size_t RC = static_cast<std::size_t>(m.R_) * static_cast<std::size_t>(m.shape_.d_model);
    if (m.head_in_embedding()) {
      const ConstTensorView w0 = src.weights(0);
      float* d0 = src.grads(0);
      {
        BusyScope busy(m.dev_, StreamRole::compute, {"backward", 0});
        m.head_backward(w0, d0, targets, dscale);
      }
      src.done_with(0);
    }
    const ConstTensorView last = L > 0 ? m.acts_.blocks[L - 1].out : m.acts_.x0;
    const ConstTensorView fin = src.weights(L + 1);
    float* dfin = src.grads(L + 1);
    if (!m.head_in_embedding()) {
      BusyScope busy(m.dev_, StreamRole::compute, {"backward", static_cast<std::int64_t>(L + 1)});
      m.head_backward(fin, dfin, targets, dscale);
    }
    m.acts_.acquire(L);
    {
      BusyScope busy(m.dev_, StreamRole::compute, {"backward", static_cast<std::int64_t>(L + 1)});
      m.ops_.zero(m.dres_a_, RC);
      m.norm_backward(fin, dfin, last);
    }
    m.acts_.release(L);
    src.grads_done(L + 1);
    src.done_with(L + 1);
    TensorView dout = m.dres_a_;
    TensorView dx = m.dres_b_;
    for (std::size_t l = L; l-- > 0;) {
      m.acts_.acquire(l);
      const ConstTensorView x = l > 0 ? m.acts_.blocks[l - 1].out : m.acts_.x0;
      const auto bw = m.block_weights(src.weights(l + 1));
      const auto bg = m.block_grads(src.grads(l + 1));
      {
        BusyScope busy(m.dev_, StreamRole::compute, {"backward", static_cast<std::int64_t>(l + 1)});
        const auto* a = &m.acts_.blocks[l];
        if (m.ckpt_) {  // recompute this block's activations from its kept input
          m.block_forward(bw, x, m.acts_.recompute, static_cast<int>(l));
          a = &m.acts_.recompute;
        }
        m.block_backward(bw, bg, x, *a, dout, dx, static_cast<int>(l));
      }
      m.acts_.release(l);
      src.grads_done(l + 1);
      src.done_with(l + 1);
      std::swap(dout, dx);
    }
    float* d0 = src.grads(0);
    {
      BusyScope busy(m.dev_, StreamRole::compute, {"backward", 0});
      m.embed_backward(d0, dout, tokens);
    }
    src.grads_done(0);
  }

  // The layer-major order (LanguageModel::forward_backward_layers): the same ops as forward() then
  // backward() for each micro batch in turn, each unit's micro batches one after another. Checkpoint
  // j holds every micro batch's row (FamilyModel::select picks one), so the Checkpoints protocol —
  // forward before_write / written for j = 0..L, backward acquire / release for j = L..0 — is
  // unchanged; each micro batch's residual gradient is kept (dres_mb_) from one unit to the next.
  static void forward_layers(M& m, UnitSource& src, int G, const int* const* tokens) {
    const std::size_t L = static_cast<std::size_t>(m.shape_.n_layer);
    const std::size_t RC = static_cast<std::size_t>(m.R_) * static_cast<std::size_t>(m.shape_.d_model);
    ZINF_CHECK(m.ckpt_ && G >= 1 && G <= m.G_);
    auto input_of = [&](std::size_t l) -> ConstTensorView { return l > 0 ? m.acts_.blocks[l - 1].out : m.acts_.x0; };
    // Forward: the embedding, then each block, every micro batch through it.
    {
      const ConstTensorView emb = src.weights(0);
      m.acts_.before_write(0);
      for (int mb = 0; mb < G; ++mb) {
        m.select(mb);
        BusyScope busy(m.dev_, StreamRole::compute, {"forward", 0});
        m.embed_forward(emb, tokens[mb]);
      }
      m.acts_.written(0);
      src.done_with(0);
    }
    for (std::size_t l = 0; l < L; ++l) {
      const auto bw = m.block_weights(src.weights(l + 1));
      m.acts_.before_write(l + 1);
      for (int mb = 0; mb < G; ++mb) {
        m.select(mb);
        BusyScope busy(m.dev_, StreamRole::compute, {"forward", static_cast<std::int64_t>(l + 1)});
        m.block_forward(bw, input_of(l), m.acts_.recompute, static_cast<int>(l));
        m.ops_.copy(m.acts_.blocks[l].out, m.acts_.recompute.out, RC);
      }
      m.acts_.written(l + 1);
      src.done_with(l + 1);
    }
  }

  static void backward_layers(M& m, UnitSource& src, int G, const int* const* tokens, const int* const* targets,
                              float dscale, const std::function<void(int)>& loss) {
    const std::size_t L = static_cast<std::size_t>(m.shape_.n_layer);
    const std::size_t RC = static_cast<std::size_t>(m.R_) * static_cast<std::size_t>(m.shape_.d_model);
    ZINF_CHECK(m.ckpt_ && G >= 1 && G <= m.G_);
    auto input_of = [&](std::size_t l) -> ConstTensorView { return l > 0 ? m.acts_.blocks[l - 1].out : m.acts_.x0; };
    // The top, micro batch by micro batch: the final norm and the head forward, the loss, their
    // backward. With the head in the embedding, unit 0's gradient of each micro batch stays open until
    // the embedding's backward at the end.
    const bool tied = m.head_in_embedding();
    const ConstTensorView fin = src.weights(L + 1);
    const ConstTensorView head = tied ? src.weights(0) : fin;
    const std::size_t head_unit = tied ? 0 : L + 1;
    m.acts_.acquire(L);
    for (int mb = 0; mb < G; ++mb) {
      m.select(mb);
      const ConstTensorView last = input_of(L);
      {
        BusyScope busy(m.dev_, StreamRole::compute, {"forward", static_cast<std::int64_t>(L + 1)});
        m.norm_forward(fin, last);
      }
      {
        BusyScope busy(m.dev_, StreamRole::compute, {"forward", static_cast<std::int64_t>(head_unit)});
        m.head_forward(head, targets[mb]);
      }
      loss(mb);
      src.micro_batch(mb);
      float* dhead = src.grads(head_unit);
      {
        BusyScope busy(m.dev_, StreamRole::compute, {"backward", static_cast<std::int64_t>(head_unit)});
        m.head_backward(head, dhead, targets[mb], dscale);
      }
      float* dfin = tied ? src.grads(L + 1) : dhead;
      {
        BusyScope busy(m.dev_, StreamRole::compute, {"backward", static_cast<std::int64_t>(L + 1)});
        m.dres_a_ = m.dres_mb_[0][static_cast<std::size_t>(mb)];
        m.ops_.zero(m.dres_a_, RC);
        m.norm_backward(fin, dfin, last);
      }
      src.grads_done(L + 1);
    }
    m.acts_.release(L);
    if (tied) src.done_with(0);
    src.done_with(L + 1);
    // Backward: each block, every micro batch through it (recomputed from its checkpoint).
    std::size_t cur = 0;  // dres_mb_[cur][mb]: micro batch mb's gradient of the current block's output
    for (std::size_t l = L; l-- > 0;) {
      m.acts_.acquire(l);
      const auto bw = m.block_weights(src.weights(l + 1));
      for (int mb = 0; mb < G; ++mb) {
        m.select(mb);
        src.micro_batch(mb);
        const auto bg = m.block_grads(src.grads(l + 1));
        {
          BusyScope busy(m.dev_, StreamRole::compute, {"backward", static_cast<std::int64_t>(l + 1)});
          m.block_forward(bw, input_of(l), m.acts_.recompute, static_cast<int>(l));
          m.block_backward(bw, bg, input_of(l), m.acts_.recompute, m.dres_mb_[cur][static_cast<std::size_t>(mb)],
                           m.dres_mb_[cur ^ 1][static_cast<std::size_t>(mb)], static_cast<int>(l));
        }
        src.grads_done(l + 1);
      }
      m.acts_.release(l);
      src.done_with(l + 1);
      cur ^= 1;
    }
    for (int mb = 0; mb < G; ++mb) {
      src.micro_batch(mb);
      float* d0 = src.grads(0);
      {
        BusyScope busy(m.dev_, StreamRole::compute, {"backward", 0});
        m.embed_backward(d0, m.dres_mb_[cur][static_cast<std::size_t>(mb)], tokens[mb]);
      }
      src.grads_done(0);
    }
    m.select(0);
    m.dres_a_ = m.dres_a_home_;
  }
};

// What the model families share: the LanguageModel calls (the walk above over M's steps), the state
// the walk reads, and the buffers and views besides the blocks' activations that both carve, in this
// order. The head buffer: the final norm's output, mean (LayerNorm only) and rstd, the row losses, the
// logits. The backward scratch: the residual gradients, the final and block norms' input gradient
// (dnorm_), d(attention output), then the family's own (M's carve_scratch), then d(logits).
// M has Acts carve(ViewCursor&) const (one block's activations) and void carve_scratch(ViewCursor&).
template <class M, class Acts>
class FamilyModel : public LanguageModel {
 public:
  // Each of the B×T rows' cross-entropy into row_losses(); keeps what backward needs.
  void forward(UnitSource& src, const int* tokens, const int* targets) override {
    UnitWalk<M>::forward(self(), src, tokens, targets);
  }
  const float* row_losses() const override { return static_cast<const float*>(losses_.data()); }
  int rows() const override { return R_; }
  // Each row's gradient is scaled by `dscale` (loss_scale / (B·T·GA) for a mean loss); the units'
  // gradient buffers are accumulated (+=).
  void backward(UnitSource& src, const int* tokens, const int* targets, float dscale) override {
    UnitWalk<M>::backward(self(), src, tokens, targets, dscale);
  }
  void forward_layers(UnitSource& src, int n, const int* const* tokens) override {
    UnitWalk<M>::forward_layers(self(), src, n, tokens);
  }
  void backward_layers(UnitSource& src, int n, const int* const* tokens, const int* const* targets, float dscale,
                       const std::function<void(int)>& loss) override {
    UnitWalk<M>::backward_layers(self(), src, n, tokens, targets, dscale, loss);
  }
  CheckpointTimes take_checkpoint_times() override {
    return acts_.checkpointing ? acts_.ckpt.take_times() : CheckpointTimes{};
  }

 protected:
  FamilyModel(const ModelShape& s, int B, bool checkpointing, Device& dev, OpsBackend& ops, int micro_batches = 1)
      : shape_(s), B_(B), R_(B * s.seq_len), G_(micro_batches), ckpt_(checkpointing), dev_(dev), ops_(ops) {}

  // Allocates the activations (checkpointed in host memory with offload_checkpoints, page-locked
  // unless pin_checkpoints is false), the head buffer (`head_what` in its allocation's name; with
  // norm_mean the final norm's mean too) and the backward scratch.
  void allocate(bool offload_checkpoints, bool pin_checkpoints, bool norm_mean, const char* head_what) {
    const std::size_t R = static_cast<std::size_t>(R_), C = static_cast<std::size_t>(shape_.d_model),
                      L = static_cast<std::size_t>(shape_.n_layer);
    const DType S = ops_.storage_dtype();
    const LogitsRows logits = ops_.logits_rows();
    const auto G = static_cast<std::size_t>(G_);  // a checkpoint row holds every micro batch's
    acts_.allocate(dev_, S, G > 1 ? G * micro_stride() : R * C, L, ckpt_, offload_checkpoints, pin_checkpoints,
                   [this](ViewCursor& c) { return self().carve(c); });
    if (G > 1) {  // each micro batch's residual gradient, twice (a block's output and input)
      ViewCursor measure(nullptr, S);
      for (std::size_t i = 0; i < 2 * G; ++i) measure.take(R * C);
      dres_mb_buf_ = DeviceBuffer(dev_, measure.bytes(), "residual gradients of the micro batches");
      ViewCursor c(dres_mb_buf_.as<void>(), S);
      for (auto& set : dres_mb_)
        for (std::size_t i = 0; i < G; ++i) set.push_back(c.take(R * C));
    }
    select(0);
    auto head = [&](ViewCursor& c) {
      lnf_ = c.take(R * C);
      if (norm_mean) lnf_mean_ = c.take_fp32(R);
      lnf_rstd_ = c.take_fp32(R);
      losses_ = c.take_fp32(R);
      probs_ = c.take_logits(R, shape_.vocab_size, logits);
    };
    auto scratch = [&](ViewCursor& c) {
      dres_a_ = c.take(R * C);
      dres_b_ = c.take(R * C);
      dres2_ = c.take(R * C);
      dnorm_ = c.take(R * C);
      datty_ = c.take(R * C);
      self().carve_scratch(c);
      dlogits_ = c.take_logits(R, shape_.vocab_size, logits);
    };
    ViewCursor head_size(nullptr, S), scratch_size(nullptr, S);
    head(head_size);
    scratch(scratch_size);
    head_buf_ = DeviceBuffer(dev_, head_size.bytes(), head_what);
    grad_buf_ = DeviceBuffer(dev_, scratch_size.bytes(), "backward scratch");
    ViewCursor hc(head_buf_.as<void>(), S), gc(grad_buf_.as<void>(), S);
    head(hc);
    scratch(gc);
    dres_a_home_ = dres_a_;
  }

  // Elements between two micro batches' rows in a checkpoint (G_ > 1): [R, C] rounded up to 8
  // elements, so that each starts 16-byte aligned as the views of a ViewCursor do.
  std::size_t micro_stride() const {
    return (static_cast<std::size_t>(R_) * static_cast<std::size_t>(shape_.d_model) + 7) / 8 * 8;
  }
  // The views x0 and each block's .out of micro batch mb's row in every checkpoint.
  void select(int mb) {
    if (!ckpt_) return;
    const std::size_t RC = static_cast<std::size_t>(R_) * static_cast<std::size_t>(shape_.d_model),
                      at = static_cast<std::size_t>(mb) * micro_stride();
    acts_.x0 = slice(acts_.ckpt.at(0), at, RC);
    for (std::size_t l = 0; l < acts_.blocks.size(); ++l) acts_.blocks[l].out = slice(acts_.ckpt.at(l + 1), at, RC);
  }

  ModelShape shape_;
  int B_, R_;
  int G_;  // the micro batches the checkpoints hold (forward_backward_layers)
  bool ckpt_;
  Device& dev_;
  OpsBackend& ops_;
  BlockActivations<Acts> acts_;  // x0: the embedding output
  DeviceBuffer head_buf_, grad_buf_;
  TensorView lnf_, lnf_mean_, lnf_rstd_, probs_, losses_;
  TensorView dres_a_, dres_b_, dres2_, dnorm_, datty_, dlogits_;
  TensorView dres_a_home_;                  // dres_a_ as allocated (the layer-major walk points it elsewhere)
  DeviceBuffer dres_mb_buf_;                // G_ > 1: the micro batches' residual gradients
  std::vector<TensorView> dres_mb_[2];      //   [set][micro batch]

 private:
  M& self() { return static_cast<M&>(*this); }
};

}  // namespace zinf
