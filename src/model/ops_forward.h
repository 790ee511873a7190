// ops_forward.h — a backend that wraps another: every op of the wrapped backend is handed to run()
// as a closure, with what it is (its kind, its floating-point work, a GEMM's sizes). The stream
// wrapper (ops_stream.h) enqueues the closure on the compute stream; the profiler (ops_profile.h)
// times it. The math is always the wrapped backend's, so results are bit-identical to calling it.
#pragma once

#include <functional>
#include <memory>

#include "model/backend.h"

namespace zinf {

enum class OpKind { gemm, attention, norm, elementwise, embedding, lm_head, copy };

struct OpInfo {
  OpKind kind = OpKind::copy;
  double flops = 0;   // multiply-adds count two; 0 for ops measured in bytes
  int in = 0, out = 0;  // a GEMM's input and output features (its class)
  bool backward = false;
};

class ForwardingOps : public OpsBackend {
 public:
  explicit ForwardingOps(std::unique_ptr<OpsBackend> inner) : in_(std::move(inner)) {}

  void matmul_forward(float* o, const float* i, const float* w, const float* b, int R, int IC, int OC) override;
  void matmul_backward(float* di, float* dw, float* db, const float* dout, const float* i, const float* w, int R, int IC,
                       int OC) override;
  void layernorm_forward(float* o, float* m, float* r, const float* i, const float* w, const float* b, int R, int C) override;
  void layernorm_backward(float* di, float* dw, float* db, const float* dout, const float* i, const float* w, const float* m,
                          const float* r, int R, int C) override;
  void gelu_forward(float* o, const float* i, std::size_t n) override;
  void gelu_backward(float* di, const float* i, const float* dout, std::size_t n) override;
  void add_inplace(float* acc, const float* x, std::size_t n) override;
  void attention_forward(float* o, float* att, const float* qkv, int B, int T, int C, int H) override;
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C, int H) override;
  void encoder_forward(float* o, const int* t, const float* wte, const float* wpe, int B, int T, int C) override;
  void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* t, int B, int T, int C) override;
  void lm_head_forward(float* probs, float* losses, const float* x, const float* wte, const int* tg, int R, int C, int V) override;
  void lm_head_backward(float* dx, float* dwte, float* dl, const float* probs, const float* x, const float* wte, const int* tg,
                        float dscale, int R, int C, int V) override;
  void copy(float* dst, const float* src, std::size_t n) override;
  void zero(float* p, std::size_t n) override;

  bool has_llama_ops() const override { return in_->has_llama_ops(); }
  void rmsnorm_forward(float* o, float* rstd, const float* i, const float* w, int R, int C, float eps) override;
  void rmsnorm_backward(float* di, float* dw, const float* dout, const float* i, const float* w, const float* rstd, int R, int C) override;
  void rope_apply(float* x, const float* co, const float* si, int R, int T, int heads, int D, bool backward) override;
  void swiglu_forward(float* o, const float* g, const float* u, std::size_t n) override;
  void swiglu_backward(float* dg, float* du, const float* dout, const float* g, const float* u, std::size_t n) override;
  void gqa_attention_forward(float* o, float* att, const float* q, const float* k, const float* v, int B, int T, int H, int KV,
                             int D) override;
  void gqa_attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k, const float* v,
                              const float* att, int B, int T, int H, int KV, int D) override;
  void embedding_forward(float* o, const int* t, const float* wte, int R, int C) override;
  void embedding_backward(float* dwte, const float* dout, const int* t, int R, int C) override;

 protected:
  // Runs (or enqueues) one op of the wrapped backend.
  virtual void run(const OpInfo& op, std::function<void()> f) = 0;
  OpsBackend& inner() { return *in_; }

 private:
  std::unique_ptr<OpsBackend> in_;
};

}  // namespace zinf
