// backend.h — the seam between the model and a device's kernels: every GPT op of ops.h and Llama op
// of ops_llama.h, plus the copies and fills the model does on device memory, behind one interface. CpuOps runs the reference
// ops of ops_cpu.cpp; the CUDA backend (model/cuda/) implements the same calls as kernels on the compute
// stream. Shapes and semantics are those of ops.h.
#pragma once

#include <cstddef>

#include "model/ops.h"
#include "model/ops_llama.h"

namespace zinf {

class OpsBackend {
 public:
  virtual ~OpsBackend() = default;
  virtual void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int R, int IC, int OC) = 0;
  virtual void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w, int R,
                               int IC, int OC) = 0;
  virtual void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b, int R,
                                 int C) = 0;
  virtual void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                                  const float* mean, const float* rstd, int R, int C) = 0;
  virtual void gelu_forward(float* out, const float* inp, std::size_t n) = 0;
  virtual void gelu_backward(float* dinp, const float* inp, const float* dout, std::size_t n) = 0;
  virtual void add_inplace(float* acc, const float* x, std::size_t n) = 0;
  virtual void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int H) = 0;
  virtual void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C,
                                  int H) = 0;
  virtual void encoder_forward(float* out, const int* tokens, const float* wte, const float* wpe, int B, int T, int C) = 0;
  virtual void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* tokens, int B, int T, int C) = 0;
  // Writes each row's loss into `losses` (device memory); see ops::lm_head_forward.
  virtual void lm_head_forward(float* probs, float* losses, const float* x, const float* wte, const int* targets, int R, int C,
                               int V) = 0;
  virtual void lm_head_backward(float* dx, float* dwte, float* dlogits, const float* probs, const float* x, const float* wte,
                                const int* targets, float dscale, int R, int C, int V) = 0;
  virtual void copy(float* dst, const float* src, std::size_t n) = 0;
  virtual void zero(float* p, std::size_t n) = 0;

  // ---- the llama family (ops_llama.h); a backend without them says so ------------------------------
  virtual bool has_llama_ops() const { return false; }
  virtual void rmsnorm_forward(float*, float*, const float*, const float*, int, int, float) { no_llama(); }
  virtual void rmsnorm_backward(float*, float*, const float*, const float*, const float*, const float*, int, int) { no_llama(); }
  // cos_t/sin_t: [T, D/2] tables in device memory.
  virtual void rope_apply(float*, const float*, const float*, int, int, int, int, bool) { no_llama(); }
  virtual void swiglu_forward(float*, const float*, const float*, std::size_t) { no_llama(); }
  virtual void swiglu_backward(float*, float*, const float*, const float*, const float*, std::size_t) { no_llama(); }
  virtual void gqa_attention_forward(float*, float*, const float*, const float*, const float*, int, int, int, int, int) { no_llama(); }
  virtual void gqa_attention_backward(float*, float*, float*, const float*, const float*, const float*, const float*, const float*, int,
                                      int, int, int, int) {
    no_llama();
  }
  // Token embedding without positions: out[r] = wte[tokens[r]]; backward dwte[tokens[r]] += dout[r].
  virtual void embedding_forward(float*, const int*, const float*, int, int) { no_llama(); }
  virtual void embedding_backward(float*, const float*, const int*, int, int) { no_llama(); }

  [[noreturn]] static void no_llama();  // the ConfigError a backend without llama kernels raises
};

// The CPU device's backend: the reference ops, parallel over fixed chunks.
class CpuOps : public OpsBackend {
 public:
  explicit CpuOps(ops::Par& par) : p_(par) {}
  void matmul_forward(float* o, const float* i, const float* w, const float* b, int R, int IC, int OC) override {
    ops::matmul_forward(p_, o, i, w, b, R, IC, OC);
  }
  void matmul_backward(float* di, float* dw, float* db, const float* dout, const float* i, const float* w, int R, int IC,
                       int OC) override {
    ops::matmul_backward(p_, di, dw, db, dout, i, w, R, IC, OC);
  }
  void layernorm_forward(float* o, float* m, float* r, const float* i, const float* w, const float* b, int R, int C) override {
    ops::layernorm_forward(p_, o, m, r, i, w, b, R, C);
  }
  void layernorm_backward(float* di, float* dw, float* db, const float* dout, const float* i, const float* w, const float* m,
                          const float* r, int R, int C) override {
    ops::layernorm_backward(p_, di, dw, db, dout, i, w, m, r, R, C);
  }
  void gelu_forward(float* o, const float* i, std::size_t n) override { ops::gelu_forward(p_, o, i, n); }
  void gelu_backward(float* di, const float* i, const float* dout, std::size_t n) override { ops::gelu_backward(p_, di, i, dout, n); }
  void add_inplace(float* acc, const float* x, std::size_t n) override { ops::add_inplace(p_, acc, x, n); }
  void attention_forward(float* o, float* att, const float* qkv, int B, int T, int C, int H) override {
    ops::attention_forward(p_, o, att, qkv, B, T, C, H);
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C, int H) override {
    ops::attention_backward(p_, dqkv, dout, qkv, att, B, T, C, H);
  }
  void encoder_forward(float* o, const int* t, const float* wte, const float* wpe, int B, int T, int C) override {
    ops::encoder_forward(p_, o, t, wte, wpe, B, T, C);
  }
  void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* t, int B, int T, int C) override {
    ops::encoder_backward(p_, dwte, dwpe, dout, t, B, T, C);
  }
  void lm_head_forward(float* probs, float* losses, const float* x, const float* wte, const int* tg, int R, int C, int V) override {
    ops::lm_head_forward(p_, probs, losses, x, wte, tg, R, C, V);
  }
  void lm_head_backward(float* dx, float* dwte, float* dl, const float* probs, const float* x, const float* wte, const int* tg,
                        float dscale, int R, int C, int V) override {
    ops::lm_head_backward(p_, dx, dwte, dl, probs, x, wte, tg, dscale, R, C, V);
  }
  void copy(float* dst, const float* src, std::size_t n) override;
  void zero(float* p, std::size_t n) override;

  bool has_llama_ops() const override { return true; }
  void rmsnorm_forward(float* o, float* rstd, const float* i, const float* w, int R, int C, float eps) override {
    ops::rmsnorm_forward(p_, o, rstd, i, w, R, C, eps);
  }
  void rmsnorm_backward(float* di, float* dw, const float* dout, const float* i, const float* w, const float* rstd, int R, int C) override {
    ops::rmsnorm_backward(p_, di, dw, dout, i, w, rstd, R, C);
  }
  void rope_apply(float* x, const float* co, const float* si, int R, int T, int heads, int D, bool backward) override {
    ops::rope_apply(p_, x, co, si, R, T, heads, D, backward);
  }
  void swiglu_forward(float* o, const float* g, const float* u, std::size_t n) override { ops::swiglu_forward(p_, o, g, u, n); }
  void swiglu_backward(float* dg, float* du, const float* dout, const float* g, const float* u, std::size_t n) override {
    ops::swiglu_backward(p_, dg, du, dout, g, u, n);
  }
  void gqa_attention_forward(float* o, float* att, const float* q, const float* k, const float* v, int B, int T, int H, int KV,
                             int D) override {
    ops::gqa_attention_forward(p_, o, att, q, k, v, B, T, H, KV, D);
  }
  void gqa_attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k, const float* v,
                              const float* att, int B, int T, int H, int KV, int D) override {
    ops::gqa_attention_backward(p_, dq, dk, dv, dout, q, k, v, att, B, T, H, KV, D);
  }
  void embedding_forward(float* o, const int* t, const float* wte, int R, int C) override { ops::embedding_forward(p_, o, t, wte, R, C); }
  void embedding_backward(float* dwte, const float* dout, const int* t, int R, int C) override {
    ops::embedding_backward(p_, dwte, dout, t, R, C);
  }

 private:
  ops::Par& p_;
};

}  // namespace zinf
