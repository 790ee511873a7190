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

}  // namespace
}  // namespace zinf
