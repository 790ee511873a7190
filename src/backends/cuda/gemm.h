// gemm.h — the CUDA backend's GEMM executor: runs the plans of gemm_plan.h through cuBLASLt, with the
// descriptors and the heuristic's algorithm built once per call shape (GemmKey: shapes, transposes,
// dtypes, epilogue, batches, alignments) and cached. Both op backends use it: the reference kernels
// (fp32, no epilogue) and the fast path (16-bit operands, fused epilogues).
//
// Arithmetic: fp32 accumulation always; `GemmMath` says how the products are formed (see below).
// Everything runs on the device's compute stream; cuBLASLt's results are deterministic for a
// given algorithm, and the algorithm is fixed per key for the executor's life.
#pragma once

#include <cstddef>
#include <memory>

#include "cuda/gemm_plan.h"
#include "zinf/device.h"

namespace zinf::cuda {

enum class GemmMath {
  fp32_pedantic,  // fp32 products, no tensor-core shortcuts (the reference fp32 runs: the CPU's arithmetic)
  fast_16bf,      // fp32 storage, products of the inputs rounded to bf16 (the reference bf16 runs)
  fast_16f,       // the same with fp16
  fp32,           // fp32 compute: 16-bit operands multiply exactly on tensor cores (the fast path)
};

class GemmExecutor {
 public:
  // `dev` must be the CUDA device. workspace_bytes: cuBLASLt's workspace (split-K and stream-K need
  // one), taken once from `dev`.
  GemmExecutor(Device& dev, GemmMath math, std::size_t workspace_bytes);
  ~GemmExecutor();
  GemmExecutor(const GemmExecutor&) = delete;
  GemmExecutor& operator=(const GemmExecutor&) = delete;

  // Enqueues the call. A call without an epilogue always runs (through cublasGemmEx where cuBLASLt
  // offers no algorithm for its shape; one line on stderr the first time). A call with an epilogue
  // returns false, having enqueued nothing, when cuBLASLt offers no algorithm for it: the caller
  // then runs without_epilogue(call) and the epilogue's own kernels.
  bool run(const GemmCall& call);

  // Whether run() would take the fused path for this call (the heuristic is asked once per key).
  bool fuses(const GemmCall& call);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zinf::cuda
