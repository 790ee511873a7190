// batches.h — the token and target batches on the device for the training loop.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "zinf/device.h"

namespace zinf {

// The token and target batch on the device, in two slots so that the host can fill and upload the
// next micro batch while the model still reads the previous one. Handoffs: the host rewrites a
// slot's staging only after its last h2d copy (event `copied`, host waits); the h2d stream
// overwrites a slot's device buffers only after the model's last op that reads them (event `used`,
// recorded on compute by done_with); the model reads them after the copies (model_waits_for).
struct Batch {
  DeviceBuffer tokens_device, targets_device;
  std::vector<int> tokens_host, targets_host;  // staging
  EventHandle copied, used;
  int* tokens() const { return tokens_device.as<int>(); }
  int* targets() const { return targets_device.as<int>(); }
};
class BatchSlots {
 public:
  // `tokens`: tokens (and targets) per batch.
  BatchSlots(Device& device, std::size_t tokens) : device_(device), tokens_(tokens) {
    for (int i = 0; i < 2; ++i) {
      slots_[i].tokens_device = DeviceBuffer(device, tokens * 4, "tokens " + std::to_string(i));
      slots_[i].targets_device = DeviceBuffer(device, tokens * 4, "targets " + std::to_string(i));
      slots_[i].tokens_host.resize(tokens);
      slots_[i].targets_host.resize(tokens);
    }
  }
  // Fills the next slot on the host (fill(tokens, targets)) and uploads it.
  template <class Fill>
  Batch& next(Fill fill) {
    Batch& b = slots_[next_];
    next_ ^= 1;
    if (b.copied) b.copied->wait();
    fill(b.tokens_host.data(), b.targets_host.data());
    if (b.used) device_.wait_event(StreamRole::h2d, b.used);
    device_.copy_to_device(b.tokens(), b.tokens_host.data(), tokens_ * 4, StreamRole::h2d);
    device_.copy_to_device(b.targets(), b.targets_host.data(), tokens_ * 4, StreamRole::h2d);
    b.copied = device_.record(StreamRole::h2d);
    model_waits_for(device_, b.copied);
    return b;
  }
  // The model has enqueued every op that reads the slot.
  void done_with(Batch& b) { b.used = device_.record(StreamRole::compute); }

 private:
  Device& device_;
  std::size_t tokens_;
  Batch slots_[2];
  int next_ = 0;  // the slot next() fills
};

}  // namespace zinf
