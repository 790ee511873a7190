// ops_gpt.h — the GPT model's reference operations (the CPU backend), forward and backward, in fp32.
//
// These are the reference implementations the CUDA kernels are checked against, so they are
// written for clarity and for one property above speed: every result is independent of the thread
// count. Work is split into fixed chunks (never by thread), each chunk is computed by one thread in a
// fixed order, and every reduction across rows (weight and bias gradients) is split by *columns* so
// that each output element is summed by one thread, rows in order. The numbers do not depend on the
// CPU either: the GEMMs sum every element in k order whatever the cache sizes or vector width (a
// tuned BLAS would not), exp/log/tanh come from model/fixed_math.h rather than glibc (which picks a
// variant per CPU), and nothing is fused into FMAs (-ffp-contract=off).
//
// Shapes: B batch, T sequence, C channels, H heads, V vocab, R = B·T rows; IC/OC in/out channels.
// Matrices are row-major; weights are [IC, OC] (GPT-2's Conv1D layout): out = inp · W + bias.
// "+=" in a comment means the op accumulates into that output.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

namespace zinf::ops {

// Fixed-chunk parallelism in a oneTBB arena of `threads` threads.
class ChunkPool {
 public:
  explicit ChunkPool(int threads);
  ~ChunkPool();
  int threads() const { return threads_; }
  // Runs fn(i) for i in [0, n); any thread may run any i.
  void chunks(std::size_t n, const std::function<void(std::size_t)>& fn);

 private:
  struct Impl;
  int threads_;
  std::unique_ptr<Impl> impl_;
};

constexpr int kRowChunk = 64;  // rows per chunk (GEMM, LayerNorm, GELU)
constexpr int kColChunk = 64;  // columns per chunk (weight/bias gradients)

void matmul_forward(ChunkPool& p, float* out, const float* inp, const float* w, const float* bias, int R, int IC,
                    int OC);
// pre = inp·W + bias, out = gelu(pre): matmul_forward then gelu_forward (the fused op's reference)
void matmul_gelu_forward(ChunkPool& p, float* pre, float* out, const float* inp, const float* w, const float* bias,
                         int R, int IC, int OC);
// dinp += dout·Wᵀ (skipped when null); dw += inpᵀ·dout; dbias += Σ_rows dout (skipped when null)
void matmul_backward(ChunkPool& p, float* dinp, float* dw, float* dbias, const float* dout, const float* inp,
                     const float* w, int R, int IC, int OC);

void layernorm_forward(ChunkPool& p, float* out, float* mean, float* rstd, const float* inp, const float* w,
                       const float* b, int R, int C);
// dinp += …; dw += …; db += …
void layernorm_backward(ChunkPool& p, float* dinp, float* dw, float* db, const float* dout, const float* inp,
                        const float* w, const float* mean, const float* rstd, int R, int C);

void gelu_forward(ChunkPool& p, float* out, const float* inp, std::size_t n);
void gelu_backward(ChunkPool& p, float* dinp, const float* inp, const float* dout, std::size_t n);  // dinp = …

void residual_forward(ChunkPool& p, float* out, const float* a, const float* b, std::size_t n);
void add_inplace(ChunkPool& p, float* acc, const float* x, std::size_t n);  // acc += x

// qkv [B,T,3C] → out [B,T,C]; att [B,H,T,T] keeps the softmax for backward (causal, scale 1/√(C/H)).
void attention_forward(ChunkPool& p, float* out, float* att, const float* qkv, int B, int T, int C, int H);
// dqkv = … (overwritten). `out` (the forward's output) is taken for the op list's sake and not read:
// the probabilities in att give the gradient without it, so this reference recomputes nothing.
void attention_backward(ChunkPool& p, float* dqkv, const float* dout, const float* qkv, const float* att,
                        const float* out, int B, int T, int C, int H);

void encoder_forward(ChunkPool& p, float* out, const int* tokens, const float* wte, const float* wpe, int B, int T,
                     int C);
// dwte += …; dwpe += …
void encoder_backward(ChunkPool& p, float* dwte, float* dwpe, const float* dout, const int* tokens, int B, int T,
                      int C);

// LM head tied to wte with softmax cross-entropy. probs [R,V] is kept for backward; losses [R], each
// row's loss (read by the host at the step's end, not here: no round trip inside the forward). A row
// whose target is kIgnoreTarget (-1, model/op_list.h) has loss 0 and a zero gradient row.
void lm_head_forward(ChunkPool& p, float* probs, float* losses, const float* x, const float* wte, const int* targets,
                     int R, int C, int V);
// dlogits = (probs − onehot)·dscale;  dx = dlogits·wte (overwritten);  dwte += dlogitsᵀ·x
void lm_head_backward(ChunkPool& p, float* dx, float* dwte, float* dlogits, const float* probs, const float* x,
                      const float* wte, const int* targets, float dscale, int R, int C, int V);
// The two stages of each, as the CUDA fast kernels run them (and the CPU twin rounds between them):
// logits = x·wteᵀ;  probs = softmax(logits) in place, losses[r] = −log probs[r, target]
void lm_head_logits(ChunkPool& p, float* logits, const float* x, const float* wte, int R, int C, int V);
void softmax_crossentropy(ChunkPool& p, float* probs, float* losses, const int* targets, int R, int V);
// dlogits = (probs − onehot)·dscale;  dx = dlogits·wte (overwritten), dwte += dlogitsᵀ·x
void crossentropy_backward(ChunkPool& p, float* dlogits, const float* probs, const int* targets, float dscale, int R,
                           int V);
void lm_head_backward_gemms(ChunkPool& p, float* dx, float* dwte, const float* dlogits, const float* x,
                            const float* wte, int R, int C, int V);

// dst = src and p = 0 over n elements (plain memory copies: nothing to split).
void copy(ChunkPool& p, float* dst, const float* src, std::size_t n);
void zero(ChunkPool& p, float* x, std::size_t n);

}  // namespace zinf::ops
