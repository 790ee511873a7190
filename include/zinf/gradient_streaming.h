// zinf/gradient_streaming.h — where gradient streaming (offload_optimizer.gradient_streaming,
// docs/offload-engine.md "Streaming gradients") can apply: one rule for the config reader and the
// offload engine.
#pragma once

#include <cstdint>
#include <string>

#include "zinf/types.h"

namespace zinf {

// Why gradient streaming cannot apply to this placement (one line, for the config key), or "" when it
// can: it writes the gradient to the optimizer's NVMe tier, hands it to the speculative Update (overlap
// exact), and holds one unit's reduced gradient at a time (the part this rank keeps), so with GA > 1
// a unit's micro batches must be summed before the next unit's arrive: one after another, in the
// layer-major order (layer_major, any number of ranks), or on the device (device_grad_accumulation,
// one rank).
inline std::string gradient_streaming_refusal(OffloadDevice optimizer, bool overlap_exact, int world,
                                              std::int64_t grad_accum, bool device_grad_accum, bool layer_major) {
  if (optimizer != OffloadDevice::nvme)
    return "needs offload_optimizer.device nvme (it is " + std::string(to_string(optimizer)) +
           "): the streamed gradient's second copy is written to the optimizer's NVMe folder";
  if (!overlap_exact)
    return "needs train.overlap \"exact\" (it is \"none\"): the gradient is streamed to the speculative Update";
  if (grad_accum > 1 && !layer_major) {
    if (world > 1)
      return "with several ranks (this job has " + std::to_string(world) + ") and gradient_accumulation_steps " +
             std::to_string(grad_accum) +
             " needs offload_optimizer.layer_major true (each unit's micro batches one after another): each rank "
             "sums its micro batches' reduced gradients in host memory";
    if (!device_grad_accum)
      return "with gradient_accumulation_steps " + std::to_string(grad_accum) +
             " needs offload_optimizer.layer_major true (each unit's micro batches one after another) or "
             "device_grad_accumulation true (the micro batches summed on the device)";
  }
  return "";
}

}  // namespace zinf
