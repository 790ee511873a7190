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
  // The unit's device weights, in the dtype the source holds them in on the device (fp32 working
  // weights, or the 16-bit parameters themselves under the fast kernels); valid until done_with.
  virtual ConstTensorView weights(std::size_t unit) = 0;
  virtual void done_with(std::size_t unit) = 0;
  virtual float* grads(std::size_t unit) = 0;     // fp32 device buffer, zero at first request per micro batch
  virtual void grads_done(std::size_t unit) = 0;  // this micro batch's gradient of the unit is complete
};

// Every unit resident: plain arrays (tests, and the simplest engine).
class ResidentUnits final : public UnitSource {
 public:
  ResidentUnits(std::vector<const float*> w, std::vector<float*> g, std::vector<std::size_t> n)
      : grads_(std::move(g)), sizes_(std::move(n)) {
    for (std::size_t u = 0; u < w.size(); ++u) weights_.emplace_back(w[u], u < sizes_.size() ? sizes_[u] : kUnsized);
  }
  // Weights of any dtype (a 16-bit copy for the fast kernels); gradients fp32.
  ResidentUnits(std::vector<ConstTensorView> w, std::vector<float*> g, std::vector<std::size_t> n)
      : weights_(std::move(w)), grads_(std::move(g)), sizes_(std::move(n)) {}
  ConstTensorView weights(std::size_t u) override { return weights_[u]; }
  void done_with(std::size_t) override {}
  float* grads(std::size_t u) override { return grads_[u]; }
  void grads_done(std::size_t) override {}

 private:
  std::vector<ConstTensorView> weights_;
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

// Lays typed, sized views out one after another in one device buffer (a byte cursor): activations in
// the backend's storage dtype, the fp32 statistics beside them. With fp32 storage every view follows
// the previous one directly (the layout of an all-fp32 buffer); with 16-bit storage each view starts
// on a 16-byte boundary, so no fp32 view is misaligned and vector loads stay aligned. A cursor over
// a null base measures: bytes() after the same takes is the buffer's size.
class ViewCursor {
 public:
  ViewCursor(void* base, DType storage)
      : base_(static_cast<char*>(base)), storage_(storage), align_(storage == DType::fp32 ? 4 : 16) {}
  TensorView take(std::size_t n) { return take_as(storage_, n); }          // n elements of the storage dtype
  TensorView take_fp32(std::size_t n) { return take_as(DType::fp32, n); }  // n fp32 elements
  std::size_t bytes() const { return round(at_); }
  DType storage() const { return storage_; }

 private:
  std::size_t round(std::size_t b) const { return (b + align_ - 1) / align_ * align_; }
  TensorView take_as(DType t, std::size_t n) {
    const std::size_t start = round(at_);
    at_ = start + n * dtype_bytes(t);
    if (!base_) return TensorView();
    return TensorView(base_ + start, t, n);
  }
  char* base_;
  DType storage_;
  std::size_t align_, at_ = 0;
};

// The activations a model keeps for backward, allocated once on the device: the embedding output
// (x0), then per block either everything (`carve` lays one block's Acts out from a ViewCursor) or,
// with checkpointing, only its output (= the next block's input) plus one block's recompute scratch.
template <class Acts>
struct BlockActivations {
  DeviceBuffer kept, scratch;
  TensorView x0;
  std::vector<Acts> blocks;  // .out always valid; the rest only without checkpointing
  Acts recompute{};

  // row_elems: one [R, C] activation (x0, a block's output), in `storage`.
  template <class Carve>
  void allocate(Device& dev, DType storage, std::size_t row_elems, std::size_t n_blocks, bool checkpointing,
                Carve carve) {
    ViewCursor measure_row(nullptr, storage), measure_block(nullptr, storage);
    measure_row.take(row_elems);
    carve(measure_block);
    const std::size_t row = measure_row.bytes(), per_block = measure_block.bytes();
    const std::size_t n = row + (checkpointing ? n_blocks * row : n_blocks * per_block);
    kept = DeviceBuffer(dev, n, "activations (" + std::to_string(n_blocks) + " blocks)");
    ViewCursor c(kept.as<void>(), storage);
    x0 = c.take(row_elems);
    for (std::size_t l = 0; l < n_blocks; ++l) {
      if (checkpointing) {
        Acts a{};
        a.out = c.take(row_elems);
        blocks.push_back(a);
      } else {
        blocks.push_back(carve(c));
      }
    }
    if (checkpointing) {
      scratch = DeviceBuffer(dev, per_block, "activation recompute scratch");
      ViewCursor r(scratch.as<void>(), storage);
      recompute = carve(r);
    }
  }
};

// The model of `s.family` for micro batches of B sequences; activations are allocated on `dev`.
std::unique_ptr<LanguageModel> make_model(const ModelShape& s, int B, bool checkpointing, Device& dev, OpsBackend& ops);
// The family's initialisation of unit `unit` (deterministic per unit and seed).
void init_model_unit(float* p, std::size_t unit, const ModelShape& s, std::uint64_t seed);

}  // namespace zinf
