// ops_profile.h — the model's ops timed by kind, for `zinf bench step --profile`. A wrapper around
// the device's backend: on a device whose ops are stream work (CUDA, the asynchronous CPU device)
// each op is bracketed by two timed events on the compute stream, read back at take(); on the
// synchronous CPU device, where an op runs inside the call, by the host clock. GEMMs are classed by
// their input and output features against the model's shape (qkv, attention projection, MLP up and
// down, …), so each class reports its own TFLOPS.
#pragma once

#include <memory>
#include <vector>

#include "model/backend.h"
#include "zinf/device.h"
#include "zinf/model.h"
#include "zinf/train.h"

namespace zinf {

class OpProfile {
 public:
  virtual ~OpProfile() = default;
  // Every op since the last call, summed by kind (waits for the compute stream to reach them).
  virtual std::vector<OpTime> take() = 0;
};

// Wraps `inner`; `profile` receives the times.
std::unique_ptr<OpsBackend> make_profile_ops(Device& dev, const ModelShape& shape, std::unique_ptr<OpsBackend> inner,
                                             std::shared_ptr<OpProfile>* profile);

}  // namespace zinf
