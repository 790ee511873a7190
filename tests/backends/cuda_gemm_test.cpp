// cuda_gemm_test.cpp — the cuBLASLt executor (src/backends/cuda/gemm.h) against the host reference of
// gemm_reference.h, on the plans of the model's ops (gemm_plan.h): fp32 and bf16 operands, fp32 and
// 16-bit outputs, the bias, GELU_AUX_BIAS and bias-gradient epilogues, and the separate path where
// cuBLASLt offers no fused algorithm (a GELU aux leading dimension not a multiple of 8). Tolerances:
// fp32 outputs 1e-4 relative + 1e-5 absolute (another summation order); 16-bit outputs one unit in
// the last place of their type + 1e-3 absolute (an fp32 sum that differs in its last bits may round
// the other way); the fused GELU's output also gets the slack of gelu_epilogue_slack below.
// Skips with the reason without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/random_floats.h"
#include "cuda/cuda.h"
#include "cuda/gemm.h"
#include "cuda/gemm_plan.h"
#include "gemm_reference.h"
#include "zinf/backends/gpu.h"
#include "zinf/device.h"

namespace zinf::cuda {
namespace {

// One tensor on both sides: host bytes for the reference, a device copy for the executor.
struct Buf {
  DType t = DType::fp32;
  std::size_t n = 0;
  std::vector<unsigned char> h;
  DeviceBuffer d;
  void* hp() { return h.data(); }
  void* dp() { return d.as<void>(); }
};

class Gpu {
 public:
  std::unique_ptr<Device> dev;
  std::vector<std::unique_ptr<Buf>> bufs;

  Buf& make(DType t, const std::vector<float>& v) {
    auto b = std::make_unique<Buf>();
    b->t = t;
    b->n = v.size();
    b->h.resize(v.size() * dtype_bytes(t));
    for (std::size_t i = 0; i < v.size(); ++i) gemm_ref::store(t, b->h.data(), i, v[i]);
    b->d = DeviceBuffer(*dev, b->h.size(), "gemm test");
    dev->copy_to_device(b->dp(), b->hp(), b->h.size(), StreamRole::compute);
    bufs.push_back(std::move(b));
    return *bufs.back();
  }
  std::vector<float> device_values(Buf& b) {
    std::vector<unsigned char> raw(b.h.size());
    dev->copy_to_host(raw.data(), b.dp(), raw.size(), StreamRole::compute);
    dev->synchronize(StreamRole::compute);
    return widen(b.t, raw.data(), b.n);
  }
  static std::vector<float> widen(DType t, const void* p, std::size_t n) {
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = gemm_ref::load(t, p, i);
    return v;
  }
};

double rel_tolerance(DType t) { return t == DType::fp32 ? 1e-4 : t == DType::bf16 ? 1.0 / 128 : 1.0 / 1024; }
double abs_tolerance(DType t) { return t == DType::fp32 ? 1e-5 : 1e-3; }

// The GELU_AUX(_BIAS) epilogue computes GELU(x) = ½·x·(1 + tanh u) with a tanh of its own: cuBLASLt
// documents neither its formula nor its error, and NVIDIA's fast hardware tanh (PTX tanh.approx.f32)
// is documented to a relative error of 2^-10.987. A tanh wrong by Δ moves the output by ½·|x|·Δ; the
// slack allows Δ = 2^-10 (twice that instruction's bound: the library's own tanh is not ours to
// see), plus the pre-activation's own tolerance carried through GELU's slope (at most 1.13). At the
// test's inputs (|x| up to ~3) that is up to ~2e-3 absolute — the 2–7e-4 relative differences reported
// for this epilogue against a tanhf reference fit inside it; a wrong epilogue (no GELU, a missing bias)
// is off by far more.
double gelu_epilogue_slack(float x, DType pre_type) {
  const double ax = std::fabs(static_cast<double>(x));
  return 0.5 * ax * std::ldexp(1.0, -10) + 1.13 * (rel_tolerance(pre_type) * ax + abs_tolerance(pre_type));
}

// slack: an extra absolute allowance per element (empty: none).
void expect_close(const char* what, DType t, const std::vector<float>& got, const std::vector<float>& want,
                  const std::vector<double>& slack = {}) {
  const double rel = rel_tolerance(t), abs = abs_tolerance(t);
  int bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double tol = rel * std::fabs(want[i]) + abs + (slack.empty() ? 0.0 : slack[i]);
    if (std::fabs(got[i] - want[i]) > tol && bad++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: " << got[i] << " vs " << want[i] << " (tolerance " << tol << ")";
  }
  EXPECT_EQ(bad, 0) << what;
}

// Runs build(on_device) on the executor and on the host reference, fused where the executor fuses
// (else both without the epilogue), and compares every output. gelu: outs are {GELU output,
// pre-activation}, and a fused output gets gelu_epilogue_slack at the reference's pre-activation.
bool check(Gpu& g, GemmExecutor& ex, const std::function<GemmCall(bool)>& build, const std::vector<Buf*>& outs,
           const std::string& what, bool gelu = false) {
  const bool fused = ex.fuses(build(true));
  const GemmCall on_device = fused ? build(true) : without_epilogue(build(true));
  EXPECT_TRUE(ex.run(on_device)) << what;
  gemm_ref::run_column_major(fused ? build(false) : without_epilogue(build(false)));
  std::vector<double> slack;
  if (gelu && fused)
    for (float x : Gpu::widen(outs[1]->t, outs[1]->hp(), outs[1]->n))
      slack.push_back(gelu_epilogue_slack(x, outs[1]->t));
  for (std::size_t i = 0; i < outs.size(); ++i) {
    if (!fused && i > 0) break;  // without the epilogue only C is written
    expect_close((what + " output " + std::to_string(i)).c_str(), outs[i]->t, g.device_values(*outs[i]),
                 Gpu::widen(outs[i]->t, outs[i]->hp(), outs[i]->n), i == 0 ? slack : std::vector<double>{});
  }
  return fused;
}

struct Shape {
  int R, IC, OC;
  bool aligned;  // every size a multiple of 8: the fused epilogues are expected
};

TEST(CudaGemm, PlansOfTheModelsOpsMatchTheReference) {
  const GpuQuery q = query_gpus();
  if (q.gpus.empty()) GTEST_SKIP() << "no GPU: " << q.status;
  Gpu g;
  g.dev = make_cuda_device(0, std::size_t{2} << 30);
  for (DType S : {DType::fp32, DType::bf16})
    for (GemmMath math : {GemmMath::fp32, GemmMath::fp32_pedantic}) {
      if (S != DType::fp32 && math == GemmMath::fp32_pedantic) continue;  // the reference runs fp32 data only
      GemmExecutor ex(*g.dev, math, std::size_t{32} << 20);
      for (const Shape& s : {Shape{64, 96, 128, true}, Shape{13, 11, 9, false}, Shape{1, 24, 40, true}}) {
        const std::string at = std::string(to_string(S)) + " R=" + std::to_string(s.R) + " IC=" + std::to_string(s.IC) +
                               " OC=" + std::to_string(s.OC);
        const std::size_t nin = static_cast<std::size_t>(s.R) * s.IC, nw = static_cast<std::size_t>(s.IC) * s.OC,
                          nout = static_cast<std::size_t>(s.R) * s.OC;
        Buf &inp = g.make(S, randf(nin, 1)), &w = g.make(S, randf(nw, 2, 0.3f)),
            &bias = g.make(S, randf(static_cast<std::size_t>(s.OC), 3)), &dout = g.make(S, randf(nout, 4));
        Buf& out = g.make(S, randf(nout, 5));
        const bool bias_fused = check(
            g, ex,
            [&](bool d) {
              return matmul_forward_gemm(d ? out.dp() : out.hp(), d ? inp.dp() : inp.hp(), d ? w.dp() : w.hp(),
                                         d ? bias.dp() : bias.hp(), s.R, s.IC, s.OC, S);
            },
            {&out}, "matmul_forward " + at);
        EXPECT_TRUE(bias_fused || !s.aligned) << "no fused bias for " << at;
        Buf &pre = g.make(S, randf(nout, 6)), &act = g.make(S, randf(nout, 7));
        const bool gelu_fused = check(
            g, ex,
            [&](bool d) {
              return matmul_gelu_forward_gemm(d ? pre.dp() : pre.hp(), d ? act.dp() : act.hp(), d ? inp.dp() : inp.hp(),
                                              d ? w.dp() : w.hp(), d ? bias.dp() : bias.hp(), s.R, s.IC, s.OC, S);
            },
            {&act, &pre}, "matmul_gelu_forward " + at, /*gelu=*/true);
        EXPECT_TRUE(gelu_fused || !s.aligned) << "no fused GELU for " << at;
        Buf &dinp = g.make(S, randf(nin, 8)), &dw = g.make(DType::fp32, randf(nw, 9)),
            &db = g.make(DType::fp32, std::vector<float>(static_cast<std::size_t>(s.OC), 0.0f));
        check(
            g, ex,
            [&](bool d) {
              return matmul_backward_gemms(d ? dinp.dp() : dinp.hp(), nullptr, nullptr, d ? dout.dp() : dout.hp(),
                                           d ? inp.dp() : inp.hp(), d ? w.dp() : w.hp(), s.R, s.IC, s.OC, S)
                  .dinp;
            },
            {&dinp}, "matmul_backward dinp " + at);
        const bool bgrad_fused = check(
            g, ex,
            [&](bool d) {
              return matmul_backward_gemms(nullptr, static_cast<float*>(d ? dw.dp() : dw.hp()),
                                           static_cast<float*>(d ? db.dp() : db.hp()), d ? dout.dp() : dout.hp(),
                                           d ? inp.dp() : inp.hp(), d ? w.dp() : w.hp(), s.R, s.IC, s.OC, S)
                  .dw;
            },
            {&dw, &db}, "matmul_backward dw " + at);
        std::printf("%s: bias %s, GELU %s, bias gradient %s\n", at.c_str(), bias_fused ? "fused" : "separate",
                    gelu_fused ? "fused" : "separate", bgrad_fused ? "fused" : "separate");
        // The LM head with V = OC and wte = w seen as [V, C] (C = IC).
        Buf& logits = g.make(S, randf(nout, 10));
        check(
            g, ex,
            [&](bool d) {
              return lm_head_forward_gemm(d ? logits.dp() : logits.hp(), d ? inp.dp() : inp.hp(), d ? w.dp() : w.hp(),
                                          s.R, s.IC, s.OC, s.OC, S);
            },
            {&logits}, "lm_head logits " + at);
        Buf &dx = g.make(S, randf(nin, 11)), &dwte = g.make(DType::fp32, randf(nw, 12));
        for (int part = 0; part < 2; ++part)
          check(
              g, ex,
              [&](bool d) {
                const LmHeadBackwardGemms b = lm_head_backward_gemms(
                    d ? dx.dp() : dx.hp(), static_cast<float*>(d ? dwte.dp() : dwte.hp()), d ? dout.dp() : dout.hp(),
                    d ? inp.dp() : inp.hp(), d ? w.dp() : w.hp(), s.R, s.IC, s.OC, s.OC, S);
                return part == 0 ? b.dx : b.dwte;
              },
              {part == 0 ? &dx : &dwte}, std::string(part == 0 ? "lm_head dx " : "lm_head dwte ") + at);
      }
    }
}

}  // namespace
}  // namespace zinf::cuda
