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
// A family M befriends UnitWalk<M> and has, besides shape_, R_, ckpt_, dev_, ops_, acts_ (lm.h,
// BlockActivations) and the residual gradients dres_a_ / dres_b_ ([R, C] each):
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
#include <utility>

#include "model/lm.h"
#include "zinf/device.h"

namespace zinf {

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
};

}  // namespace zinf
