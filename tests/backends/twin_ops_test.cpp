// twin_ops_test.cpp — the CPU device's twin of the fast kernels (device.kernels fast): the storage
// dtype it asks the model for, and the storage rule per op: 16-bit inputs widened exactly, the fp32
// reference op, each written 16-bit view rounded once (an accumulated output read, added to in fp32
// and rounded once), fp32 views untouched; an unsized 16-bit view is refused.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "../common/error_of.h"
#include "cpu/ops_attention_tiled.h"
#include "cpu/ops_gpt.h"
#include "cpu/twin_ops.h"
#include "zinf/backends/backend.h"
#include "zinf/backends/cpu.h"
#include "zinf/cpu_adam/spec.h"

namespace zinf {
namespace {

std::uint16_t narrow(float x, DType t) {
  return t == DType::bf16 ? cpu_adam::spec::fp32_to_bf16(x) : cpu_adam::spec::fp32_to_fp16(x);
}
float widen(std::uint16_t h, DType t) {
  return t == DType::bf16 ? cpu_adam::spec::bf16_to_fp32(h) : cpu_adam::spec::fp16_to_fp32(h);
}

// n values of dtype t, drawn from N(0, scale), and their exact fp32 values.
struct Half {
  std::vector<std::uint16_t> h;
  std::vector<float> f;
  DType t;
  Half(std::size_t n, DType type, std::uint32_t seed, float scale = 1.0f) : h(n), f(n), t(type) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, scale);
    for (std::size_t i = 0; i < n; ++i) h[i] = narrow(d(rng), t), f[i] = widen(h[i], t);
  }
  TensorView view() { return TensorView(h.data(), t, h.size()); }
  ConstTensorView cview() const { return ConstTensorView(h.data(), t, h.size()); }
};

// The 16-bit words the twin must write: the fp32 reference's result, rounded once.
std::vector<std::uint16_t> rounded(const std::vector<float>& f, DType t) {
  std::vector<std::uint16_t> h(f.size());
  for (std::size_t i = 0; i < f.size(); ++i) h[i] = narrow(f[i], t);
  return h;
}

TEST(TwinOps, StoresInTheRunsPrecisionUnderFastKernelsOnly) {
  const backends::Backend& be = backends::backend_for(DeviceType::cpu);
  backends::DeviceSpec spec;
  spec.budget_bytes = 1 << 20;
  auto dev = be.make_device(spec);
  EXPECT_EQ(be.make_ops(*dev, Precision::bf16, 1, Kernels::fast)->storage_dtype(), DType::bf16);
  EXPECT_EQ(be.make_ops(*dev, Precision::fp16, 1, Kernels::fast)->storage_dtype(), DType::fp16);
  EXPECT_EQ(be.make_ops(*dev, Precision::fp32, 1, Kernels::fast)->storage_dtype(), DType::fp32);
  EXPECT_EQ(be.make_ops(*dev, Precision::bf16, 1, Kernels::reference)->storage_dtype(), DType::fp32);
  EXPECT_EQ(be.make_ops(*dev, Precision::bf16, 1, Kernels::reference)->attention_state_elems(2, 3, 5), 2u * 3 * 5 * 5);
}

TEST(TwinOps, EachOutputIsTheFp32ReferenceOnWidenedInputsRoundedOnce) {
  ops::ChunkPool pool(1);
  for (DType t : {DType::bf16, DType::fp16}) {
    SCOPED_TRACE(std::string(to_string(t)));
    auto twin = cpu::make_twin_ops(t == DType::bf16 ? Precision::bf16 : Precision::fp16, 2);
    const int R = 5, IC = 24, OC = 16;
    // A GEMM with bias: out = round(inp·w + b).
    const Half inp(R * IC, t, 1), w(IC * OC, t, 2, 0.2f), b(OC, t, 3);
    Half out(R * OC, t, 4);
    twin->matmul_forward(out.view(), inp.cview(), w.cview(), b.cview(), R, IC, OC);
    std::vector<float> want(R * OC);
    ops::matmul_forward(pool, want.data(), inp.f.data(), w.f.data(), b.f.data(), R, IC, OC);
    EXPECT_EQ(out.h, rounded(want, t));
    // An accumulating output: acc = round(acc + x), in fp32, once.
    Half acc(R * OC, t, 5);
    const Half x(R * OC, t, 6, 1e-2f);
    std::vector<float> sum = acc.f;
    twin->add_inplace(acc.view(), x.cview(), sum.size());
    ops::add_inplace(pool, sum.data(), x.f.data(), sum.size());
    EXPECT_EQ(acc.h, rounded(sum, t));
    // fp32 outputs beside 16-bit ones (LayerNorm statistics) are the reference's, unrounded.
    Half ln(R * IC, t, 7);
    const Half lw(IC, t, 8), lb(IC, t, 9);
    std::vector<float> mean(R), rstd(R), want_ln(R * IC), want_mean(R), want_rstd(R);
    twin->layernorm_forward(ln.view(), TensorView(mean.data(), R), TensorView(rstd.data(), R), inp.cview(), lw.cview(),
                            lb.cview(), R, IC);
    ops::layernorm_forward(pool, want_ln.data(), want_mean.data(), want_rstd.data(), inp.f.data(), lw.f.data(),
                           lb.f.data(), R, IC);
    EXPECT_EQ(ln.h, rounded(want_ln, t));
    EXPECT_EQ(mean, want_mean);
    EXPECT_EQ(rstd, want_rstd);
    // An op with fp32 gradients and a 16-bit input gradient that accumulates.
    Half dinp(R * IC, t, 10);
    const Half dout(R * OC, t, 11);
    std::vector<float> dw(IC * OC, 0.5f), db(OC, 0.25f), want_dinp = dinp.f, want_dw = dw, want_db = db;
    twin->matmul_backward(dinp.view(), TensorView(dw.data(), dw.size()), TensorView(db.data(), db.size()), dout.cview(),
                          inp.cview(), w.cview(), R, IC, OC);
    ops::matmul_backward(pool, want_dinp.data(), want_dw.data(), want_db.data(), dout.f.data(), inp.f.data(),
                         w.f.data(), R, IC, OC);
    EXPECT_EQ(dinp.h, rounded(want_dinp, t));
    EXPECT_EQ(dw, want_dw);
    EXPECT_EQ(db, want_db);
  }
}

TEST(TwinOps, AnUnsizedSixteenBitViewIsRefusedNamingTheOpAndArgument) {
  auto twin = cpu::make_twin_ops(Precision::bf16, 1);
  Half in(8, DType::bf16, 1), out(8, DType::bf16, 2);
  const std::string e = test::error_of<Error>(
      [&] { twin->gelu_forward(out.view(), ConstTensorView(in.h.data(), DType::bf16, kUnsized), in.h.size()); });
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  EXPECT_NE(e.find("CPU twin op gelu_forward: argument 'inp' is an unsized bf16 view"), std::string::npos) << e;
  // Sized, the same call runs; unsized fp32 views pass as they are (the reference's raw pointers).
  twin->gelu_forward(out.view(), in.cview(), in.h.size());
  std::vector<float> a(8, 1.0f), b(8, 0.0f);
  twin->gelu_forward(TensorView(b.data()), ConstTensorView(a.data()), a.size());
  EXPECT_GT(b[0], 0.8f);
}

// The twin's attention is the tiled (flash-order) reference with the CUDA kernels' tiling, and its
// state is one log-sum-exp per row; its backward reads the forward's output as the forward stored it.
// That gives the same bits as computing the output again inside the backward (the same tiled forward
// on the same widened inputs, rounded once to S), which the backward did before the op list passed
// `out`: checked here against that recomputation, for both model families' layouts.
struct AttnCase {
  const char* name;
  ops::AttnShapeCpu a;
  std::size_t q_off, k_off, v_off;  // offsets into one input buffer (GPT packs q, k, v in each row)
  std::size_t in_elems, dq_elems;
};

TEST(TwinOps, AttentionBackwardWithTheStoredOutputIsTheRecomputedOnesBits) {
  const int B = 2, T = 37, H = 4, KV = 2, D = 16, C = H * D;
  const std::size_t R = static_cast<std::size_t>(B) * T;
  const long c3 = 3L * C, kvd = static_cast<long>(KV) * D;
  const AttnCase cases[] = {
      {"gpt", {B, T, H, H, D, c3, c3, c3, C}, 0, static_cast<std::size_t>(C), 2u * C, R * 3 * C, R * 3 * C},
      {"gqa", {B, T, H, KV, D, C, kvd, kvd, C}, 0, R * C, R * C + R * KV * D, R * C + 2 * R * KV * D, 0},
      {"gqa window 9", {B, T, H, KV, D, C, kvd, kvd, C, 9}, 0, R * C, R * C + R * KV * D, R * C + 2 * R * KV * D, 0}};
  for (Precision p : {Precision::bf16, Precision::fp16, Precision::fp32}) {
    const DType S = dtype_of(p);
    for (const AttnCase& ac : cases) {
      SCOPED_TRACE(std::string(to_string(S)) + " " + ac.name);
      const ops::AttnShapeCpu& a = ac.a;
      auto twin = cpu::make_twin_ops(p, 2);
      ASSERT_EQ(twin->attention_state_elems(B, H, T), static_cast<std::size_t>(B) * H * T);
      // Inputs as S holds them (fp32 runs: any floats), widened exactly.
      std::mt19937 rng(17);
      std::normal_distribution<float> nd(0.0f, 1.0f);
      auto as_s = [&](float x) { return S == DType::fp32 ? x : widen(narrow(x, S), S); };
      std::vector<float> in(ac.in_elems), dout(R * C);
      for (float& x : in) x = as_s(nd(rng));
      for (float& x : dout) x = as_s(nd(rng));
      auto view_of = [&](std::vector<float>& f, std::vector<std::uint16_t>& h) {
        if (S == DType::fp32) return TensorView(f.data(), f.size());
        h = rounded(f, S);
        return TensorView(h.data(), S, h.size());
      };
      std::vector<std::uint16_t> in_h, dout_h, out_h, dq_h, dk_h, dv_h;
      std::vector<float> out(R * C), lse(static_cast<std::size_t>(B) * H * T);
      const TensorView in_v = view_of(in, in_h), dout_v = view_of(dout, dout_h), out_v = view_of(out, out_h);
      auto part = [&](std::size_t off, std::size_t n) {  // a view into the input buffer
        return S == DType::fp32 ? ConstTensorView(in.data() + off, n) : ConstTensorView(in_h.data() + off, S, n);
      };
      // The twin: forward, then backward with the output the forward stored.
      const std::size_t q_n = R * C, kv_n = R * KV * D;
      std::vector<float> d1(ac.dq_elems ? ac.dq_elems : q_n), d2(kv_n), d3(kv_n);
      const TensorView g1 = view_of(d1, dq_h), g2 = view_of(d2, dk_h), g3 = view_of(d3, dv_h);
      if (ac.dq_elems) {
        twin->attention_forward(out_v, TensorView(lse.data(), lse.size()), in_v, B, T, C, H);
        twin->attention_backward(g1, dout_v, in_v, ConstTensorView(lse.data(), lse.size()), out_v, B, T, C, H);
      } else {
        twin->gqa_attention_forward(out_v, TensorView(lse.data(), lse.size()), part(0, q_n), part(ac.k_off, kv_n),
                                    part(ac.v_off, kv_n), B, T, H, KV, D, a.W);
        twin->gqa_attention_backward(g1, g2, g3, dout_v, part(0, q_n), part(ac.k_off, kv_n), part(ac.v_off, kv_n),
                                     ConstTensorView(lse.data(), lse.size()), out_v, B, T, H, KV, D, a.W);
      }
      // The recomputation: the tiled forward again (its output rounded to S as stored), then the backward.
      ops::ChunkPool pool(1);
      const ops::TiledAttention tl = ops::cuda_tiling(D, S);
      std::vector<float> rout(R * C), rlse(lse.size());
      const float *q = in.data() + ac.q_off, *k = in.data() + ac.k_off, *v = in.data() + ac.v_off;
      ops::tiled_attention_forward(pool, rout.data(), rlse.data(), q, k, v, a, tl);
      EXPECT_EQ(rlse, lse) << "the stored log-sum-exp";
      for (float& x : rout) x = as_s(x);
      std::vector<float> r1(d1.size()), r2(kv_n), r3(kv_n);
      float* rdq = r1.data();
      float* rdk = ac.dq_elems ? r1.data() + C : r2.data();
      float* rdv = ac.dq_elems ? r1.data() + 2L * C : r3.data();
      ops::tiled_attention_backward(pool, rdq, rdk, rdv, dout.data(), q, k, v, rout.data(), rlse.data(), a, tl);
      auto bits = [&](const std::vector<float>& f, const std::vector<std::uint16_t>& h) {
        return S == DType::fp32 ? f : [&] {
          std::vector<float> w(h.size());
          for (std::size_t i = 0; i < h.size(); ++i) w[i] = widen(h[i], S);
          return w;
        }();
      };
      auto as_stored = [&](std::vector<float> f) {
        for (float& x : f) x = as_s(x);
        return f;
      };
      EXPECT_EQ(bits(out, out_h), rout) << "the stored output";
      EXPECT_EQ(bits(d1, dq_h), as_stored(r1)) << (ac.dq_elems ? "dqkv" : "dq");
      if (!ac.dq_elems) {
        EXPECT_EQ(bits(d2, dk_h), as_stored(r2)) << "dk";
        EXPECT_EQ(bits(d3, dv_h), as_stored(r3)) << "dv";
      }
    }
  }
}

// The LM head rounds where the GPU's fast kernels store: the logits in the S probs buffer before
// the softmax reads them, dlogits in the S buffer before the two GEMMs read it (besides each
// written output, once). Checked against the reference's stages with those roundings, and against
// the plain staging, which would not round the logits (so the difference is visible).
TEST(TwinOps, TheLmHeadRoundsTheLogitsAndTheirGradientWhereTheGpuStoresThem) {
  ops::ChunkPool pool(1);
  const DType t = DType::bf16;
  auto twin = cpu::make_twin_ops(Precision::bf16, 2);
  const int R = 6, C = 32, V = 40;
  const Half x(R * C, t, 11), wte(V * C, t, 12, 0.3f);
  std::vector<int> targets(R);
  for (int r = 0; r < R; ++r) targets[r] = (7 * r + 3) % V;
  auto through = [t](std::vector<float> v) {
    for (float& e : v) e = widen(narrow(e, t), t);
    return v;
  };

  Half probs(R * V, t, 13);
  std::vector<float> losses(R);
  twin->lm_head_forward(probs.view(), TensorView(losses.data(), losses.size()), x.cview(), wte.cview(),
                        targets.data(), R, C, V);
  std::vector<float> want(R * V), want_losses(R);
  ops::lm_head_logits(pool, want.data(), x.f.data(), wte.f.data(), R, C, V);
  want = through(want);
  ops::softmax_crossentropy(pool, want.data(), want_losses.data(), targets.data(), R, V);
  EXPECT_EQ(probs.h, rounded(want, t));
  EXPECT_EQ(losses, want_losses);
  std::vector<float> plain(R * V), plain_losses(R);
  ops::lm_head_forward(pool, plain.data(), plain_losses.data(), x.f.data(), wte.f.data(), targets.data(), R, C, V);
  EXPECT_NE(losses, plain_losses);  // the rounded logits show in the fp32 losses

  std::vector<float> dwte(V * C, 0.0f), want_dwte(V * C, 0.0f);
  Half dx(R * C, t, 14), dlogits(R * V, t, 15);
  const float dscale = 0.25f;
  twin->lm_head_backward(dx.view(), TensorView(dwte.data(), dwte.size()), dlogits.view(), probs.cview(), x.cview(),
                         wte.cview(), targets.data(), dscale, R, C, V);
  std::vector<float> p16(R * V), dl(R * V), want_dx(R * C);
  for (std::size_t i = 0; i < p16.size(); ++i) p16[i] = widen(probs.h[i], t);
  ops::crossentropy_backward(pool, dl.data(), p16.data(), targets.data(), dscale, R, V);
  dl = through(dl);
  ops::lm_head_backward_gemms(pool, want_dx.data(), want_dwte.data(), dl.data(), x.f.data(), wte.f.data(), R, C, V);
  EXPECT_EQ(dlogits.h, rounded(dl, t));
  EXPECT_EQ(dx.h, rounded(want_dx, t));
  EXPECT_EQ(dwte, want_dwte);
}

}  // namespace
}  // namespace zinf
