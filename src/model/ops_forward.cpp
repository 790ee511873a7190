// ops_forward.cpp — see ops_forward.h. FLOPs: a GEMM of R rows is 2·R·IC·OC forward and twice that
// backward (input and weight gradients); causal attention as computed here (full T×T scores) is
// 4·B·T²·C forward and twice that backward; the LM head is a GEMM with V outputs.
#include "model/ops_forward.h"

#include <memory>
#include <utility>

namespace zinf {
namespace {

double d(int x) { return static_cast<double>(x); }
OpInfo gemm(int R, int IC, int OC, bool bwd) { return {OpKind::gemm, (bwd ? 4.0 : 2.0) * d(R) * d(IC) * d(OC), IC, OC, bwd}; }
OpInfo attention(int B, int T, int C, bool bwd) { return {OpKind::attention, (bwd ? 8.0 : 4.0) * d(B) * d(T) * d(T) * d(C), 0, 0, bwd}; }
OpInfo kind(OpKind k, bool bwd = false) { return {k, 0, 0, 0, bwd}; }

}  // namespace

void ForwardingOps::matmul_forward(float* o, const float* i, const float* w, const float* b, int R, int IC, int OC) {
  run(gemm(R, IC, OC, false), [=, this] { in_->matmul_forward(o, i, w, b, R, IC, OC); });
}
void ForwardingOps::matmul_backward(float* di, float* dw, float* db, const float* dout, const float* i, const float* w, int R, int IC,
                                    int OC) {
  run(gemm(R, IC, OC, true), [=, this] { in_->matmul_backward(di, dw, db, dout, i, w, R, IC, OC); });
}
void ForwardingOps::layernorm_forward(float* o, float* m, float* r, const float* i, const float* w, const float* b, int R, int C) {
  run(kind(OpKind::norm), [=, this] { in_->layernorm_forward(o, m, r, i, w, b, R, C); });
}
void ForwardingOps::layernorm_backward(float* di, float* dw, float* db, const float* dout, const float* i, const float* w,
                                       const float* m, const float* r, int R, int C) {
  run(kind(OpKind::norm, true), [=, this] { in_->layernorm_backward(di, dw, db, dout, i, w, m, r, R, C); });
}
void ForwardingOps::gelu_forward(float* o, const float* i, std::size_t n) {
  run(kind(OpKind::elementwise), [=, this] { in_->gelu_forward(o, i, n); });
}
void ForwardingOps::gelu_backward(float* di, const float* i, const float* dout, std::size_t n) {
  run(kind(OpKind::elementwise, true), [=, this] { in_->gelu_backward(di, i, dout, n); });
}
void ForwardingOps::add_inplace(float* acc, const float* x, std::size_t n) {
  run(kind(OpKind::elementwise), [=, this] { in_->add_inplace(acc, x, n); });
}
void ForwardingOps::attention_forward(float* o, float* att, const float* qkv, int B, int T, int C, int H) {
  run(attention(B, T, C, false), [=, this] { in_->attention_forward(o, att, qkv, B, T, C, H); });
}
void ForwardingOps::attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C, int H) {
  run(attention(B, T, C, true), [=, this] { in_->attention_backward(dqkv, dout, qkv, att, B, T, C, H); });
}
void ForwardingOps::encoder_forward(float* o, const int* t, const float* wte, const float* wpe, int B, int T, int C) {
  run(kind(OpKind::embedding), [=, this] { in_->encoder_forward(o, t, wte, wpe, B, T, C); });
}
void ForwardingOps::encoder_backward(float* dwte, float* dwpe, const float* dout, const int* t, int B, int T, int C) {
  run(kind(OpKind::embedding, true), [=, this] { in_->encoder_backward(dwte, dwpe, dout, t, B, T, C); });
}
void ForwardingOps::lm_head_forward(float* probs, float* losses, const float* x, const float* wte, const int* tg, int R, int C, int V) {
  OpInfo op = gemm(R, C, V, false);
  op.kind = OpKind::lm_head;
  run(op, [=, this] { in_->lm_head_forward(probs, losses, x, wte, tg, R, C, V); });
}
void ForwardingOps::lm_head_backward(float* dx, float* dwte, float* dl, const float* probs, const float* x, const float* wte, const int* tg,
                                     float dscale, int R, int C, int V) {
  OpInfo op = gemm(R, C, V, true);
  op.kind = OpKind::lm_head;
  run(op, [=, this] { in_->lm_head_backward(dx, dwte, dl, probs, x, wte, tg, dscale, R, C, V); });
}
void ForwardingOps::copy(float* dst, const float* src, std::size_t n) {
  run(kind(OpKind::copy), [=, this] { in_->copy(dst, src, n); });
}
void ForwardingOps::zero(float* p, std::size_t n) {
  run(kind(OpKind::copy), [=, this] { in_->zero(p, n); });
}
void ForwardingOps::rmsnorm_forward(float* o, float* rstd, const float* i, const float* w, int R, int C, float eps) {
  run(kind(OpKind::norm), [=, this] { in_->rmsnorm_forward(o, rstd, i, w, R, C, eps); });
}
void ForwardingOps::rmsnorm_backward(float* di, float* dw, const float* dout, const float* i, const float* w, const float* rstd, int R,
                                     int C) {
  run(kind(OpKind::norm, true), [=, this] { in_->rmsnorm_backward(di, dw, dout, i, w, rstd, R, C); });
}
void ForwardingOps::rope_apply(float* x, const float* co, const float* si, int R, int T, int heads, int D, bool backward) {
  run(kind(OpKind::elementwise, backward), [=, this] { in_->rope_apply(x, co, si, R, T, heads, D, backward); });
}
void ForwardingOps::swiglu_forward(float* o, const float* g, const float* u, std::size_t n) {
  run(kind(OpKind::elementwise), [=, this] { in_->swiglu_forward(o, g, u, n); });
}
void ForwardingOps::swiglu_backward(float* dg, float* du, const float* dout, const float* g, const float* u, std::size_t n) {
  run(kind(OpKind::elementwise, true), [=, this] { in_->swiglu_backward(dg, du, dout, g, u, n); });
}
void ForwardingOps::gqa_attention_forward(float* o, float* att, const float* q, const float* k, const float* v, int B, int T, int H,
                                          int KV, int D) {
  run(attention(B, T, H * D, false), [=, this] { in_->gqa_attention_forward(o, att, q, k, v, B, T, H, KV, D); });
}
void ForwardingOps::gqa_attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                                           const float* v, const float* att, int B, int T, int H, int KV, int D) {
  run(attention(B, T, H * D, true), [=, this] { in_->gqa_attention_backward(dq, dk, dv, dout, q, k, v, att, B, T, H, KV, D); });
}
void ForwardingOps::embedding_forward(float* o, const int* t, const float* wte, int R, int C) {
  run(kind(OpKind::embedding), [=, this] { in_->embedding_forward(o, t, wte, R, C); });
}
void ForwardingOps::embedding_backward(float* dwte, const float* dout, const int* t, int R, int C) {
  run(kind(OpKind::embedding, true), [=, this] { in_->embedding_backward(dwte, dout, t, R, C); });
}

}  // namespace zinf
