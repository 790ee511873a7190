// lm.h — what the trainer sees of a language model, whichever family: forward and backward over
// layer units that a UnitSource (the offload engine, or plain arrays) provides.
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/backend.h"
#include "model/shape.h"
#include "zinf/device.h"
#include "zinf/pinned.h"
#include "zinf/types.h"

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
  // The layer-major walk (LanguageModel::forward_backward_layers): the following grads / grads_done
  // are of micro batch m.
  virtual void micro_batch(std::int64_t) {}
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

// The one walk over a family's units, forward and backward (model/unit_walk.h).
template <class M>
struct UnitWalk;

class LanguageModel {
 public:
  virtual ~LanguageModel() = default;
  // Forward pass; keeps what backward needs. Each of the B×T rows' cross-entropy is in row_losses()
  // (device memory) once the model's ops have run: nothing here waits for them. A row whose target
  // is kIgnoreTarget (-1, model/op_list.h) holds 0 and gets no gradient in backward.
  virtual void forward(UnitSource& src, const int* tokens, const int* targets) = 0;
  virtual const float* row_losses() const = 0;
  virtual int rows() const = 0;
  // Backward of the last forward: each row's gradient is scaled by `dscale` (loss_scale / (B·T·GA)
  // for a mean loss; loss_scale / the step's unmasked targets with masked targets); the units'
  // gradient buffers are accumulated (+=).
  virtual void backward(UnitSource& src, const int* tokens, const int* targets, float dscale) = 0;
  // Forward and backward of n micro batches in the layer-major order (a model made for n micro
  // batches, make_model; checkpointing): each unit's weights are asked for once per pass and every
  // micro batch goes through a unit before the next unit. forward_layers runs the embedding and the
  // blocks, keeping every micro batch's checkpoints; backward_layers runs the top micro batch by micro
  // batch — the final norm and the head forward, `loss(m)` while micro batch m's row losses are in
  // row_losses(), their backward — then the blocks and the embedding backward. Unit u's gradient of
  // micro batch m is asked for and completed after src.micro_batch(m), the micro batches of a unit one
  // after another (those of the unit the tied LM head shares with the embedding stay open from the
  // head's backward to the embedding's). Every op is the one forward() and backward() run for that
  // micro batch, on the same inputs: the gradients are bitwise those of the micro batches in turn.
  virtual void forward_layers(UnitSource& src, int n, const int* const* tokens);
  virtual void backward_layers(UnitSource& src, int n, const int* const* tokens, const int* const* targets,
                               float dscale, const std::function<void(int)>& loss);
  // With activation_checkpointing.cpu_checkpointing, the checkpoint copies' and waits' seconds since
  // the last call (Checkpoints::take_times); nothing otherwise.
  virtual CheckpointTimes take_checkpoint_times() { return {}; }
};

// A forward whose mean loss the caller reads at once (tests, one-off evaluations): waits for the
// device. The mean is over all B×T rows, masked ones counting 0. The trainer instead collects the
// row losses of a whole step and reads them at its end.
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
  // The LM head's probs or dlogits for R rows of V classes, laid out as `rows` says (model/backend.h):
  // R·V elements, or R·Vp elements at an offset that is a multiple of kLogitsAlignBytes (the device's
  // allocations are at least that aligned, so the view's first row is too).
  TensorView take_logits(std::size_t R, int V, LogitsRows rows) {
    const auto stride = static_cast<std::size_t>(logits_row_stride(V, rows));
    return take_as(storage_, R * stride, rows == LogitsRows::padded ? kLogitsAlignBytes : align_);
  }
  std::size_t bytes() const { return round(at_); }
  DType storage() const { return storage_; }

 private:
  std::size_t round(std::size_t b, std::size_t a) const { return (b + a - 1) / a * a; }
  std::size_t round(std::size_t b) const { return round(b, align_); }
  TensorView take_as(DType t, std::size_t n) { return take_as(t, n, align_); }
  TensorView take_as(DType t, std::size_t n, std::size_t align) {
    const std::size_t start = round(at_, align);
    at_ = start + n * dtype_bytes(t);
    if (!base_) return TensorView();
    return TensorView(base_ + start, t, n);
  }
  char* base_;
  DType storage_;
  std::size_t align_, at_ = 0;
};

// The checkpointed block inputs of activation checkpointing: checkpoint 0 is the embedding output,
// checkpoint l+1 block l's output (block l+1's input; checkpoint L is the final norm's input).
//
// Resident (the default): all L+1 on the device. Offloaded (activation_checkpointing.cpu_checkpointing):
// the device holds kSlots of them, checkpoint j in slot j % kSlots, and every checkpoint that a later
// one overwrites in the forward (j + kSlots <= L) moves to pinned host memory on the d2h stream behind
// the forward, and comes back on the h2d stream one block ahead of its recomputation in the backward.
// The last kSlots checkpoints never leave the device: the backward starts with them.
//
// Handoffs (the step graph, zinf/offload/dataflow.h, draws them beside the engine's own):
//   slot, forward:  written by compute (the embedding, or the copy of a block's output), read by d2h
//                   — d2h waits for `written` recorded on compute behind the write; compute writes
//                   checkpoint j + kSlots over it only after `on_host[j]`, recorded on d2h behind the
//                   copy (model_waits_for: compute waits, or the host on the synchronous CPU device);
//   host copy:      written by d2h, read by h2d — h2d waits for `on_host[j]`;
//   slot, backward: written by h2d, read by compute — compute waits for `on_device[j]`, recorded on
//                   h2d behind the copy; h2d overwrites a slot only after `released`, recorded on
//                   compute behind the last op that reads the checkpoint before (its block's backward).
// The calls, in the model's order: forward before_write(j), (write), written(j) for j = 0..L; backward
// acquire(j), (read), release(j) for j = L..0. Not thread-safe: the model's thread only.
class Checkpoints {
 public:
  static constexpr std::size_t kSlots = 2;

  // n checkpoints of row_elems elements each, `row_bytes` apart, carved from `kept` (resident: n rows;
  // offloaded: min(n, kSlots) rows, see device_rows) in `storage`.
  // `pin`: the host rows are page-locked (registered with the device); false: pageable memory, as
  // the config's pin_memory says (the copies then go through the device's own staging).
  void allocate(Device& dev, DType storage, std::size_t row_elems, std::size_t row_bytes, std::size_t n, bool offload,
                bool pin = true);
  ~Checkpoints();
  // Device rows for n checkpoints, and how many of them live in pinned host memory.
  static std::size_t device_rows(std::size_t n, bool offload) { return offload ? std::min(n, kSlots) : n; }
  static std::size_t host_rows(std::size_t n, bool offload) { return offload && n > kSlots ? n - kSlots : 0; }

  TensorView at(std::size_t j) const { return views_[offload_ ? j % kSlots : j]; }
  bool leaves_device(std::size_t j) const { return offload_ && j + kSlots < n_; }

  void before_write(std::size_t j);  // forward: compute is about to write checkpoint j
  void written(std::size_t j);       // forward: compute has been given every op that writes it
  void acquire(std::size_t j);       // backward: the model is about to read checkpoint j
  void release(std::size_t j);       // backward: the model has been given every op that reads it
  // The copies' and waits' seconds since the last call: waits for the timing events of the copies
  // and waits enqueued so far (call it where the host has synchronised with the device anyway).
  CheckpointTimes take_times();

  DeviceBuffer kept;

 private:
  TensorView host(std::size_t j) const;
  void wait(const EventHandle& e);  // model_waits_for, timed
  EventHandle timed(StreamRole s, int kind, const std::function<void()>& work);
  enum { kD2h, kH2d, kWait };
  struct Timed {
    EventHandle a, b;
    int kind;
  };
  std::vector<Timed> pending_;
  CheckpointTimes times_;
  Device* dev_ = nullptr;
  std::size_t n_ = 0, row_elems_ = 0, row_bytes_ = 0;
  DType storage_ = DType::fp32;
  bool offload_ = false, registered_ = false;
  std::vector<TensorView> views_;
  std::unique_ptr<PinnedPool> pool_;
  PinnedBuffer host_;
  std::vector<EventHandle> on_host_, on_device_;
  EventHandle released_[kSlots];
};

// The activations a model keeps for backward, allocated once on the device: the embedding output
// (x0), then per block either everything (`carve` lays one block's Acts out from a ViewCursor) or,
// with checkpointing, only its output (= the next block's input, a Checkpoints row, on the device or
// offloaded to pinned host memory) plus one block's recompute scratch.
template <class Acts>
struct BlockActivations {
  DeviceBuffer kept, scratch;
  Checkpoints ckpt;  // with checkpointing: x0 and every block's .out
  TensorView x0;
  std::vector<Acts> blocks;  // .out always valid; the rest only without checkpointing
  Acts recompute{};
  bool checkpointing = false;

  // row_elems: one [R, C] activation (x0, a block's output), in `storage`.
  template <class Carve>
  void allocate(Device& dev, DType storage, std::size_t row_elems, std::size_t n_blocks, bool checkpoint, bool offload,
                bool pin, Carve carve) {
    checkpointing = checkpoint;
    ViewCursor measure_row(nullptr, storage), measure_block(nullptr, storage);
    measure_row.take(row_elems);
    carve(measure_block);
    const std::size_t row = measure_row.bytes(), per_block = measure_block.bytes();
    if (checkpointing) {
      ckpt.allocate(dev, storage, row_elems, row, n_blocks + 1, offload, pin);
      x0 = ckpt.at(0);
      for (std::size_t l = 0; l < n_blocks; ++l) {
        Acts a{};
        a.out = ckpt.at(l + 1);
        blocks.push_back(a);
      }
      scratch = DeviceBuffer(dev, per_block, "activation recompute scratch");
      ViewCursor r(scratch.as<void>(), storage);
      recompute = carve(r);
      return;
    }
    const std::size_t n = row + n_blocks * per_block;
    kept = DeviceBuffer(dev, n, "activations (" + std::to_string(n_blocks) + " blocks)");
    ViewCursor c(kept.as<void>(), storage);
    x0 = c.take(row_elems);
    for (std::size_t l = 0; l < n_blocks; ++l) blocks.push_back(carve(c));
  }
  // The hooks of Checkpoints, no-ops without checkpointing.
  void before_write(std::size_t j) {
    if (checkpointing) ckpt.before_write(j);
  }
  void written(std::size_t j) {
    if (checkpointing) ckpt.written(j);
  }
  void acquire(std::size_t j) {
    if (checkpointing) ckpt.acquire(j);
  }
  void release(std::size_t j) {
    if (checkpointing) ckpt.release(j);
  }
};

// The model of `s.family` for micro batches of B sequences; activations are allocated on `dev`.
// `offload_checkpoints` (activation_checkpointing.cpu_checkpointing, with `checkpointing` only): the
// checkpointed block inputs live in host memory (Checkpoints), page-locked unless `pin_checkpoints`
// is false (the offload sections' pin_memory).
// `micro_batches` > 1 (with checkpointing only): the model keeps the checkpoints of that many micro
// batches, for forward_backward_layers.
std::unique_ptr<LanguageModel> make_model(const ModelShape& s, int B, bool checkpointing, Device& dev, OpsBackend& ops,
                                          bool offload_checkpoints = false, bool pin_checkpoints = true,
                                          int micro_batches = 1);
// The family's initialisation of unit `unit` (deterministic per unit and seed).
void init_model_unit(float* p, std::size_t unit, const ModelShape& s, std::uint64_t seed);

}  // namespace zinf
