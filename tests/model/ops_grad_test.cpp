// ops_grad_test.cpp — each GPT op and the whole model on the CPU device, against a double-precision
// reference implementation that lives here: forward within 1e-4 relative; backward against central
// finite differences of the reference (objective J = Σ out·g for a random g) within 2e-3 relative
// (+1e-4 absolute) — float backward vs exact double derivatives.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "cpu/cpu_ops.h"
#include "cpu/ops_gpt.h"
#include "grad_check.h"
#include "model/gpt.h"
#include "model/host_math.h"
#include "common/random_floats.h"
#include "zinf/backends/cpu.h"
#include "zinf/device.h"

namespace zinf {
namespace {

using namespace test;

// ---- double-precision references ---------------------------------------------------------------
VD ref_layernorm(const VD& x, const VD& w, const VD& b, int R, int C) {
  VD o(x.size());
  for (int r = 0; r < R; ++r) {
    double m = 0, v = 0;
    for (int i = 0; i < C; ++i) m += x[static_cast<std::size_t>(r) * C + i];
    m /= C;
    for (int i = 0; i < C; ++i) v += std::pow(x[static_cast<std::size_t>(r) * C + i] - m, 2);
    v /= C;
    for (int i = 0; i < C; ++i)
      o[static_cast<std::size_t>(r) * C + i] =
          (x[static_cast<std::size_t>(r) * C + i] - m) / std::sqrt(v + 1e-5) * w[i] + b[i];
  }
  return o;
}
VD ref_gelu(const VD& x) {
  VD o(x.size());
  for (std::size_t i = 0; i < x.size(); ++i)
    o[i] = 0.5 * x[i] * (1 + std::tanh(std::sqrt(2 / M_PI) * (x[i] + 0.044715 * x[i] * x[i] * x[i])));
  return o;
}
VD ref_attention(const VD& qkv, int B, int T, int C, int H) {
  const int hs = C / H;
  VD o(static_cast<std::size_t>(B) * T * C, 0.0);
  auto at = [&](int b, int t, int part, int h, int i) {
    return qkv[(static_cast<std::size_t>(b) * T + t) * 3 * C + part * C + h * hs + i];
  };
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int t = 0; t < T; ++t) {
        VD a(static_cast<std::size_t>(t) + 1);
        double mx = -1e300;
        for (int s = 0; s <= t; ++s) {
          double d = 0;
          for (int i = 0; i < hs; ++i) d += at(b, t, 0, h, i) * at(b, s, 1, h, i);
          a[static_cast<std::size_t>(s)] = d / std::sqrt(static_cast<double>(hs));
          mx = std::max(mx, a[static_cast<std::size_t>(s)]);
        }
        double sum = 0;
        for (auto& x : a) sum += (x = std::exp(x - mx));
        for (int s = 0; s <= t; ++s)
          for (int i = 0; i < hs; ++i)
            o[(static_cast<std::size_t>(b) * T + t) * C + h * hs + i] +=
                a[static_cast<std::size_t>(s)] / sum * at(b, s, 2, h, i);
      }
  return o;
}
// The whole GPT-2 in double, on the same unit layout as the model.
double ref_model_loss(const std::vector<VD>& u, const ModelShape& s, int B, const std::vector<int>& tok,
                      const std::vector<int>& tg) {
  const int C = s.d_model, V = s.vocab_size, T = s.seq_len, R = B * T, L = s.n_layer;
  const std::size_t c = static_cast<std::size_t>(C);
  VD x(static_cast<std::size_t>(R) * C);
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < C; ++i)
      x[static_cast<std::size_t>(r) * C + i] =
          u[0][static_cast<std::size_t>(tok[static_cast<std::size_t>(r)]) * C + i] +
          u[0][static_cast<std::size_t>(V) * C + static_cast<std::size_t>(r % T) * C + i];
  for (int l = 0; l < L; ++l) {
    UnitReader unit(u[static_cast<std::size_t>(l) + 1]);
    VD ln1w = unit.take(c), ln1b = unit.take(c), qkvw = unit.take(c * 3 * c), qkvb = unit.take(3 * c),
       projw = unit.take(c * c), projb = unit.take(c), ln2w = unit.take(c), ln2b = unit.take(c),
       fcw = unit.take(c * 4 * c), fcb = unit.take(4 * c), fpw = unit.take(4 * c * c), fpb = unit.take(c);
    VD a = ref_matmul(
        ref_attention(ref_matmul(ref_layernorm(x, ln1w, ln1b, R, C), qkvw, qkvb, R, C, 3 * C), B, T, C, s.n_head),
        projw, projb, R, C, C);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += a[i];
    VD m = ref_matmul(ref_gelu(ref_matmul(ref_layernorm(x, ln2w, ln2b, R, C), fcw, fcb, R, C, 4 * C)), fpw, fpb, R,
                      4 * C, C);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += m[i];
  }
  const VD& f = u[static_cast<std::size_t>(L) + 1];
  VD lnf = ref_layernorm(x, VD(f.begin(), f.begin() + C), VD(f.begin() + C, f.end()), R, C);
  return ref_lm_loss(lnf, u[0], tg, R, C, V);
}

ops::ChunkPool& par() {
  static ops::ChunkPool p(2);
  return p;
}

TEST(OpsGrad, Matmul) {
  const int R = 70, IC = 9, OC = 67;  // R and OC cross the 64-row/column chunk boundaries
  VF x = randf(static_cast<std::size_t>(R) * IC, 1), w = randf(static_cast<std::size_t>(IC) * OC, 2), b = randf(OC, 3),
     g = randf(static_cast<std::size_t>(R) * OC, 4);
  VF out(static_cast<std::size_t>(R) * OC);
  ops::matmul_forward(par(), out.data(), x.data(), w.data(), b.data(), R, IC, OC);
  VD xd = to_d(x), wd = to_d(w), bd = to_d(b);
  expect_close("matmul out", out, ref_matmul(xd, wd, bd, R, IC, OC));
  VF dx(x.size(), 0), dw(w.size(), 0), db(b.size(), 0);
  ops::matmul_backward(par(), dx.data(), dw.data(), db.data(), g.data(), x.data(), w.data(), R, IC, OC);
  auto J = [&] { return dot(ref_matmul(xd, wd, bd, R, IC, OC), g); };
  check_grad("matmul dx", dx, xd, J);
  check_grad("matmul dw", dw, wd, J);
  check_grad("matmul db", db, bd, J);
}

TEST(OpsGrad, LayerNorm) {
  const int R = 67, C = 13;
  VF x = randf(static_cast<std::size_t>(R) * C, 5), w = randf(C, 6), b = randf(C, 7), g = randf(x.size(), 8);
  VF out(x.size()), mean(R), rstd(R);
  ops::layernorm_forward(par(), out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), R, C);
  VD xd = to_d(x), wd = to_d(w), bd = to_d(b);
  expect_close("layernorm out", out, ref_layernorm(xd, wd, bd, R, C));
  VF dx(x.size(), 0), dw(C, 0), db(C, 0);
  ops::layernorm_backward(par(), dx.data(), dw.data(), db.data(), g.data(), x.data(), w.data(), mean.data(),
                          rstd.data(), R, C);
  auto J = [&] { return dot(ref_layernorm(xd, wd, bd, R, C), g); };
  check_grad("layernorm dx", dx, xd, J);
  check_grad("layernorm dw", dw, wd, J);
  check_grad("layernorm db", db, bd, J);
}

TEST(OpsGrad, Gelu) {
  VF x = randf(3000, 9, 2.0f), g = randf(3000, 10), out(3000), dx(3000);
  ops::gelu_forward(par(), out.data(), x.data(), x.size());
  VD xd = to_d(x);
  expect_close("gelu out", out, ref_gelu(xd));
  ops::gelu_backward(par(), dx.data(), x.data(), g.data(), x.size());
  check_grad("gelu dx", dx, xd, [&] { return dot(ref_gelu(xd), g); });
}

TEST(OpsGrad, Attention) {
  const int B = 2, T = 7, C = 12, H = 3;
  VF qkv = randf(static_cast<std::size_t>(B) * T * 3 * C, 11), g = randf(static_cast<std::size_t>(B) * T * C, 12);
  VF out(static_cast<std::size_t>(B) * T * C), att(static_cast<std::size_t>(B) * H * T * T), dqkv(qkv.size());
  ops::attention_forward(par(), out.data(), att.data(), qkv.data(), B, T, C, H);
  VD qd = to_d(qkv);
  expect_close("attention out", out, ref_attention(qd, B, T, C, H));
  ops::attention_backward(par(), dqkv.data(), g.data(), qkv.data(), att.data(), out.data(), B, T, C, H);
  check_grad("attention dqkv", dqkv, qd, [&] { return dot(ref_attention(qd, B, T, C, H), g); });
}

TEST(OpsGrad, EncoderAndLmHead) {
  const int B = 2, T = 5, C = 6, V = 11, R = B * T;
  std::vector<int> tok = {1, 3, 3, 0, 10, 3, 7, 1, 1, 2}, tg = {3, 3, 0, 10, 3, 7, 1, 1, 2, 5};
  VF wte = randf(static_cast<std::size_t>(V) * C, 13), wpe = randf(static_cast<std::size_t>(T) * C, 14),
     g = randf(static_cast<std::size_t>(R) * C, 15);
  VF out(static_cast<std::size_t>(R) * C), dwte(wte.size(), 0), dwpe(wpe.size(), 0);
  ops::encoder_forward(par(), out.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
  ops::encoder_backward(par(), dwte.data(), dwpe.data(), g.data(), tok.data(), B, T, C);
  VD ed = to_d(wte), pd = to_d(wpe);
  auto enc = [&] {
    VD o(static_cast<std::size_t>(R) * C);
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < C; ++i)
        o[static_cast<std::size_t>(r) * C + i] =
            ed[static_cast<std::size_t>(tok[static_cast<std::size_t>(r)]) * C + i] +
            pd[static_cast<std::size_t>(r % T) * C + i];
    return o;
  };
  expect_close("encoder out", out, enc());
  check_grad("encoder dwte", dwte, ed, [&] { return dot(enc(), g); });
  check_grad("encoder dwpe", dwpe, pd, [&] { return dot(enc(), g); });

  VF x = randf(static_cast<std::size_t>(R) * C, 16), probs(static_cast<std::size_t>(R) * V), losses(R),
     dlog(probs.size()), dx(x.size());
  VF dwte2(wte.size(), 0);
  ops::lm_head_forward(par(), probs.data(), losses.data(), x.data(), wte.data(), tg.data(), R, C, V);
  const double loss = ops::mean_loss(losses.data(), R);
  VD xd = to_d(x);
  EXPECT_NEAR(loss, ref_lm_loss(xd, ed, tg, R, C, V), 1e-5);
  ops::lm_head_backward(par(), dx.data(), dwte2.data(), dlog.data(), probs.data(), x.data(), wte.data(), tg.data(),
                        1.0f / R, R, C, V);
  check_grad("lm_head dx", dx, xd, [&] { return ref_lm_loss(xd, ed, tg, R, C, V); });
  check_grad("lm_head dwte", dwte2, ed, [&] { return ref_lm_loss(xd, ed, tg, R, C, V); });
}

TEST(OpsGrad, WholeModelAgainstDoubleReference) {
  const ModelShape s{2, 2, 8, 16, 6};
  const int B = 2, R = B * s.seq_len;
  auto dev = make_cpu_device(64 << 20);
  for (bool ckpt : {false, true}) {
    SCOPED_TRACE(ckpt ? "checkpointing" : "plain");
    CpuOps backend(par());
    GptModel model(s, B, ckpt, *dev, backend);
    std::mt19937 rng(3);
    std::vector<int> tok(static_cast<std::size_t>(R)), tg(static_cast<std::size_t>(R));
    for (auto& t : tok) t = static_cast<int>(rng() % 16);
    for (auto& t : tg) t = static_cast<int>(rng() % 16);
    check_whole_model(model, s, B, 100, 0.3f, tok, tg,
                      [&](const std::vector<VD>& ud) { return ref_model_loss(ud, s, B, tok, tg); });
  }
}

}  // namespace
}  // namespace zinf
