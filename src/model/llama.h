// llama.h — the Llama family (Llama 2/3, Mistral, Qwen2, TinyLlama, SmolLM) over an op backend:
// forward, backward and per-block activation checkpointing, over one flat fp32 buffer per layer unit
// (model/shape.h).
//
// Unit layouts (offsets in elements; C width, V vocab, KVD = key/value heads × head width, F = d_ff):
//   embedding: wte [V,C]
//   block.l:   attn_norm [C]  wq [C,C] (bq [C])  wk [C,KVD] (bk [KVD])  wv [C,KVD] (bv [KVD])  wo [C,C]
//              ffn_norm [C]  w_gate [C,F]  w_up [C,F]  w_down [F,C]        (biases with qkv_bias only)
//   final:     norm [C] (lm_head [V,C] unless the head is tied to wte)
// Matrices are [in, out] (Hugging Face stores [out, in]: import and export transpose). Rotary
// positions follow Hugging Face's convention (pairs i, i + D/2), so HF weights need no permutation.
// Activations live in device memory and are allocated once; each unit's ops are marked as compute
// busy time. Not thread-safe: one forward/backward at a time.
#pragma once

#include <vector>

#include "model/host_math.h"
#include "model/lm.h"
#include "model/unit_walk.h"

namespace zinf {

// One block's tensors inside its unit (biases empty without qkv_bias): float pointers
// (initialisation on the host), typed sized views of the device weights, or fp32 views of its gradient.
template <class V>
struct LlamaBlock {
  V attn_norm, wq, bq, wk, bk, wv, bv, wo, ffn_norm, w_gate, w_up, w_down;
};
using LlamaBlockView = LlamaBlock<float*>;
LlamaBlockView llama_block_view(float* base, const ModelShape& s);
LlamaBlock<ConstTensorView> llama_block_view(const ConstTensorView& base, const ModelShape& s);
LlamaBlock<TensorView> llama_block_view(const TensorView& base, const ModelShape& s);

// One block's activations in the backend's storage dtype; the RMSNorm rstd and att in fp32.
struct LlamaActs {
  TensorView an, an_rstd, q, k, v, att, atty, res2, fn, fn_rstd, gate, up, h, out;
};

// The LanguageModel interface (lm.h) for the Llama family (FamilyModel in model/unit_walk.h).
class LlamaModel final : public FamilyModel<LlamaModel, LlamaActs> {
 public:
  // offload_checkpoints: the checkpointed block inputs live in host memory (lm.h, Checkpoints),
  // page-locked unless pin_checkpoints is false.
  LlamaModel(const ModelShape& s, int B, bool checkpointing, Device& dev, OpsBackend& ops,
             bool offload_checkpoints = false, bool pin_checkpoints = true, int micro_batches = 1);

 private:
  friend class FamilyModel<LlamaModel, LlamaActs>;
  LlamaActs carve(ViewCursor& c) const;
  void carve_scratch(ViewCursor& c);
  using Weights = LlamaBlock<ConstTensorView>;
  using Grads = LlamaBlock<TensorView>;
  void block_forward(const Weights& w, ConstTensorView x, const LlamaActs& a, int layer);  // layer: 0..L-1 (its window)
  void block_backward(const Weights& w, const Grads& g, ConstTensorView x, const LlamaActs& a, ConstTensorView dout,
                      TensorView dx, int layer);
  // The family's steps of the one walk over the units (model/unit_walk.h).
  friend struct UnitWalk<LlamaModel>;
  void embed_forward(ConstTensorView emb, const int* tokens);
  Weights block_weights(ConstTensorView unit) const;
  Grads block_grads(float* unit) const;
  void norm_forward(ConstTensorView fin, ConstTensorView x);
  bool head_in_embedding() const { return shape_.tie_embeddings; }
  void head_forward(ConstTensorView unit, const int* targets);
  void head_backward(ConstTensorView unit, float* dunit, const int* targets, float dscale);
  void norm_backward(ConstTensorView fin, float* dfin, ConstTensorView x);
  void embed_backward(float* demb, ConstTensorView dout, const int* tokens);

  int T_, C_, H_, KV_, D_, F_;
  DeviceBuffer rope_buf_;
  TensorView cos_, sin_;  // fp32 rotary tables [T, D/2]
  TensorView dq_, dk_, dv_, dh_, dgate_, dup_;
};

// Llama-style initialisation: N(0, 0.02) matrices, N(0, 0.02/√(2L)) for wo and w_down, zero biases,
// norms 1.
void llama_init_unit(float* p, std::size_t unit, const ModelShape& s, std::uint64_t seed);

// The rotary tables of positions 0..T-1 for the shape's head width, rope_theta and rope_scaling
// (T rows of head_dim / 2), as the training forward and the KV-cache decoder use them.
void llama_rope_tables(const ModelShape& s, int T, std::vector<float>& cos_t, std::vector<float>& sin_t);

}  // namespace zinf
