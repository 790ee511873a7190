// twin_ops.h — the CPU device's twin of the CUDA fast kernels (device.kernels fast): the model stores
// its activations and weights in the run's precision S, and every op reads, computes and rounds
// exactly where the GPU's fast path does, so a 16-bit run on the CPU device shows what the GPU's
// will compute, up to summation order:
//   - every 16-bit view argument is widened exactly to fp32; the fp32 reference op (ops::name of
//     ops_gpt.h / ops_llama.h) runs on the widened copies with fp32 accumulation;
//   - every written view is rounded once, to nearest even (cpu_adam/spec.h's rule), back to its
//     dtype (an output the op accumulates into is read, added to in fp32 and rounded once);
//   - fp32 views (weight gradients, norm statistics, the attention state, row losses, rotary tables)
//     pass as they are.
// Views of 16-bit data must be sized (the twin converts exactly numel() elements): an unsized one is
// refused with a zinf::Error naming the op and the argument. Results do not depend on the thread
// count (the reference ops do not, and the conversions are elementwise).
#pragma once

#include <memory>

#include "cpu/ops_gpt.h"
#include "model/backend.h"
#include "zinf/types.h"

namespace zinf::cpu {

// The twin for runs of `precision` (its storage dtype), on a pool of `threads`.
std::unique_ptr<OpsBackend> make_twin_ops(Precision precision, int threads);

}  // namespace zinf::cpu
