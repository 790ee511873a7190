// gpt.h — the GPT-2 model over an op backend (CPU reference ops or CUDA kernels): forward, backward
// and per-block activation checkpointing, over one flat fp32 buffer per layer unit (model/shape.h).
//
// Unit layouts (offsets in elements; C channels, V vocab, T positions):
//   embedding: wte [V,C] then wpe [T,C]
//   block.l:   ln1.w [C] ln1.b [C] attn.qkv.w [C,3C] attn.qkv.b [3C] attn.proj.w [C,C] attn.proj.b [C]
//              ln2.w [C] ln2.b [C] mlp.fc.w [C,4C] mlp.fc.b [4C] mlp.proj.w [4C,C] mlp.proj.b [C]
//   ln_f:      w [C] b [C]
// Weights are [in, out] as in GPT-2's Conv1D, so the tensors map 1:1 onto GPT-2 checkpoints.
// Activations live in device memory (charged to the device budget) and are allocated once.
// Each unit's ops are marked as compute busy time (BusyScope) after the unit's weights are ready.
// Not thread-safe: one forward/backward at a time; the ops inside use the ChunkPool's threads.
#pragma once

#include <vector>

#include "model/backend.h"
#include "model/lm.h"
#include "model/shape.h"
#include "model/unit_walk.h"
#include "zinf/device.h"

namespace zinf {

// One block's tensors inside its unit: float pointers (initialisation on the host), typed sized
// views of the device weights (any dtype), or sized fp32 views of its gradient.
template <class V>
struct GptBlock {
  V ln1w, ln1b, qkvw, qkvb, projw, projb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb;
};
using BlockView = GptBlock<float*>;
BlockView block_view(float* base, int C);
GptBlock<ConstTensorView> block_view(const ConstTensorView& base, int C);
GptBlock<TensorView> block_view(const TensorView& base, int C);

// One block's activations in the backend's storage dtype; the LayerNorm statistics and att in fp32.
struct GptActs {
  TensorView ln1, ln1_mean, ln1_rstd, qkv, att, atty, res2, ln2, ln2_mean, ln2_rstd, fch, fchg, out;
};

// The LanguageModel interface (lm.h) for GPT-2 (FamilyModel in model/unit_walk.h: forward, backward,
// row_losses), as llama.h has it for the Llama family.
class GptModel final : public FamilyModel<GptModel, GptActs> {
 public:
  // B: micro batch. Activations for B×T tokens are allocated on `dev` now.
  // offload_checkpoints: the checkpointed block inputs live in host memory (lm.h, Checkpoints),
  // page-locked unless pin_checkpoints is false.
  GptModel(const ModelShape& s, int B, bool checkpointing, Device& dev, OpsBackend& ops,
           bool offload_checkpoints = false, bool pin_checkpoints = true, int micro_batches = 1);

  const ModelShape& shape() const { return shape_; }
  int batch() const { return B_; }

 private:
  friend class FamilyModel<GptModel, GptActs>;
  GptActs carve(ViewCursor& c) const;
  void carve_scratch(ViewCursor& c);
  using Weights = GptBlock<ConstTensorView>;
  using Grads = GptBlock<TensorView>;
  void block_forward(const Weights& w, ConstTensorView x, const GptActs& a, int layer);  // layer unused: no windows
  void block_backward(const Weights& w, const Grads& g, ConstTensorView x, const GptActs& a, ConstTensorView dout,
                      TensorView dx, int layer);
  // The family's steps of the one walk over the units (model/unit_walk.h).
  friend struct UnitWalk<GptModel>;
  void embed_forward(ConstTensorView emb, const int* tokens);
  Weights block_weights(ConstTensorView unit) const;
  Grads block_grads(float* unit) const;
  void norm_forward(ConstTensorView fin, ConstTensorView x);
  bool head_in_embedding() const { return true; }
  void head_forward(ConstTensorView unit, const int* targets);
  void head_backward(ConstTensorView unit, float* dunit, const int* targets, float dscale);
  void norm_backward(ConstTensorView fin, float* dfin, ConstTensorView x);
  void embed_backward(float* demb, ConstTensorView dout, const int* tokens);

  TensorView dqkv_, dfch_, dfchg_;
};

}  // namespace zinf
