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
//
// With ZINF_CUDNN_LOG_PLANS=1 in the environment each plan built says on stderr how long it took
// (one line per plan: the direction, the shape, milliseconds, the workspace it needs).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <string>

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

  // What the plan cache decided for one shape and dtype, and what ran since: for the tests and the GPU
  // check, which must tell a shape cuDNN ran both ways from one whose backward fell back.
  struct Route {
    bool planned = false;         // the shape was asked for (accepts / forward / backward)
    bool forward_cudnn = false;   // the forward runs cuDNN's plan (else the caller runs the wmma kernel)
    bool backward_cudnn = false;  // the backward runs cuDNN's plan (else the wmma kernel's backward)
    long forward_runs = 0, backward_runs = 0;  // cuDNN plans executed in each direction
    double forward_build_ms = 0, backward_build_ms = 0;  // heuristics, plan finalisation, any compile
    std::size_t forward_workspace = 0, backward_workspace = 0;  // each plan's own need, in bytes
    float mask_value = 0;  // what the masked scores are set to (mask_value below, by the cuDNN version)
    std::string refusal;   // why cuDNN refused (the forward, or the backward alone); empty if neither
  };
  Route route(const fast::AttnShape& a, DType S) const;
  // The device workspace held now: the largest need of the plans built so far (not the cap).
  std::size_t workspace_bytes() const;

  // The cuDNN version the library reports at run time (cudnnGetVersion: 91900 for 9.19.0).
  static std::size_t runtime_version();
  // Why zinf refuses the 16-bit forward (and so the backward too) at cuDNN `version`, as
  // cudnn-frontend refuses it (empty: zinf builds it): 9.10.0 and 9.10.1, and a sliding window
  // before 9.2.
  static std::string forward_refusal(std::size_t version, bool windowed);
  // Why zinf refuses the backward at cuDNN `version` and sequence length T, as cudnn-frontend refuses
  // or works around it (empty: zinf builds it): 9.10.0 and 9.10.1, up to 9.15.0 a T that is not a
  // multiple of 128, and T = 1.
  static std::string backward_refusal(std::size_t version, int T);
  // The value masked scores take: cudnn-frontend passes the lowest float before cuDNN 9.10.0 and −∞
  // from then on.
  static float mask_value(std::size_t version);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zinf::cuda
