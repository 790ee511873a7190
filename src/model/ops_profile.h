// ops_profile.h — the model's ops timed by kind, for `zinf bench step --profile`. A wrapper around
// the device's backend: on a device whose ops are stream work (CUDA, the asynchronous CPU device)
// each op is bracketed by two timed events on the compute stream, read back at take(); on the
// synchronous CPU device, where an op runs inside the call, by the host clock. GEMMs are classed by
// their input and output features against the model's shape (qkv, attention projection, MLP up and
// down, …), so each class reports its own TFLOPS.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/backend.h"
#include "model/shape.h"
#include "zinf/device.h"

namespace zinf {

// Device time of one kind of the model's ops (`zinf bench step --profile`): a GEMM class (by its
// input and output features), attention, norms, elementwise ops, embeddings, the LM head, copies.
struct OpTime {
  std::string name;
  std::int64_t calls = 0;
  double seconds = 0;  // on the compute stream (the host's own time on the synchronous CPU device)
  double flops = 0;    // floating-point operations (0 for ops measured in bytes)
};

class OpProfile {
 public:
  virtual ~OpProfile() = default;
  // Every op since the last call, summed by kind (waits for the compute stream to reach them).
  virtual std::vector<OpTime> take() = 0;
  // While inactive the wrapper only forwards each op (no events, no clock reads): the training
  // loop's flops_profiler times one step. Active from the start; set between steps.
  void set_active(bool on) { active_.store(on, std::memory_order_relaxed); }
  bool active() const { return active_.load(std::memory_order_relaxed); }

 private:
  std::atomic<bool> active_{true};
};

// Wraps `inner`; `profile` receives the times.
std::unique_ptr<OpsBackend> make_profile_ops(Device& dev, const ModelShape& shape, std::unique_ptr<OpsBackend> inner,
                                             std::shared_ptr<OpProfile>* profile);

}  // namespace zinf
