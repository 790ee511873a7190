// lm.cpp — the model of a shape's family (lm.h).
#include "model/lm.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "model/gpt.h"
#include "model/host_math.h"
#include "model/init.h"
#include "model/llama.h"

namespace zinf {

double forward_mean_loss(LanguageModel& m, Device& dev, UnitSource& src, const int* tokens, const int* targets) {
  m.forward(src, tokens, targets);
  std::vector<float> rows(static_cast<std::size_t>(m.rows()));
  if (dev.ops_stream_ordered()) {  // behind the model's ops on the compute stream
    dev.copy_to_host(rows.data(), m.row_losses(), rows.size() * sizeof(float), StreamRole::compute);
    dev.synchronize(StreamRole::compute);
  } else {  // the ops have run; the CPU device's memory is host memory
    std::copy(m.row_losses(), m.row_losses() + rows.size(), rows.begin());
  }
  return ops::mean_loss(rows.data(), m.rows());
}

void LanguageModel::forward_layers(UnitSource&, int, const int* const*) {
  throw Error("this model has no layer-major walk");
}
void LanguageModel::backward_layers(UnitSource&, int, const int* const*, const int* const*, float,
                                    const std::function<void(int)>&) {
  throw Error("this model has no layer-major walk");
}

std::unique_ptr<LanguageModel> make_model(const ModelShape& s, int B, bool checkpointing, Device& dev, OpsBackend& ops,
                                          bool offload_checkpoints, bool pin_checkpoints, int micro_batches) {
  const bool offload = checkpointing && offload_checkpoints;
  ZINF_CHECK(micro_batches >= 1 && (micro_batches == 1 || checkpointing));
  if (s.family == ModelFamily::llama)
    return std::make_unique<LlamaModel>(s, B, checkpointing, dev, ops, offload, pin_checkpoints, micro_batches);
  return std::make_unique<GptModel>(s, B, checkpointing, dev, ops, offload, pin_checkpoints, micro_batches);
}

void Checkpoints::allocate(Device& dev, DType storage, std::size_t row_elems, std::size_t row_bytes, std::size_t n,
                           bool offload, bool pin) {
  dev_ = &dev;
  storage_ = storage;
  row_elems_ = row_elems;
  row_bytes_ = row_bytes;
  n_ = n;
  offload_ = offload;
  const std::size_t rows = device_rows(n, offload), on_host = host_rows(n, offload);
  kept = DeviceBuffer(
      dev, rows * row_bytes,
      offload ? "activation checkpoints (" + std::to_string(rows) + " of " + std::to_string(n) + " on the device)"
              : "activations (" + std::to_string(n - 1) + " blocks)");
  ViewCursor c(kept.as<void>(), storage);
  for (std::size_t k = 0; k < rows; ++k) views_.push_back(c.take(row_elems));  // row_bytes apart
  if (on_host) {
    const std::size_t bytes = on_host * row_bytes;
    const std::size_t cap = (bytes + PinnedPool::kAlign - 1) / PinnedPool::kAlign * PinnedPool::kAlign;
    // Page-locked by register_host (cudaHostRegister on the CUDA device), as the token batches'
    // staging is (app/train/batches.h); no mlock of its own, so RLIMIT_MEMLOCK does not bound it.
    // Without `pin` the rows stay pageable: the device copies through its own staging.
    pool_ = std::make_unique<PinnedPool>(cap, /*lock=*/false);
    host_ = pool_->acquire(bytes);
    registered_ = pin;
    if (pin) dev.register_host(host_.data(), pool_->capacity());
  }
  on_host_.assign(n, nullptr);
  on_device_.assign(n, nullptr);
}

Checkpoints::~Checkpoints() {
  if (!host_) return;
  try {  // no copy may still read or write the host rows, or the device slots
    dev_->synchronize(StreamRole::d2h);
    dev_->synchronize(StreamRole::h2d);
  } catch (...) {
  }
  if (registered_) dev_->unregister_host(host_.data());
}

TensorView Checkpoints::host(std::size_t j) const {
  return TensorView(static_cast<char*>(host_.data()) + j * row_bytes_, storage_, row_elems_);
}

// Work on stream s between two timing events; the second is returned (it completes with the work).
EventHandle Checkpoints::timed(StreamRole s, int kind, const std::function<void()>& work) {
  if (pending_.size() >= 4096) take_times();  // a caller that never takes them: keep the list short
  EventHandle a = dev_->record_timed(s);
  work();
  EventHandle b = dev_->record_timed(s);
  pending_.push_back({a, b, kind});
  return b;
}

void Checkpoints::wait(const EventHandle& e) {
  if (!dev_->ops_stream_ordered()) {  // the host runs the ops: it waits, and its clock says how long
    const auto t0 = std::chrono::steady_clock::now();
    e->wait();
    times_.wait += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return;
  }
  timed(StreamRole::compute, kWait, [&] { dev_->wait_event(StreamRole::compute, e); });
}

CheckpointTimes Checkpoints::take_times() {
  for (const Timed& t : pending_) {
    const double s = dev_->elapsed_seconds(t.a, t.b);
    (t.kind == kD2h ? times_.d2h : t.kind == kH2d ? times_.h2d : times_.wait) += s;
  }
  pending_.clear();
  const CheckpointTimes r = times_;
  times_ = {};
  return r;
}

void Checkpoints::before_write(std::size_t j) {
  // The slot's previous checkpoint must be on the host before compute overwrites it.
  if (j >= kSlots && leaves_device(j - kSlots)) wait(on_host_[j - kSlots]);
}

void Checkpoints::written(std::size_t j) {
  if (!leaves_device(j)) return;
  dev_->wait_event(StreamRole::d2h, dev_->record(StreamRole::compute));
  BusyScope busy(*dev_, StreamRole::d2h, {"checkpoint out", static_cast<std::int64_t>(j)});
  on_host_[j] = timed(StreamRole::d2h, kD2h,
                      [&] { dev_->copy_to_host(host(j).data(), at(j).data(), row_bytes_, StreamRole::d2h); });
}

void Checkpoints::acquire(std::size_t j) {
  if (leaves_device(j)) wait(on_device_[j]);
  // One block ahead: bring the next checkpoint the backward reads back into its slot.
  if (j == 0 || !leaves_device(j - 1)) return;
  const std::size_t k = j - 1;
  if (released_[k % kSlots]) dev_->wait_event(StreamRole::h2d, released_[k % kSlots]);
  dev_->wait_event(StreamRole::h2d, on_host_[k]);
  BusyScope busy(*dev_, StreamRole::h2d, {"checkpoint in", static_cast<std::int64_t>(k)});
  on_device_[k] = timed(StreamRole::h2d, kH2d,
                        [&] { dev_->copy_to_device(at(k).data(), host(k).data(), row_bytes_, StreamRole::h2d); });
}

void Checkpoints::release(std::size_t j) {
  if (offload_) released_[j % kSlots] = dev_->record(StreamRole::compute);
}

void init_model_unit(float* p, std::size_t unit, const ModelShape& s, std::uint64_t seed) {
  if (s.family == ModelFamily::llama)
    llama_init_unit(p, unit, s, seed);
  else
    gpt2_init_unit(p, unit, s, seed);
}

}  // namespace zinf
