// lm.h — what the trainer sees of a language model, whichever family: forward and backward over
// layer units that a UnitSource (the offload engine, or plain arrays) provides.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "model/backend.h"
#include "model/shape.h"
#include "zinf/device.h"

namespace zinf {

// Where the model gets each layer unit's weights and gradient buffers. The model asks for a unit
// right before it uses it and says when it is done, so a scheduler can keep only a window of units
// on the device, prefetch the next ones, and stream each gradient out as soon as it is complete.
// Access order per micro batch: forward 0, 1..L, L+1 (and 0 again for a tied LM head); backward the
// head's unit and L+1 (head, final norm), L..1, then 0 (embedding).
class UnitSource {
 public:
  virtual ~UnitSource() = default;
  virtual const float* weights(std::size_t unit) = 0;  // fp32 device weights; valid until done_with
  virtual void done_with(std::size_t unit) = 0;
  virtual float* grads(std::size_t unit) = 0;     // fp32 device buffer, zero at first request per micro batch
  virtual void grads_done(std::size_t unit) = 0;  // this micro batch's gradient of the unit is complete
};

// Every unit resident: plain arrays (tests, and the simplest engine).
class ResidentUnits final : public UnitSource {
 public:
  ResidentUnits(std::vector<const float*> w, std::vector<float*> g, std::vector<std::size_t> n)
      : weights_(std::move(w)), grads_(std::move(g)), sizes_(std::move(n)) {}
  const float* weights(std::size_t u) override { return weights_[u]; }
  void done_with(std::size_t) override {}
  float* grads(std::size_t u) override { return grads_[u]; }
  void grads_done(std::size_t) override {}

 private:
  std::vector<const float*> weights_;
  std::vector<float*> grads_;
  std::vector<std::size_t> sizes_;
};

class LanguageModel {
 public:
  virtual ~LanguageModel() = default;
  // Forward pass; keeps what backward needs. Each of the B×T rows' cross-entropy is in row_losses()
  // (device memory) once the model's ops have run: nothing here waits for them.
  virtual void forward(UnitSource& src, const int* tokens, const int* targets) = 0;
  virtual const float* row_losses() const = 0;
  virtual int rows() const = 0;
  // Backward of the last forward: each row's gradient is scaled by `dscale` (loss_scale / (B·T·GA)
  // for a mean loss); the units' gradient buffers are accumulated (+=).
  virtual void backward(UnitSource& src, const int* tokens, const int* targets, float dscale) = 0;
};

// A forward whose mean loss the caller reads at once (tests, one-off evaluations): waits for the
// device. The trainer instead collects the row losses of a whole step and reads them at its end.
double forward_mean_loss(LanguageModel& m, Device& dev, UnitSource& src, const int* tokens, const int* targets);

// The activations a model keeps for backward, allocated once on the device: the embedding output
// (x0), then per block either everything (`carve` lays one block's Acts out from a float cursor) or,
// with checkpointing, only its output (= the next block's input) plus one block's recompute scratch.
template <class Acts>
struct BlockActivations {
  DeviceBuffer kept, scratch;
  float* x0 = nullptr;
  std::vector<Acts> blocks;  // .out always valid; the rest only without checkpointing
  Acts recompute{};

  template <class Carve>
  void allocate(Device& dev, std::size_t row_floats, std::size_t n_blocks, std::size_t per_block, bool checkpointing,
                Carve carve) {
    const std::size_t n = row_floats + (checkpointing ? n_blocks * row_floats : n_blocks * per_block);
    kept = DeviceBuffer(dev, n * sizeof(float), "activations (" + std::to_string(n_blocks) + " blocks)");
    float* p = kept.as<float>();
    x0 = p;
    p += row_floats;
    for (std::size_t l = 0; l < n_blocks; ++l) {
      if (checkpointing) {
        Acts a{};
        a.out = p;
        p += row_floats;
        blocks.push_back(a);
      } else {
        blocks.push_back(carve(p));
      }
    }
    if (checkpointing) {
      scratch = DeviceBuffer(dev, per_block * sizeof(float), "activation recompute scratch");
      float* q = scratch.as<float>();
      recompute = carve(q);
    }
  }
};

// The model of `s.family` for micro batches of B sequences; activations are allocated on `dev`.
std::unique_ptr<LanguageModel> make_model(const ModelShape& s, int B, bool checkpointing, Device& dev, OpsBackend& ops);
// The family's initialisation of unit `unit` (deterministic per unit and seed).
void init_model_unit(float* p, std::size_t unit, const ModelShape& s, std::uint64_t seed);

}  // namespace zinf
