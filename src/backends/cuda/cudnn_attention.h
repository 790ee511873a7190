// cudnn_attention.h — causal attention of the fast kernels through cuDNN's fused flash attention: the
// forward (output and the per-row log-sum-exp) and the backward as two operation graphs of cuDNN's
// graph backend API (matmul, pointwise, reduction and reshape nodes in the form cudnn-frontend's SDPA
// nodes give cuDNN, which its fused flash-attention engines run as one kernel each), built once per
// shape and dtype and cached.
//
// Layouts are those of the wmma kernel (ops/flash_attention.cuh): rows of stride q/k/v/o_stride, GPT's
// packed qkv and Llama's separate q, k, v with grouped key/value heads, lse [B, H, T] fp32. 16-bit S
// only (fp16, bf16); fp32 runs keep the wmma path's FMA tiles.
//
// A shape cuDNN refuses while its plans are built (a NOT_SUPPORTED status: the graph, the GPU or every
// deterministic engine) is refused once, with one line on stderr naming the shape, and the caller runs
// the wmma kernel for it from then on; a shape whose backward alone is refused runs cuDNN's forward
// and the wmma kernel's backward (both keep the same log-sum-exp), also said once. Any failure after
// a plan exists (running it) throws zinf::Error.
// Only deterministic engines are chosen (no NONDETERMINISTIC numerical note), so two runs give the
// same bits. Built only where cuDNN was found (ZINF_HAVE_CUDNN); everything is enqueued on `stream`.
// Not thread-safe: one per ops backend, used from the thread that drives its stream.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <memory>

#include "cuda/cudnn_attention_version.h"
#include "cuda/ops/flash_attention.cuh"
#include "zinf/device.h"

namespace zinf::cuda {

class CudnnAttention {
 public:
  CudnnAttention(Device& dev, cudaStream_t stream);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // Whether cuDNN runs shape `a` in dtype S; builds (and caches) both plans on the first ask. False
  // (said once on stderr) when cuDNN refused the shape: the caller uses the wmma kernel.
  bool accepts(const fast::AttnShape& a, DType S);
  // Whether cuDNN also runs the backward of shape `a` (false: the wmma kernel's backward, from cuDNN's
  // forward output and log-sum-exp).
  bool accepts_backward(const fast::AttnShape& a, DType S);

  // Enqueue the forward of an accepted shape (accepts() true) / the backward of one whose backward is
  // accepted (accepts_backward() true). Throws zinf::Error when cuDNN fails to run a plan.
  void forward(void* out, float* lse, const void* q, const void* k, const void* v, const fast::AttnShape& a, DType S);
  void backward(void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k, const void* v,
                const void* out, const float* lse, const fast::AttnShape& a, DType S);

  // The device scratch cuDNN's attention takes for shape `a` beside its workspace: the backward's
  // softmax sums Δ = Σ_d dO ∘ O, B·H·T floats (a graph output, as the frontend's form has it).
  static std::size_t backward_scratch_bytes(const fast::AttnShape& a);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zinf::cuda
