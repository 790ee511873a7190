// gpt.h — the GPT-2 model over an op backend (CPU reference ops or CUDA kernels): forward, backward
// and per-block activation checkpointing, over one flat fp32 buffer per layer unit (zinf/model.h).
//
// Unit layouts (offsets in elements; C channels, V vocab, T positions):
//   embedding: wte [V,C] then wpe [T,C]
//   block.l:   ln1.w [C] ln1.b [C] attn.qkv.w [C,3C] attn.qkv.b [3C] attn.proj.w [C,C] attn.proj.b [C]
//              ln2.w [C] ln2.b [C] mlp.fc.w [C,4C] mlp.fc.b [4C] mlp.proj.w [4C,C] mlp.proj.b [C]
//   ln_f:      w [C] b [C]
// Weights are [in, out] as in GPT-2's Conv1D, so the tensors map 1:1 onto GPT-2 checkpoints.
// Activations live in device memory (charged to the device budget) and are allocated once.
// Each unit's ops are marked as compute busy time (BusyScope) after the unit's weights are ready.
// Not thread-safe: one forward/backward at a time; the ops inside use the Par's threads.
#pragma once

#include <vector>

#include "model/backend.h"
#include "zinf/device.h"
#include "zinf/model.h"

namespace zinf {

struct BlockView {
  float *ln1w, *ln1b, *qkvw, *qkvb, *projw, *projb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
};
BlockView block_view(float* base, int C);

// Where the model gets each layer unit's weights and gradient buffers. The model asks for a unit
// right before it uses it and says when it is done, so a scheduler can keep only a window of units
// on the device, prefetch the next ones, and stream each gradient out as soon as it is complete.
// Access order per micro batch: forward 0, 1..L, L+1 (and 0 again for the LM head); backward
// 0 and L+1 (head, final LayerNorm), L..1, then 0 (embedding).
class UnitSource {
 public:
  virtual ~UnitSource() = default;
  virtual const float* weights(std::size_t unit) = 0;  // fp32 device weights; valid until done_with
  virtual void done_with(std::size_t unit) = 0;
  virtual float* grads(std::size_t unit) = 0;          // fp32 device buffer, zero at first request per micro batch
  virtual void grads_done(std::size_t unit) = 0;       // this micro batch's gradient of the unit is complete
};

// Every unit resident: plain arrays (tests, and the simplest engine).
class ResidentUnits final : public UnitSource {
 public:
  ResidentUnits(std::vector<const float*> w, std::vector<float*> g, std::vector<std::size_t> n)
      : w_(std::move(w)), g_(std::move(g)), n_(std::move(n)) {}
  const float* weights(std::size_t u) override { return w_[u]; }
  void done_with(std::size_t) override {}
  float* grads(std::size_t u) override { return g_[u]; }
  void grads_done(std::size_t) override {}

 private:
  std::vector<const float*> w_;
  std::vector<float*> g_;
  std::vector<std::size_t> n_;
};

class GptModel {
 public:
  // B: micro batch. Activations for B×T tokens are allocated on `dev` now.
  GptModel(const ModelShape& s, int B, bool checkpointing, Device& dev, OpsBackend& ops);

  // Forward pass; returns the mean cross-entropy over the B×T targets. Keeps what backward needs.
  double forward(UnitSource& src, const int* tokens, const int* targets);
  // Backward of the last forward: each row's gradient is scaled by `dscale` (loss_scale / (B·T·GA)
  // for a mean loss); the units' gradient buffers are accumulated (+=).
  void backward(UnitSource& src, const int* tokens, const int* targets, float dscale);

  const ModelShape& shape() const { return s_; }
  int batch() const { return B_; }

 private:
  struct BlockActs {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *att, *atty, *res2, *ln2, *ln2_mean, *ln2_rstd, *fch, *fchg, *out;
  };
  BlockActs carve(float*& p) const;
  std::size_t block_acts_floats() const;
  void block_forward(const BlockView& w, const float* x, const BlockActs& a);
  void block_backward(const BlockView& w, const BlockView& g, const float* x, const BlockActs& a, const float* dout,
                      float* dx);

  ModelShape s_;
  int B_, R_;
  bool ckpt_;
  Device& dev_;
  OpsBackend& ops_;
  DeviceBuffer acts_buf_, scratch_buf_, head_buf_, grad_buf_;
  float* enc_out_ = nullptr;
  std::vector<BlockActs> acts_;  // full activations per block, or (checkpointing) only .out is valid
  BlockActs recompute_{};        // checkpointing: one block's activations, recomputed in backward
  float *lnf_, *lnf_mean_, *lnf_rstd_, *probs_, *losses_;
  float *dres_a_, *dres_b_, *dres2_, *dln_, *datty_, *dqkv_, *dfch_, *dfchg_, *dlogits_;
};

}  // namespace zinf
