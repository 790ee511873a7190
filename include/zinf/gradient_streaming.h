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
// exact), holds whole units of one rank, and with GA > 1 needs a unit's micro batches summed before the
// next unit's arrive: on the device (device_grad_accumulation) or one after another (layer_major).
inline std::string gradient_streaming_refusal(OffloadDevice optimizer, bool overlap_exact, int world,
                                              std::int64_t grad_accum, bool summed_by_unit) {
  if (optimizer != OffloadDevice::nvme)
    return "needs offload_optimizer.device nvme (it is " + std::string(to_string(optimizer)) +
           "): the streamed gradient's second copy is written to the optimizer's NVMe folder";
  if (!overlap_exact)
    return "needs train.overlap \"exact\" (it is \"none\"): the gradient is streamed to the speculative Update";
  if (world > 1) return "takes one rank (this job has " + std::to_string(world) + ")";
  if (grad_accum > 1 && !summed_by_unit)
    return "with gradient_accumulation_steps " + std::to_string(grad_accum) +
           " needs offload_optimizer.layer_major true (each unit's micro batches one after another) or "
           "device_grad_accumulation true (the micro batches summed on the device)";
  return "";
}

}  // namespace zinf
