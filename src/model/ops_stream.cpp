// ops_stream.cpp — see ops_stream.h.
#include "model/ops_stream.h"

#include <utility>

namespace zinf {
namespace {

class StreamOps final : public OpsBackend {
 public:
  StreamOps(Device& dev, std::unique_ptr<OpsBackend> inner) : dev_(dev), in_(std::move(inner)) {}
  ~StreamOps() override {
    try {
      dev_.synchronize(StreamRole::compute);  // nothing may still run on the wrapped backend
    } catch (...) {
    }
  }
  void matmul_forward(float* o, const float* i, const float* w, const float* b, int R, int IC, int OC) override {
    go([=, this] { in_->matmul_forward(o, i, w, b, R, IC, OC); });
  }
  void matmul_backward(float* di, float* dw, float* db, const float* dout, const float* i, const float* w, int R, int IC,
                       int OC) override {
    go([=, this] { in_->matmul_backward(di, dw, db, dout, i, w, R, IC, OC); });
  }
  void layernorm_forward(float* o, float* m, float* r, const float* i, const float* w, const float* b, int R, int C) override {
    go([=, this] { in_->layernorm_forward(o, m, r, i, w, b, R, C); });
  }
  void layernorm_backward(float* di, float* dw, float* db, const float* dout, const float* i, const float* w, const float* m,
                          const float* r, int R, int C) override {
    go([=, this] { in_->layernorm_backward(di, dw, db, dout, i, w, m, r, R, C); });
  }
  void gelu_forward(float* o, const float* i, std::size_t n) override { go([=, this] { in_->gelu_forward(o, i, n); }); }
  void gelu_backward(float* di, const float* i, const float* dout, std::size_t n) override {
    go([=, this] { in_->gelu_backward(di, i, dout, n); });
  }
  void add_inplace(float* acc, const float* x, std::size_t n) override { go([=, this] { in_->add_inplace(acc, x, n); }); }
  void attention_forward(float* o, float* att, const float* qkv, int B, int T, int C, int H) override {
    go([=, this] { in_->attention_forward(o, att, qkv, B, T, C, H); });
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C, int H) override {
    go([=, this] { in_->attention_backward(dqkv, dout, qkv, att, B, T, C, H); });
  }
  void encoder_forward(float* o, const int* t, const float* wte, const float* wpe, int B, int T, int C) override {
    go([=, this] { in_->encoder_forward(o, t, wte, wpe, B, T, C); });
  }
  void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* t, int B, int T, int C) override {
    go([=, this] { in_->encoder_backward(dwte, dwpe, dout, t, B, T, C); });
  }
  double lm_head_forward(float* probs, float* losses, const float* x, const float* wte, const int* tg, int R, int C, int V) override {
    auto loss = std::make_shared<double>(0);
    go([=, this] { *loss = in_->lm_head_forward(probs, losses, x, wte, tg, R, C, V); });
    dev_.synchronize(StreamRole::compute);  // the host reads the loss
    return *loss;
  }
  void lm_head_backward(float* dx, float* dwte, float* dl, const float* probs, const float* x, const float* wte, const int* tg,
                        float dscale, int R, int C, int V) override {
    go([=, this] { in_->lm_head_backward(dx, dwte, dl, probs, x, wte, tg, dscale, R, C, V); });
  }
  void copy(float* dst, const float* src, std::size_t n) override { go([=, this] { in_->copy(dst, src, n); }); }
  void zero(float* p, std::size_t n) override { go([=, this] { in_->zero(p, n); }); }

  bool has_llama_ops() const override { return in_->has_llama_ops(); }
  void rmsnorm_forward(float* o, float* rstd, const float* i, const float* w, int R, int C, float eps) override {
    go([=, this] { in_->rmsnorm_forward(o, rstd, i, w, R, C, eps); });
  }
  void rmsnorm_backward(float* di, float* dw, const float* dout, const float* i, const float* w, const float* rstd, int R, int C) override {
    go([=, this] { in_->rmsnorm_backward(di, dw, dout, i, w, rstd, R, C); });
  }
  void rope_apply(float* x, const float* co, const float* si, int R, int T, int heads, int D, bool backward) override {
    go([=, this] { in_->rope_apply(x, co, si, R, T, heads, D, backward); });
  }
  void swiglu_forward(float* o, const float* g, const float* u, std::size_t n) override {
    go([=, this] { in_->swiglu_forward(o, g, u, n); });
  }
  void swiglu_backward(float* dg, float* du, const float* dout, const float* g, const float* u, std::size_t n) override {
    go([=, this] { in_->swiglu_backward(dg, du, dout, g, u, n); });
  }
  void gqa_attention_forward(float* o, float* att, const float* q, const float* k, const float* v, int B, int T, int H, int KV,
                             int D) override {
    go([=, this] { in_->gqa_attention_forward(o, att, q, k, v, B, T, H, KV, D); });
  }
  void gqa_attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k, const float* v,
                              const float* att, int B, int T, int H, int KV, int D) override {
    go([=, this] { in_->gqa_attention_backward(dq, dk, dv, dout, q, k, v, att, B, T, H, KV, D); });
  }
  void embedding_forward(float* o, const int* t, const float* wte, int R, int C) override {
    go([=, this] { in_->embedding_forward(o, t, wte, R, C); });
  }
  void embedding_backward(float* dwte, const float* dout, const int* t, int R, int C) override {
    go([=, this] { in_->embedding_backward(dwte, dout, t, R, C); });
  }

 private:
  template <class F>
  void go(F&& f) {
    dev_.launch(StreamRole::compute, std::forward<F>(f));
  }
  Device& dev_;
  std::unique_ptr<OpsBackend> in_;
};

}  // namespace

std::unique_ptr<OpsBackend> make_stream_ops(Device& dev, std::unique_ptr<OpsBackend> inner) {
  return std::make_unique<StreamOps>(dev, std::move(inner));
}

}  // namespace zinf
