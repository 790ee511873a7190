// op_list.h — every op of the seam between the model and a device's kernels, written once.
//
// From these lists come the OpsBackend virtuals (model/backend.h), the CPU backend's calls into the
// reference ops (CpuOps, src/backends/cpu/cpu_ops.h), the fp32 adapter the CUDA backend derives from
// (Fp32Ops, backend.h), the forwarding wrapper under the stream and profiling wrappers
// (model/ops_forward.h) and the table-driven op test (tests/backends/ops_table_test.cpp).
//
// One entry:  X(name, info, (parameters), (arguments))
//   name        the op; the CPU reference is ops::name(ChunkPool&, arguments...) with views as fp32 pointers
//   info        an OpInfo expression over the parameters: what the profiler files the op under and
//               its floating-point work (see the *_info helpers below)
//   parameters  the virtual's parameter list: activations and weights as TensorView (written) or
//               ConstTensorView (read), token ids as const int*, then sizes and scalars
//   arguments   the same names, in order, to forward
// Every op returns void and runs in stream order on the device's compute stream.
//
// To add an op:
//   1. add its entry here (among GPT-2's ops or the Llama family's: both halves are one list, and every
//      backend implements every op of it);
//   2. write the CPU reference ops::name in src/backends/cpu/ops_gpt.cpp or ops_llama.cpp (declared in
//      ops_gpt.h / ops_llama.h), taking float pointers where the entry has views;
//   3. write the CUDA kernel (src/backends/cuda/ops/) and CudaOps::fp32_name (src/backends/cuda/cuda_ops.cu),
//      with the same float-pointer parameters, and CudaFastOps::name (src/backends/cuda/fast_ops.cu: the op
//      in 16-bit storage, or its error where the fast kernels refuse it);
//   4. give it a case in tests/backends/ops_table_test.cpp (the test does not compile without one), and
//      in tests/backends/fast_ops_twin_test.cpp, whose table the list generates too;
//   5. call it from the model.
// Nothing else changes: the wrappers forward every op of the list (docs/layout.md counts the files).
#pragma once

#include <cstddef>
#include <utility>

#include "model/tensor.h"

namespace zinf {

// A target id that marks a position as no target (a prompt token, padding): its row's loss is 0 and
// its logits get no gradient. Every lm_head_forward/lm_head_backward honours it.
constexpr int kIgnoreTarget = -1;

// What an op is, for the wrappers: the profiler's class and the work it counts.
enum class OpKind { gemm, attention, norm, elementwise, embedding, lm_head, copy };

struct OpInfo {
  OpKind kind = OpKind::copy;
  double flops = 0;     // multiply-adds count two; 0 for ops measured in bytes
  int in = 0, out = 0;  // a GEMM's input and output features (its class)
  bool backward = false;
};

// FLOPs: a GEMM of R rows is 2·R·IC·OC forward and twice that backward (input and weight
// gradients); causal attention as computed here (full T×T scores) is 4·B·T²·C forward and twice
// that backward; the LM head is a GEMM with V outputs.
constexpr OpInfo gemm_info(int R, int IC, int OC, bool bwd) {
  return {OpKind::gemm, (bwd ? 4.0 : 2.0) * R * static_cast<double>(IC) * OC, IC, OC, bwd};
}
constexpr OpInfo attention_info(int B, int T, int C, bool bwd) {
  return {OpKind::attention, (bwd ? 8.0 : 4.0) * B * static_cast<double>(T) * T * C, 0, 0, bwd};
}
constexpr OpInfo lm_head_info(int R, int C, int V, bool bwd) {
  OpInfo op = gemm_info(R, C, V, bwd);
  op.kind = OpKind::lm_head;
  return op;
}
// Decoding attention: Q rows, row i against pos + i + 1 keys, QK and PV for H heads of width D.
constexpr OpInfo decode_attention_info(int Q, int pos, int H, int D) {
  const double keys = static_cast<double>(Q) * pos + static_cast<double>(Q) * (Q + 1) / 2;
  return {OpKind::attention, 4.0 * keys * H * D, 0, 0, false};
}
constexpr OpInfo kind_info(OpKind k, bool bwd) { return {k, 0, 0, 0, bwd}; }

// Shapes and semantics are those of cpu/ops_gpt.h (GPT-2) and cpu/ops_llama.h (Llama).
#define ZINF_GPT_OPS(X)                                                                                              \
  X(matmul_forward, gemm_info(R, IC, OC, false),                                                                     \
    (TensorView out, ConstTensorView inp, ConstTensorView w, ConstTensorView bias, int R, int IC, int OC),           \
    (out, inp, w, bias, R, IC, OC))                                                                                  \
  /* pre = inp·W + bias (what GELU's backward reads), out = gelu(pre): the MLP's first GEMM, fused */               \
  X(matmul_gelu_forward, gemm_info(R, IC, OC, false),                                                                \
    (TensorView pre, TensorView out, ConstTensorView inp, ConstTensorView w, ConstTensorView bias, int R, int IC,    \
     int OC),                                                                                                        \
    (pre, out, inp, w, bias, R, IC, OC))                                                                             \
  X(matmul_backward, gemm_info(R, IC, OC, true),                                                                     \
    (TensorView dinp, TensorView dw, TensorView dbias, ConstTensorView dout, ConstTensorView inp, ConstTensorView w, \
     int R, int IC, int OC),                                                                                         \
    (dinp, dw, dbias, dout, inp, w, R, IC, OC))                                                                      \
  X(layernorm_forward, kind_info(OpKind::norm, false),                                                               \
    (TensorView out, TensorView mean, TensorView rstd, ConstTensorView inp, ConstTensorView w, ConstTensorView b,    \
     int R, int C),                                                                                                  \
    (out, mean, rstd, inp, w, b, R, C))                                                                              \
  X(layernorm_backward, kind_info(OpKind::norm, true),                                                               \
    (TensorView dinp, TensorView dw, TensorView db, ConstTensorView dout, ConstTensorView inp, ConstTensorView w,    \
     ConstTensorView mean, ConstTensorView rstd, int R, int C),                                                      \
    (dinp, dw, db, dout, inp, w, mean, rstd, R, C))                                                                  \
  X(gelu_forward, kind_info(OpKind::elementwise, false), (TensorView out, ConstTensorView inp, std::size_t n),       \
    (out, inp, n))                                                                                                   \
  X(gelu_backward, kind_info(OpKind::elementwise, true),                                                             \
    (TensorView dinp, ConstTensorView inp, ConstTensorView dout, std::size_t n), (dinp, inp, dout, n))               \
  X(add_inplace, kind_info(OpKind::elementwise, false), (TensorView acc, ConstTensorView x, std::size_t n),          \
    (acc, x, n))                                                                                                     \
  X(attention_forward, attention_info(B, T, C, false),                                                               \
    (TensorView out, TensorView att, ConstTensorView qkv, int B, int T, int C, int H), (out, att, qkv, B, T, C, H))  \
  /* out: the forward's output as attention_forward wrote it (a flash backward reads it; the reference does not) */  \
  X(attention_backward, attention_info(B, T, C, true),                                                               \
    (TensorView dqkv, ConstTensorView dout, ConstTensorView qkv, ConstTensorView att, ConstTensorView out, int B,    \
     int T, int C, int H),                                                                                           \
    (dqkv, dout, qkv, att, out, B, T, C, H))                                                                         \
  X(encoder_forward, kind_info(OpKind::embedding, false),                                                            \
    (TensorView out, const int* tokens, ConstTensorView wte, ConstTensorView wpe, int B, int T, int C),              \
    (out, tokens, wte, wpe, B, T, C))                                                                                \
  X(encoder_backward, kind_info(OpKind::embedding, true),                                                            \
    (TensorView dwte, TensorView dwpe, ConstTensorView dout, const int* tokens, int B, int T, int C),                \
    (dwte, dwpe, dout, tokens, B, T, C))                                                                             \
  /* losses: each row's loss (0 for kIgnoreTarget), in device memory; the host reads them at the step's end */       \
  X(lm_head_forward, lm_head_info(R, C, V, false),                                                                   \
    (TensorView probs, TensorView losses, ConstTensorView x, ConstTensorView wte, const int* targets, int R, int C,  \
     int V),                                                                                                         \
    (probs, losses, x, wte, targets, R, C, V))                                                                       \
  X(lm_head_backward, lm_head_info(R, C, V, true),                                                                   \
    (TensorView dx, TensorView dwte, TensorView dlogits, ConstTensorView probs, ConstTensorView x,                   \
     ConstTensorView wte, const int* targets, float dscale, int R, int C, int V),                                    \
    (dx, dwte, dlogits, probs, x, wte, targets, dscale, R, C, V))                                                    \
  /* dst = src and p = 0 over n elements of device memory */                                                         \
  X(copy, kind_info(OpKind::copy, false), (TensorView dst, ConstTensorView src, std::size_t n), (dst, src, n))       \
  X(zero, kind_info(OpKind::copy, false), (TensorView p, std::size_t n), (p, n))

#define ZINF_LLAMA_OPS(X)                                                                                              \
  X(rmsnorm_forward, kind_info(OpKind::norm, false),                                                                   \
    (TensorView out, TensorView rstd, ConstTensorView inp, ConstTensorView w, int R, int C, float eps),                \
    (out, rstd, inp, w, R, C, eps))                                                                                    \
  X(rmsnorm_backward, kind_info(OpKind::norm, true),                                                                   \
    (TensorView dinp, TensorView dw, ConstTensorView dout, ConstTensorView inp, ConstTensorView w,                     \
     ConstTensorView rstd, int R, int C),                                                                              \
    (dinp, dw, dout, inp, w, rstd, R, C))                                                                              \
  /* cos_t/sin_t: [T, D/2] tables in device memory */                                                                  \
  X(rope_apply, kind_info(OpKind::elementwise, backward),                                                              \
    (TensorView x, ConstTensorView cos_t, ConstTensorView sin_t, int R, int T, int heads, int D, bool backward),       \
    (x, cos_t, sin_t, R, T, heads, D, backward))                                                                       \
  X(swiglu_forward, kind_info(OpKind::elementwise, false),                                                             \
    (TensorView out, ConstTensorView gate, ConstTensorView up, std::size_t n), (out, gate, up, n))                     \
  X(swiglu_backward, kind_info(OpKind::elementwise, true),                                                             \
    (TensorView dgate, TensorView dup, ConstTensorView dout, ConstTensorView gate, ConstTensorView up, std::size_t n), \
    (dgate, dup, dout, gate, up, n))                                                                                   \
  /* W: the sliding window (0: none): query t attends key s iff s <= t and t - s < W */                                \
  X(gqa_attention_forward, attention_info(B, T, H* D, false),                                                          \
    (TensorView out, TensorView att, ConstTensorView q, ConstTensorView k, ConstTensorView v, int B, int T, int H,     \
     int KV, int D, int W),                                                                                            \
    (out, att, q, k, v, B, T, H, KV, D, W))                                                                            \
  /* out: the forward's output as gqa_attention_forward wrote it, as for attention_backward */                         \
  X(gqa_attention_backward, attention_info(B, T, H* D, true),                                                          \
    (TensorView dq, TensorView dk, TensorView dv, ConstTensorView dout, ConstTensorView q, ConstTensorView k,          \
     ConstTensorView v, ConstTensorView att, ConstTensorView out, int B, int T, int H, int KV, int D, int W),          \
    (dq, dk, dv, dout, q, k, v, att, out, B, T, H, KV, D, W))                                                          \
  /* token embedding without positions: out[r] = wte[tokens[r]]; backward dwte[tokens[r]] += dout[r] */                \
  X(embedding_forward, kind_info(OpKind::embedding, false),                                                            \
    (TensorView out, const int* tokens, ConstTensorView wte, int R, int C), (out, tokens, wte, R, C))                  \
  X(embedding_backward, kind_info(OpKind::embedding, true),                                                            \
    (TensorView dwte, ConstTensorView dout, const int* tokens, int R, int C), (dwte, dout, tokens, R, C))              \
  /* generation (model/generate.h), GPT-2 (KV = H) and Llama alike: Q query rows at positions pos..pos+Q-1 */          \
  /* against the cached keys/values of positions 0..pos+Q-1; row r of q (k, v) starts r·q_stride (kv_stride) in */    \
  X(attention_decode, decode_attention_info(Q, pos, H, D),                                                             \
    (TensorView out, ConstTensorView q, ConstTensorView k, ConstTensorView v, int Q, int pos, int H, int KV, int D,    \
     int q_stride, int kv_stride),                                                                                     \
    (out, q, k, v, Q, pos, H, KV, D, q_stride, kv_stride))                                                             \
  /* logits [R, V] = x [R, C] · wteᵀ: the LM head without softmax or loss (generation reads the last row's) */      \
  X(lm_head_logits, lm_head_info(R, C, V, false),                                                                      \
    (TensorView logits, ConstTensorView x, ConstTensorView wte, int R, int C, int V), (logits, x, wte, R, C, V))

// The one list: every backend implements every op of it (model/backend.h declares them all pure virtual).
#define ZINF_OPS(X) ZINF_GPT_OPS(X) ZINF_LLAMA_OPS(X)

// Helpers for expanding the lists: ZINF_OP_UNPAREN (a, b) is a, b.
#define ZINF_OP_UNPAREN(...) __VA_ARGS__

// Hands every argument of an op to f, views as fp32 pointers (checked: another type is a zinf::Error
// naming `backend`, the op and the argument) and the rest as they are. `names` is the entry's
// argument list as text, "(a, b, c)", for the error.
template <class F, class... A, std::size_t... I>
void call_fp32_at(const char* backend, const char* op, const char* names, F&& f, std::index_sequence<I...>,
                  const A&... a) {
  f(fp32_data(a, OpArgSite{backend, op, names, I})...);
}
template <class F, class... A>
void call_fp32(const char* backend, const char* op, const char* names, F&& f, const A&... a) {
  call_fp32_at(backend, op, names, std::forward<F>(f), std::index_sequence_for<A...>{}, a...);
}

}  // namespace zinf
