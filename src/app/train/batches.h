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
  DeviceBuffer tok, tgt;
  std::vector<int> tok_h, tgt_h;
  EventHandle copied, used;
  int* tokens() const { return tok.as<int>(); }
  int* targets() const { return tgt.as<int>(); }
};
class BatchSlots {
 public:
  BatchSlots(Device& d, std::size_t n) : dev_(d), n_(n) {
    for (int i = 0; i < 2; ++i) {
      s_[i].tok = DeviceBuffer(d, n * 4, "tokens " + std::to_string(i));
      s_[i].tgt = DeviceBuffer(d, n * 4, "targets " + std::to_string(i));
      s_[i].tok_h.resize(n);
      s_[i].tgt_h.resize(n);
    }
  }
  // Fills the next slot on the host (fill(tokens, targets)) and uploads it.
  template <class Fill>
  Batch& next(Fill fill) {
    Batch& b = s_[k_];
    k_ ^= 1;
    if (b.copied) b.copied->wait();
    fill(b.tok_h.data(), b.tgt_h.data());
    if (b.used) dev_.wait_event(StreamRole::h2d, b.used);
    dev_.copy_to_device(b.tokens(), b.tok_h.data(), n_ * 4, StreamRole::h2d);
    dev_.copy_to_device(b.targets(), b.tgt_h.data(), n_ * 4, StreamRole::h2d);
    b.copied = dev_.record(StreamRole::h2d);
    model_waits_for(dev_, b.copied);
    return b;
  }
  // The model has enqueued every op that reads the slot.
  void done_with(Batch& b) { b.used = dev_.record(StreamRole::compute); }

 private:
  Device& dev_;
  std::size_t n_;
  Batch s_[2];
  int k_ = 0;
};

}  // namespace zinf
