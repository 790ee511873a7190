// fast_ops.h — the CUDA fast path (device.kernels = "fast"): the model's OpsBackend on 16-bit storage
// with tensor-core GEMMs (cuBLASLt, fused bias / GELU epilogues), a flash attention that keeps only
// the per-row log-sum-exp, and row kernels that round each output once. Storage: weights,
// activations and their gradients in the run's precision S (bf16, fp16, or fp32 in fp32 runs);
// weight gradients, norm statistics, the attention state and row losses in fp32. A view of another
// type is refused with a zinf::Error naming the op and the argument.
// Built with ZINF_CUDA; plain C++ here.
#pragma once

#include <memory>

#include "model/backend.h"
#include "zinf/device.h"
#include "zinf/types.h"

namespace zinf::cuda {

// `dev` must be the CUDA device; everything is enqueued on its compute stream. `attention` is resolved
// (cudnn or wmma; cudnn in a build without cuDNN throws ConfigError, reference throws too).
std::unique_ptr<OpsBackend> make_cuda_fast_ops(Device& dev, Precision precision, Attention attention);

}  // namespace zinf::cuda
