// zinf/offload/engine_kernels.h — the few operations the offload engine performs on device memory
// itself (zeroing gradients, 16-bit rounding of gradients and weights, fp32 accumulation, the norm's
// sum of squares, and the fused Update when the optimizer states live on the device).
//
// Every call is asynchronous on the given stream role, ordered after earlier work on that stream;
// the engine synchronises with events or synchronize(). A call with n = 0 (bytes = 0; a NormInput with
// n = 0) is a no-op that enqueues nothing: the empty shards of small units under ZeRO stage ≥ 2 (and
// a rank's empty part of a bucket) are legal, and a GPU refuses a launch with zero blocks. The engine
// itself does not make such calls; backends still accept them. The results must be bit-identical to
// cpu_adam's reference (the numerics contract holds across placements on any one device):
// block_sums reproduces cpu_adam's fixed order — 16 interleaved double accumulators per 64 Ki-element
// block, folded pairwise; the caller adds blocks in order —, and adam_update its operation order.
//
// Each backend implements them for its device: src/backends/cpu/engine_kernels.cpp runs cpu_adam on the
// stream's worker (device memory is host memory), src/backends/cuda/engine_kernels.cu as kernels.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "zinf/cpu_adam/adam.h"
#include "zinf/cpu_adam/host_threads.h"
#include "zinf/device.h"

namespace zinf::offload {

class EngineKernels {
 public:
  virtual ~EngineKernels() = default;
  virtual void zero(void* p, std::size_t bytes, StreamRole s) = 0;
  virtual void to_half(const float* src, void* dst, std::size_t n, cpu_adam::HalfType t, StreamRole s) = 0;
  virtual void from_half(const void* src, float* dst, std::size_t n, cpu_adam::HalfType t, StreamRole s) = 0;
  virtual void copy(void* dst, const void* src, std::size_t bytes, StreamRole s) = 0;
  virtual void add(float* acc, const float* x, std::size_t n, StreamRole s) = 0;  // acc += x
  // The norm's parts of several gradient buffers in one go: for each, its 64 Ki-block sums of squares
  // (identical to cpu_adam::sum_squares_parts). Synchronous, with one wait for the stream for all of
  // them — not one per unit.
  struct NormInput {
    const void* g;
    cpu_adam::GradType t;
    std::size_t n;
  };
  virtual std::vector<std::vector<double>> block_sums(const std::vector<NormInput>& in, StreamRole s) = 0;
  virtual void adam_update(const cpu_adam::AdamStep& st, const cpu_adam::UpdateChunk& c, StreamRole s) = 0;
  // Whether adam_update takes m and v stored in format `f` (UpdateChunk::states); the engine refuses
  // optimizer states on the device in a format its kernels do not take. Both backends take every
  // format (the CPU device through cpu_adam, CUDA with its own kernels of the same specification).
  virtual bool takes_states(cpu_adam::StateFormat) const { return true; }
};

}  // namespace zinf::offload
