// batches.h — the token and target batches on the device for the training loop.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "zinf/device.h"
#include "zinf/pinned.h"

namespace zinf {

// The token and target batch on the device, in two slots so that the host can fill and upload the
// next micro batch while the model still reads the previous one (more for the layer-major order,
// whose walk reads every micro batch of a step). The host side of each slot lives in
// page-locked memory registered with the device (one small pool of the batches' own): a copy from
// pageable memory would first be staged by the driver, blocking the trainer's thread.
//
// Handoffs, per slot: its pinned staging is written by the host and read by h2d — the host rewrites
// it only after the slot's last copies (event `copied`, recorded on h2d behind them; the host waits);
// its device buffers are written by h2d and read by compute — h2d overwrites them only after the
// model's last op that reads them (event `used`, recorded on compute by done_with; h2d waits), and
// the model reads them after the copies (`copied`, model_waits_for: compute waits).
struct Batch {
  DeviceBuffer tokens_device, targets_device;
  int* tokens_host = nullptr;  // staging: in the pinned pool
  int* targets_host = nullptr;
  EventHandle copied, used;
  int* tokens() const { return tokens_device.as<int>(); }
  int* targets() const { return targets_device.as<int>(); }
};
class BatchSlots {
 public:
  // `tokens`: tokens (and targets) per batch; `slots`: batches on the device at once (at least 2).
  BatchSlots(Device& device, std::size_t tokens, int slots = 2)
      : device_(device),
        tokens_(tokens),
        slots_(static_cast<std::size_t>(std::max(2, slots))),
        pool_(std::max<std::size_t>(1, 2 * slots_.size() * stride(tokens)) * PinnedPool::kAlign, /*lock=*/false),
        staging_(pool_.acquire(pool_.capacity())) {
    device_.register_host(staging_.data(), pool_.capacity());
    int* host = static_cast<int*>(staging_.data());
    const std::size_t step = stride(tokens) * PinnedPool::kAlign / sizeof(int);
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      slots_[i].tokens_device = DeviceBuffer(device, tokens * 4, "tokens " + std::to_string(i));
      slots_[i].targets_device = DeviceBuffer(device, tokens * 4, "targets " + std::to_string(i));
      slots_[i].tokens_host = host + (2 * i) * step;
      slots_[i].targets_host = host + (2 * i + 1) * step;
    }
  }
  ~BatchSlots() {
    try {
      device_.synchronize(StreamRole::h2d);  // no copy may still read the staging
    } catch (...) {
    }
    device_.unregister_host(staging_.data());
  }
  BatchSlots(const BatchSlots&) = delete;
  BatchSlots& operator=(const BatchSlots&) = delete;
  // Fills the next slot on the host (fill(tokens, targets)) and uploads it.
  template <class Fill>
  Batch& next(Fill fill) {
    Batch& b = slots_[next_];
    next_ = (next_ + 1) % slots_.size();
    if (b.copied) b.copied->wait();  // the slot's staging: h2d has read it
    fill(b.tokens_host, b.targets_host);
    if (b.used) device_.wait_event(StreamRole::h2d, b.used);  // the slot's device buffers: compute has read them
    device_.copy_to_device(b.tokens(), b.tokens_host, tokens_ * 4, StreamRole::h2d);
    device_.copy_to_device(b.targets(), b.targets_host, tokens_ * 4, StreamRole::h2d);
    b.copied = device_.record(StreamRole::h2d);
    model_waits_for(device_, b.copied);  // the device buffers: written by h2d, read by compute
    return b;
  }
  // The model has enqueued every op that reads the slot.
  void done_with(Batch& b) { b.used = device_.record(StreamRole::compute); }

 private:
  // Pages (of PinnedPool::kAlign bytes) per staging array: each starts on its own page.
  static std::size_t stride(std::size_t tokens) { return (tokens * 4 + PinnedPool::kAlign - 1) / PinnedPool::kAlign; }
  Device& device_;
  std::size_t tokens_;
  std::vector<Batch> slots_;
  PinnedPool pool_;
  PinnedBuffer staging_;  // the four staging arrays (tokens, targets of each slot)
  std::size_t next_ = 0;  // the slot next() fills
};

}  // namespace zinf
