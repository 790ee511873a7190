// flash_attention_test.cpp — the CUDA flash-attention kernels (cuda/ops/flash_attention.cuh) against
// their CPU twin (cpu/ops_attention_tiled.h) run with the same tiles and rounding points, for fp32,
// fp16 and bf16, GPT's packed qkv and Llama's grouped-query heads, head widths on the tensor-core
// path (32, 64, 128) and off it (24), T not a multiple of the blocks, and T = 1. The two differ by the
// summation order inside a tile and the last bit of exp, and the GPU rounds its outputs to S once:
//   fp32   |gpu − cpu| ≤ 1e-5·(|cpu| + max|cpu|)
//   16-bit |gpu − cpu| ≤ u·|cpu| + 2u·max|cpu|, u = 2^-8 (bf16) or 2^-11 (fp16): the output's own
//          rounding plus a few P or dS elements that round the other way.
// Also: two runs give the same bits (no atomics). Skips with the reason without a GPU.
//
// cuDNN's fused attention (cuda/cudnn_attention.h, in builds with cuDNN) runs the same 16-bit cases,
// and sliding windows, against the same twin. Its kernel rounds P where its own tiling puts the rounding, not where the
// twin's tiles do, so it is held to twice the wmma kernel's bound: |gpu − cpu| ≤ 2u·|cpu| + 4u·max|cpu|;
// two runs give the same bits (deterministic engines only). On the executor it runs the cuDNN fake.
// Every cuDNN case of a process shares one device, cuDNN handle and plan cache (planning a shape can
// take seconds on a GPU), and each plan's build time is logged (ZINF_CUDNN_LOG_PLANS=1, set here
// unless the environment sets it). ZINF_ATTENTION_SANITIZE_SHAPES=1 keeps CudnnMatchesCpuTwin to one
// small shape, for the sanitizer runs.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "cpu/ops_attention_tiled.h"
#include "cuda/ops/flash_attention.cuh"
#if ZINF_HAVE_CUDNN
#include "cuda/cuda.h"
#include "cuda/cudnn_attention.h"
#if ZINF_CUDA_EXECUTOR
#include "common/child_run.h"
#include "cudax/cudnn_fake.h"
#endif
#endif
#include "zinf/backends/gpu.h"
#include "zinf/cpu_adam/spec.h"
#include "zinf/device_memory.h"

namespace zinf {
namespace {

namespace spec = cpu_adam::spec;
using VF = std::vector<float>;

// Host values of dtype S: the floats rounded to S (what the GPU sees), and their bytes.
VF round_to(const VF& x, DType S) {
  VF r(x.size());
  for (std::size_t i = 0; i < x.size(); ++i)
    r[i] = S == DType::bf16   ? spec::bf16_to_fp32(spec::fp32_to_bf16(x[i]))
           : S == DType::fp16 ? spec::fp16_to_fp32(spec::fp32_to_fp16(x[i]))
                              : x[i];
  return r;
}
std::vector<std::uint8_t> to_bytes(const VF& x, DType S) {
  std::vector<std::uint8_t> b(x.size() * dtype_bytes(S));
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (S == DType::fp32) {
      std::memcpy(b.data() + 4 * i, &x[i], 4);
    } else {
      const std::uint16_t h = S == DType::bf16 ? spec::fp32_to_bf16(x[i]) : spec::fp32_to_fp16(x[i]);
      std::memcpy(b.data() + 2 * i, &h, 2);
    }
  }
  return b;
}
VF from_bytes(const std::vector<std::uint8_t>& b, DType S) {
  VF x(b.size() / dtype_bytes(S));
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (S == DType::fp32) {
      std::memcpy(&x[i], b.data() + 4 * i, 4);
    } else {
      std::uint16_t h;
      std::memcpy(&h, b.data() + 2 * i, 2);
      x[i] = S == DType::bf16 ? spec::bf16_to_fp32(h) : spec::fp16_to_fp32(h);
    }
  }
  return x;
}

struct DevMem {
  void* p = nullptr;
  explicit DevMem(std::size_t bytes) { EXPECT_EQ(cudaMalloc(&p, std::max<std::size_t>(bytes, 1)), cudaSuccess); }
  ~DevMem() { cudaFree(p); }
  DevMem(const DevMem&) = delete;
  DevMem& operator=(const DevMem&) = delete;
};
void up(DevMem& d, const std::vector<std::uint8_t>& b) {
  ASSERT_EQ(cudaMemcpy(d.p, b.data(), b.size(), cudaMemcpyHostToDevice), cudaSuccess);
}
std::vector<std::uint8_t> down(const DevMem& d, std::size_t bytes) {
  std::vector<std::uint8_t> b(bytes);
  EXPECT_EQ(cudaMemcpy(b.data(), d.p, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  return b;
}

// The attention under test: the wmma flash kernel, or cuDNN's.
enum class Attn { wmma, cudnn };

// A case's layout: separate q [R, H·D], k, v [R, KV·D] (Llama) or packed qkv [R, 3C] (GPT, KV = H).
ops::AttnShapeCpu shape_of(int B, int T, int H, int KV, int D, bool packed, int W) {
  const long qw = static_cast<long>(H) * D, kw = static_cast<long>(KV) * D;
  const long qs = packed ? 3 * qw : qw, ks = packed ? 3 * qw : kw;
  return ops::AttnShapeCpu{B, T, H, KV, D, qs, ks, ks, qw, W};
}

#if ZINF_HAVE_CUDNN
// A device and cuDNN's attention on its compute stream.
struct CudnnRig {
  std::unique_ptr<Device> dev;
  cudaStream_t stream = nullptr;
  std::unique_ptr<cuda::CudnnAttention> attn;
  // The device's budget: room for the deterministic backward's workspace at the GPU check's shapes.
  static constexpr std::size_t kBudget = std::size_t{8} << 30;
  CudnnRig() : dev(cuda::make_cuda_device(0, kBudget)) {
    stream = static_cast<cudaStream_t>(dev->native_stream(StreamRole::compute));
    attn = std::make_unique<cuda::CudnnAttention>(*dev, stream);
  }
  // A second plan cache on the same device (a test that changes the fake's answers needs a fresh one).
  explicit CudnnRig(Device& d) : stream(static_cast<cudaStream_t>(d.native_stream(StreamRole::compute))) {
    attn = std::make_unique<cuda::CudnnAttention>(d, stream);
  }
  ~CudnnRig() {
    if (stream) cudaStreamSynchronize(stream);
    attn.reset();
  }
};

// The one rig the cuDNN cases of this process share, made on first use and released by gtest's
// environment teardown (before the CUDA runtime's own teardown at exit).
CudnnRig*& shared_slot() {
  static CudnnRig* rig = nullptr;
  return rig;
}
CudnnRig& shared_cudnn() {
  if (!shared_slot()) shared_slot() = new CudnnRig();
  return *shared_slot();
}
class CudnnEnvironment : public ::testing::Environment {
 public:
  void SetUp() override { setenv("ZINF_CUDNN_LOG_PLANS", "1", 0); }  // the plans' build times in the log
  void TearDown() override {
    delete shared_slot();
    shared_slot() = nullptr;
  }
};
[[maybe_unused]] ::testing::Environment* const cudnn_environment =
    ::testing::AddGlobalTestEnvironment(new CudnnEnvironment);
#endif

void expect_close(const VF& g, const VF& c, double u, const char* what, double widen = 1) {
  ASSERT_EQ(g.size(), c.size());
  double amax = 0;
  for (float x : c) amax = std::max(amax, static_cast<double>(std::fabs(x)));
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double tol = u == 0 ? 1e-5 * (std::fabs(c[i]) + amax) : widen * (u * std::fabs(c[i]) + 2 * u * amax);
    if (!(std::fabs(static_cast<double>(g[i]) - c[i]) <= tol) && bad++ == 0) first = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << g.size() << " off; first at " << first << " gpu " << g[first]
                     << " cpu " << c[first];
}

// What a case's GPU run gave (the second run's, equal to the first's).
struct Outputs {
  VF out, lse, dq, dk, dv;
};

// One case (shape_of's layouts). `keep` receives the GPU's outputs; `threads` runs the twin on that
// many threads (its results do not depend on them). cuDNN's cases run on `rig`, by default the
// process's shared one.
struct CudnnRig;
void check_case(int B, int T, int H, int KV, int D, bool packed, DType S, Attn attn = Attn::wmma,
                Outputs* keep = nullptr, int threads = 1, int W = 0, CudnnRig* rig = nullptr) {
  SCOPED_TRACE(::testing::Message() << "B=" << B << " T=" << T << " H=" << H << " KV=" << KV << " D=" << D << " W=" << W
                                    << (packed ? " packed" : " gqa") << " " << to_string(S)
                                    << (attn == Attn::cudnn ? " cudnn" : " wmma"));
  const std::size_t R = static_cast<std::size_t>(B) * T;
  const long qw = static_cast<long>(H) * D, kw = static_cast<long>(KV) * D;
  // The layout: GPT keeps q, k, v in one buffer; Llama in three.
  const long qs = packed ? 3 * qw : qw, ks = packed ? 3 * qw : kw, vs = ks;
  const std::size_t koff = packed ? static_cast<std::size_t>(qw) : 0, voff = packed ? 2 * koff : 0;
  const ops::AttnShapeCpu a = shape_of(B, T, H, KV, D, packed, W);
  std::mt19937 gen(static_cast<unsigned>(B * 1000 + T * 10 + D));
  std::uniform_real_distribution<float> uni(-2.0f, 2.0f);
  auto rnd = [&](std::size_t n) {
    VF x(n);
    for (float& e : x) e = uni(gen);
    return round_to(x, S);
  };
  const VF qb = rnd(R * qs), kb = packed ? qb : rnd(R * ks), vb = packed ? qb : rnd(R * vs), dout = rnd(R * qw);
  const ops::TiledAttention tl = ops::cuda_tiling(D, S);

  // CPU twin; its out is rounded to S before the backward reads it, as the GPU's is.
  ops::ChunkPool pool(threads);
  VF out(R * qw), lse(static_cast<std::size_t>(B) * H * T);
  ops::tiled_attention_forward(pool, out.data(), lse.data(), qb.data(), kb.data() + koff, vb.data() + voff, a, tl);
  const VF out_s = round_to(out, S);
  VF dq(R * qs, 0.0f), dk(R * ks, 0.0f), dv(R * vs, 0.0f);
  float* dkp = packed ? dq.data() + koff : dk.data();
  float* dvp = packed ? dq.data() + voff : dv.data();
  ops::tiled_attention_backward(pool, dq.data(), dkp, dvp, dout.data(), qb.data(), kb.data() + koff, vb.data() + voff,
                                out_s.data(), lse.data(), a, tl);

  // GPU
  const std::size_t es = dtype_bytes(S);
  DevMem gq(R * qs * es), gk(R * ks * es), gv(R * vs * es), gdo(R * qw * es), gout(R * qw * es), glse(lse.size() * 4),
      gdq(R * qs * es), gdk(R * ks * es), gdv(R * vs * es), scratch(cuda::fast::flash_backward_scratch_bytes(a));
  up(gq, to_bytes(qb, S));
  if (!packed) {
    up(gk, to_bytes(kb, S));
    up(gv, to_bytes(vb, S));
  }
  up(gdo, to_bytes(dout, S));
  auto* q8 = static_cast<std::uint8_t*>(gq.p);
  const void* gkp = packed ? q8 + koff * es : gk.p;
  const void* gvp = packed ? q8 + voff * es : gv.p;
  auto* dq8 = static_cast<std::uint8_t*>(gdq.p);
  void* gdkp = packed ? dq8 + koff * es : gdk.p;
  void* gdvp = packed ? dq8 + voff * es : gdv.p;
  VF g_out, g_lse, g_dq, g_dk, g_dv;
#if ZINF_HAVE_CUDNN
  cuda::CudnnAttention* cudnn = nullptr;
  cudaStream_t stream = nullptr;
  if (attn == Attn::cudnn) {
    CudnnRig& r = rig ? *rig : shared_cudnn();
    cudnn = r.attn.get();
    stream = r.stream;
    ASSERT_TRUE(cudnn->accepts(a, S)) << "cuDNN refused the shape";
    // A backward zinf refuses (as cudnn-frontend does) runs the wmma kernel's, from cuDNN's forward.
    if (a.T == 1) {
      EXPECT_FALSE(cudnn->accepts_backward(a, S)) << "a sequence of one position";
    }
  }
#else
  (void)rig;
  ASSERT_EQ(attn, Attn::wmma) << "this build has no cuDNN";
#endif
  for (int run = 0; run < 2; ++run) {
#if ZINF_HAVE_CUDNN
    if (attn == Attn::cudnn) {
      cudnn->forward(gout.p, static_cast<float*>(glse.p), gq.p, gkp, gvp, a, S);
      if (cudnn->accepts_backward(a, S))
        cudnn->backward(gdq.p, gdkp, gdvp, gdo.p, gq.p, gkp, gvp, gout.p, static_cast<const float*>(glse.p), a, S);
      else
        cuda::fast::flash_attention_backward(gdq.p, gdkp, gdvp, gdo.p, gq.p, gkp, gvp, gout.p,
                                             static_cast<const float*>(glse.p), a, S, scratch.p, stream);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    } else
#endif
    {
      cuda::fast::flash_attention_forward(gout.p, static_cast<float*>(glse.p), gq.p, gkp, gvp, a, S, nullptr);
      cuda::fast::flash_attention_backward(gdq.p, gdkp, gdvp, gdo.p, gq.p, gkp, gvp, gout.p,
                                           static_cast<const float*>(glse.p), a, S, scratch.p, nullptr);
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const VF o = from_bytes(down(gout, R * qw * es), S), l = from_bytes(down(glse, lse.size() * 4), DType::fp32);
    const VF q_ = from_bytes(down(gdq, R * qs * es), S);
    const VF k_ = packed ? VF{} : from_bytes(down(gdk, R * ks * es), S);
    const VF v_ = packed ? VF{} : from_bytes(down(gdv, R * vs * es), S);
    if (run == 1) {  // deterministic: the second run gives the first run's bits
      EXPECT_EQ(o, g_out);
      EXPECT_EQ(l, g_lse);
      EXPECT_EQ(q_, g_dq);
      EXPECT_EQ(k_, g_dk);
      EXPECT_EQ(v_, g_dv);
    }
    g_out = o, g_lse = l, g_dq = q_, g_dk = k_, g_dv = v_;
  }
  const double u = S == DType::bf16 ? std::ldexp(1.0, -8) : S == DType::fp16 ? std::ldexp(1.0, -11) : 0.0;
  if (keep) *keep = Outputs{g_out, g_lse, g_dq, g_dk, g_dv};
  const double w = attn == Attn::cudnn ? 2 : 1;
  expect_close(g_out, out, u, "out", w);
  expect_close(g_lse, lse, 0.0, "lse");
  expect_close(g_dq, dq, u, packed ? "dqkv" : "dq", w);
  if (!packed) {
    expect_close(g_dk, dk, u, "dk", w);
    expect_close(g_dv, dv, u, "dv", w);
  }
}

bool have_gpu(std::string* why) {
  const cuda::GpuQuery q = cuda::query_gpus();
  if (q.gpus.empty()) *why = q.status;
  return !q.gpus.empty();
}

TEST(FlashAttention, MatchesCpuTwin) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << why;
  for (const DType S : {DType::bf16, DType::fp16, DType::fp32}) {
    check_case(2, 77, 2, 2, 64, true, S);    // GPT-2's head width, packed qkv
    check_case(1, 70, 8, 2, 128, false, S);  // Llama GQA, 128-wide heads
    check_case(2, 33, 4, 4, 32, false, S);   // tensor cores, a narrow head
    check_case(1, 40, 3, 1, 24, false, S);   // not a multiple of 16: the FMA tiles
    check_case(3, 1, 2, 2, 64, true, S);     // T = 1
  }
}

// Sliding windows (W > 0: query t sees keys t − W + 1..t): shorter than a key block (whole blocks
// skipped, rows that see no key of a block), longer than one, a single key; the twin's windowed
// arithmetic is checked against the plain reference in attention_tiled_test.
TEST(FlashAttention, SlidingWindowMatchesCpuTwin) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << why;
  for (const DType S : {DType::bf16, DType::fp16, DType::fp32}) {
    check_case(1, 150, 4, 2, 64, false, S, Attn::wmma, nullptr, 1, 5);
    check_case(1, 150, 4, 2, 64, false, S, Attn::wmma, nullptr, 1, 70);
    check_case(2, 100, 2, 1, 128, false, S, Attn::wmma, nullptr, 1, 33);
    check_case(1, 40, 3, 3, 24, false, S, Attn::wmma, nullptr, 1, 1);
  }
}

// cuDNN's attention, the same 16-bit cases (head widths 24 and 32 are not Llama's or GPT-2's, but
// cuDNN takes any width that is a multiple of 8 and the fake any width; a shape cuDNN refuses would
// fail here, not fall back: the fallback is the fast ops' and has its own test). With
// ZINF_ATTENTION_SANITIZE_SHAPES=1 (the sanitizer runs: memcheck and racecheck are slow) only one
// small shape, Llama's grouped heads in bf16, at a sequence length every accepted cuDNN version runs
// the backward at.
TEST(FlashAttention, CudnnMatchesCpuTwin) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << why;
#if !ZINF_HAVE_CUDNN
  GTEST_SKIP() << "this zinf was built without cuDNN (ZINF_CUDNN)";
#else
  if (const char* e = std::getenv("ZINF_ATTENTION_SANITIZE_SHAPES"); e && std::string(e) == "1") {
    std::printf("cuDNN cases: one small shape (ZINF_ATTENTION_SANITIZE_SHAPES=1)\n");
    check_case(1, 128, 2, 1, 32, false, DType::bf16, Attn::cudnn);
    return;
  }
  for (const DType S : {DType::bf16, DType::fp16}) {
    check_case(2, 77, 2, 2, 64, true, S, Attn::cudnn);    // GPT-2's head width, packed qkv
    check_case(1, 70, 8, 2, 128, false, S, Attn::cudnn);  // Llama GQA, 128-wide heads
    check_case(2, 33, 4, 4, 32, false, S, Attn::cudnn);   // a narrow head, KV = H unpacked
    check_case(3, 1, 2, 2, 64, true, S, Attn::cudnn);     // T = 1
    // sliding windows: shorter than a key block, a single key
    check_case(1, 150, 4, 2, 64, false, S, Attn::cudnn, nullptr, 1, 5);
    check_case(2, 70, 8, 2, 128, false, S, Attn::cudnn, nullptr, 1, 33);
    check_case(1, 40, 2, 2, 32, false, S, Attn::cudnn, nullptr, 1, 1);
  }
#endif
}

// The GPU check's attention section: at each shape of ZINF_ATTENTION_CHECK_SHAPES
// ("B,T,H,KV,D[,W];…", W a sliding window; default two small ones with the same head pattern as the
// GPU's (B 4, T 1024, H 25, D 64) and (B 1, T 4096, H 32, KV 8, D 128)), plus one windowed shape at
// a sequence length that is a multiple of 128 (B 1, T 128, H 4, KV 2, D 64, W 48) where the list has
// none, bf16, forward and backward: cuDNN and the wmma kernel each against the twin (their bounds
// above), cuDNN against the wmma kernel within the sum of the two bounds, every output finite, and
// each run twice with the same bits.
//
// No silent fallback: cuDNN must run the forward at every check shape, and the backward wherever zinf
// does not refuse it by the frontend's rules for this cuDNN version and sequence length
// (CudnnAttention::backward_refusal) — the plan cache says which ran. Per shape one line
//   attention-check: B 4 T 1024 H 25 KV 25 D 64 W 0 bf16: fwd=cudnn bwd=cudnn; …
// (fwd/bwd = cudnn or wmma: what ran), printed before the assertions, for the GPU check's log.
#if ZINF_HAVE_CUDNN
double worst_over_bound(const VF& g, const VF& c, double u, double widen) {
  double amax = 0, worst = 0;
  for (float x : c) amax = std::max(amax, static_cast<double>(std::fabs(x)));
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double tol = widen * (u * std::fabs(c[i]) + 2 * u * amax);
    worst = std::max(worst, std::fabs(static_cast<double>(g[i]) - c[i]) / tol);
  }
  return worst;
}
std::size_t non_finite(const Outputs& o) {
  std::size_t n = 0;
  for (const VF* v : {&o.out, &o.lse, &o.dq, &o.dk, &o.dv})
    for (float x : *v) n += std::isfinite(x) ? 0 : 1;
  return n;
}
std::string version_text(std::size_t v) {
  return std::to_string(v / 10000) + "." + std::to_string((v / 100) % 100) + "." + std::to_string(v % 100);
}
#endif

TEST(FlashAttention, CudnnAgainstWmmaAndTwinAtCheckShapes) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << why;
#if !ZINF_HAVE_CUDNN
  GTEST_SKIP() << "this zinf was built without cuDNN (ZINF_CUDNN)";
#else
  const char* env = std::getenv("ZINF_ATTENTION_CHECK_SHAPES");
  const std::string list = env && *env ? env : "2,40,5,5,64;1,48,4,2,128";
  struct Shape {
    int B, T, H, KV, D, W;
  };
  std::vector<Shape> shapes;
  for (std::size_t start = 0; start < list.size();) {
    std::size_t end = list.find(';', start);
    if (end == std::string::npos) end = list.size();
    Shape sh{0, 0, 0, 0, 0, 0};
    const int got = std::sscanf(list.substr(start, end - start).c_str(), "%d,%d,%d,%d,%d,%d", &sh.B, &sh.T, &sh.H,
                                &sh.KV, &sh.D, &sh.W);
    ASSERT_TRUE(got == 5 || got == 6) << "ZINF_ATTENTION_CHECK_SHAPES: expected B,T,H,KV,D[,W];… , got " << list;
    shapes.push_back(sh);
    start = end + 1;
  }
  if (std::none_of(shapes.begin(), shapes.end(), [](const Shape& sh) { return sh.W > 0; }))
    shapes.push_back({1, 128, 4, 2, 64, 48});  // a sliding window shorter than the sequence
  const std::size_t version = cuda::CudnnAttention::runtime_version();
  const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  CudnnRig& rig = shared_cudnn();
  for (const Shape& sh : shapes) {
    const auto [B, T, H, KV, D, W] = sh;
    SCOPED_TRACE(::testing::Message() << "check shape B " << B << " T " << T << " H " << H << " KV " << KV << " D "
                                      << D << " W " << W);
    const bool packed = KV == H && W == 0;  // GPT's packed qkv where the heads are not grouped, Llama's layout else
    Outputs wmma, cudnn;
    check_case(B, T, H, KV, D, packed, DType::bf16, Attn::wmma, &wmma, threads, W);
    check_case(B, T, H, KV, D, packed, DType::bf16, Attn::cudnn, &cudnn, threads, W);
    const cuda::CudnnAttention::Route route = rig.attn->route(shape_of(B, T, H, KV, D, packed, W), DType::bf16);
    const bool fwd = route.forward_cudnn && route.forward_runs > 0;
    const bool bwd = route.backward_cudnn && route.backward_runs > 0;
    const double u = std::ldexp(1.0, -8);
    // cuDNN against the wmma kernel: each is within its bound of the twin, so within 3u|x| + 6u·max.
    const double o = worst_over_bound(cudnn.out, wmma.out, u, 3), q = worst_over_bound(cudnn.dq, wmma.dq, u, 3);
    const double k = packed ? 0 : worst_over_bound(cudnn.dk, wmma.dk, u, 3);
    const double v = packed ? 0 : worst_over_bound(cudnn.dv, wmma.dv, u, 3);
    std::printf("attention-check: B %d T %d H %d KV %d D %d W %d bf16: fwd=%s bwd=%s; cudnn vs wmma worst/bound "
                "out %.3f dq %.3f dk %.3f dv %.3f; plans built in %.1f ms (fwd) and %.1f ms (bwd), workspace %zu "
                "bytes; cuDNN %s%s%s\n",
                B, T, H, KV, D, W, fwd ? "cudnn" : "wmma", bwd ? "cudnn" : "wmma", o, q, k, v, route.forward_build_ms,
                route.backward_build_ms, std::max(route.forward_workspace, route.backward_workspace),
                version_text(version).c_str(), route.refusal.empty() ? "" : "; refused: ", route.refusal.c_str());
    std::fflush(stdout);
    const bool fwd_refused = !cuda::CudnnAttention::forward_refusal(version, W > 0).empty();
    if (!fwd_refused) {
      EXPECT_TRUE(fwd) << "cuDNN did not run the forward at a check shape: " << route.refusal;
    }
    const std::string zinf_refuses = cuda::CudnnAttention::backward_refusal(version, T);
    if (zinf_refuses.empty() && !fwd_refused) {
      EXPECT_TRUE(bwd) << "cuDNN refused the backward at a check shape (cuDNN " << version_text(version)
                       << ", where the frontend accepts it): " << route.refusal;
    }
    EXPECT_EQ(non_finite(wmma), 0u) << "the wmma kernel's outputs hold a NaN or an infinity";
    EXPECT_EQ(non_finite(cudnn), 0u) << "cuDNN's outputs hold a NaN or an infinity";
    EXPECT_LE(std::max({o, q, k, v}), 1.0) << "cuDNN and the wmma kernel differ beyond the sum of their bounds";
  }
#endif
}

#if ZINF_HAVE_CUDNN
// The rules zinf takes from cudnn-frontend, as functions of the cuDNN version (no GPU needed): the
// backward's refusals, and the mask value (the lowest float before 9.10.0, −∞ from 9.10.0 on).
TEST(FlashAttention, CudnnRulesFollowTheFrontendByVersion) {
  using cuda::CudnnAttention;
  EXPECT_EQ(CudnnAttention::mask_value(90900), std::numeric_limits<float>::lowest());
  EXPECT_EQ(CudnnAttention::mask_value(90999), std::numeric_limits<float>::lowest());
  EXPECT_EQ(CudnnAttention::mask_value(91000), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(CudnnAttention::mask_value(92100), -std::numeric_limits<float>::infinity());
  EXPECT_NE(CudnnAttention::backward_refusal(91000, 128), "");  // 9.10.0 and 9.10.1: known faults
  EXPECT_NE(CudnnAttention::backward_refusal(91001, 128), "");
  EXPECT_EQ(CudnnAttention::backward_refusal(91002, 128), "");
  EXPECT_NE(CudnnAttention::backward_refusal(91500, 40), "");  // to 9.15.0: T a multiple of 128
  EXPECT_EQ(CudnnAttention::backward_refusal(91500, 256), "");
  EXPECT_EQ(CudnnAttention::backward_refusal(91501, 40), "");
  EXPECT_EQ(CudnnAttention::backward_refusal(91600, 40), "");
  EXPECT_NE(CudnnAttention::forward_refusal(91000, false), "");  // the 16-bit forward: 9.10.0 and 9.10.1
  EXPECT_NE(CudnnAttention::forward_refusal(91001, false), "");
  EXPECT_EQ(CudnnAttention::forward_refusal(91002, false), "");
  EXPECT_EQ(CudnnAttention::forward_refusal(90900, false), "");
  EXPECT_NE(CudnnAttention::forward_refusal(90100, true), "");  // a window: from 9.2 on
  EXPECT_EQ(CudnnAttention::forward_refusal(90200, true), "");
  EXPECT_EQ(CudnnAttention::forward_refusal(90100, false), "");
  EXPECT_NE(CudnnAttention::backward_refusal(91900, 1), "");  // one position
}
#endif

#if ZINF_HAVE_CUDNN && ZINF_CUDA_EXECUTOR
// The tests below need the executor's cuDNN fake (its hooks plant a refusal, another version, another
// workspace size); they are built only there, so a GPU run never skips them.

// Runs this binary's check-shape test in a child process with `env` (VAR=value … ) in front; returns
// its exit status and what it printed.
std::pair<int, std::string> run_check_shapes(const std::string& env) {
  return zinf::testing_support::run_child(env, "FlashAttention.CudnnAgainstWmmaAndTwinAtCheckShapes");
}

// A planted cuDNN backward refusal at a check shape fails the check (no silent wmma backward): the
// fake refusing every graph with a RESHAPE node — the backward's — at one windowed check shape, and
// the same run passing without it.
TEST(FlashAttention, CheckShapesFailWhenCudnnRefusesTheBackward) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << why;
  const std::string shape = "ZINF_ATTENTION_CHECK_SHAPES=1,128,2,1,32,40";
  {
    const auto [rc, out] = run_check_shapes(shape);
    EXPECT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("attention-check: B 1 T 128 H 2 KV 1 D 32 W 40 bf16: fwd=cudnn bwd=cudnn"), std::string::npos)
        << out;
    EXPECT_NE(out.find("zinf: cuDNN attention backward plan at B 1, T 128, H 2, KV 1, D 32, window 40, bf16: built in"),
              std::string::npos)
        << "each plan's build time is logged: " << out;
  }
  const auto [rc, out] = run_check_shapes(shape + " ZINF_CUDNN_FAKE_REFUSE_RESHAPE=1");
  EXPECT_NE(rc, 0) << "a refused backward at a check shape must fail the check: " << out;
  EXPECT_NE(out.find("attention-check: B 1 T 128 H 2 KV 1 D 32 W 40 bf16: fwd=cudnn bwd=wmma"), std::string::npos)
      << out;
  EXPECT_NE(out.find("cuDNN refused the backward at a check shape"), std::string::npos) << out;
}

// The mask value follows the cuDNN version the library reports at run time: the fake, answering
// 9.9.0, gets the lowest float in the variant pack, and 9.19.0 −∞; both give the twin's results.
TEST(FlashAttention, CudnnMaskValueFollowsTheRuntimeVersion) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << why;
  const float lowest = std::numeric_limits<float>::lowest(), inf = -std::numeric_limits<float>::infinity();
  for (const auto& [version, want, other] : {std::tuple{"90900", lowest, inf}, std::tuple{"91900", inf, lowest}}) {
    SCOPED_TRACE(std::string("cuDNN version ") + version);
    setenv("ZINF_CUDNN_FAKE_VERSION", version, 1);
    CudnnRig rig(*shared_cudnn().dev);
    check_case(1, 128, 2, 1, 32, false, DType::bf16, Attn::cudnn, nullptr, 1, 40, &rig);
    unsetenv("ZINF_CUDNN_FAKE_VERSION");
    const cuda::CudnnAttention::Route r = rig.attn->route(shape_of(1, 128, 2, 1, 32, false, 40), DType::bf16);
    EXPECT_TRUE(r.forward_cudnn && r.backward_cudnn) << r.refusal;
    EXPECT_EQ(r.mask_value, want);
    const std::vector<float> passed = cudax::cudnn_fake_last_scalars();  // the last run: the backward
    EXPECT_EQ(std::count(passed.begin(), passed.end(), want), 1) << "the mask value is passed by value";
    EXPECT_EQ(std::count(passed.begin(), passed.end(), other), 0);
  }
}

// The workspace taken is the chosen plans' own need — the fake's choice, 256 bytes per node of each
// graph (the backward's graph is the larger), or ZINF_CUDNN_FAKE_WORKSPACE — not the cap
// (cudnn_workspace_bytes, 64 MiB and up), which only bounds the engines: a plan needing more is
// refused. A shape needing more grows it.
TEST(FlashAttention, CudnnWorkspaceIsThePlansNeedNotTheCap) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << why;
  Device& dev = *shared_cudnn().dev;
  const ops::AttnShapeCpu a = shape_of(1, 128, 2, 1, 32, false, 0), wide = shape_of(2, 128, 2, 1, 32, false, 0);
  const std::uint64_t cap = cudnn_workspace_bytes(2, 128, 128 * 64);
  {
    CudnnRig rig(dev);
    const std::size_t before = dev.in_use();
    ASSERT_TRUE(rig.attn->accepts(a, DType::bf16));
    const cuda::CudnnAttention::Route r = rig.attn->route(a, DType::bf16);
    EXPECT_GT(r.forward_workspace, 0u);
    EXPECT_GT(r.backward_workspace, r.forward_workspace) << "the fake's backward graph has more nodes";
    EXPECT_EQ(r.forward_workspace % 256, 0u);
    EXPECT_EQ(rig.attn->workspace_bytes(), r.backward_workspace);
    EXPECT_EQ(dev.in_use() - before, cuda_block_bytes(r.backward_workspace)) << "allocated: the plans' need";
    EXPECT_LT(r.backward_workspace, cap);
  }
  {
    CudnnRig rig(dev);
    setenv("ZINF_CUDNN_FAKE_WORKSPACE", "100000", 1);
    const std::size_t before = dev.in_use();
    const bool ok = rig.attn->accepts(a, DType::bf16);
    setenv("ZINF_CUDNN_FAKE_WORKSPACE", "300000", 1);
    const bool ok_wide = rig.attn->accepts(wide, DType::bf16);
    unsetenv("ZINF_CUDNN_FAKE_WORKSPACE");
    ASSERT_TRUE(ok && ok_wide);
    EXPECT_EQ(rig.attn->route(a, DType::bf16).forward_workspace, 100000u);
    EXPECT_EQ(rig.attn->workspace_bytes(), 300000u) << "grown for the shape that needs more";
    EXPECT_EQ(dev.in_use() - before, cuda_block_bytes(300000)) << "the smaller block went back";
    // Both shapes run with the workspace held (the fake overwrites all of each plan's need).
    check_case(1, 128, 2, 1, 32, false, DType::bf16, Attn::cudnn, nullptr, 1, 0, &rig);
  }
  {
    CudnnRig rig(dev);
    const std::string over = std::to_string(cap + 1);
    setenv("ZINF_CUDNN_FAKE_WORKSPACE", over.c_str(), 1);
    ::testing::internal::CaptureStderr();
    const bool ok = rig.attn->accepts(a, DType::bf16);
    const std::string said = ::testing::internal::GetCapturedStderr();
    unsetenv("ZINF_CUDNN_FAKE_WORKSPACE");
    EXPECT_FALSE(ok) << "a plan needing more than the cap is refused";
    EXPECT_NE(said.find("MiB of workspace"), std::string::npos) << said;
    EXPECT_EQ(rig.attn->workspace_bytes(), 0u);
  }
}
#endif

TEST(FlashAttention, RefusesWideHeadsAndSkipsEmptyShapes) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << why;
  const ops::AttnShapeCpu wide{1, 4, 1, 1, 256, 256, 256, 256, 256};
  EXPECT_THROW(
      cuda::fast::flash_attention_forward(nullptr, nullptr, nullptr, nullptr, nullptr, wide, DType::bf16, nullptr),
      Error);
  const ops::AttnShapeCpu empty{0, 4, 2, 2, 64, 128, 128, 128, 128};
  cuda::fast::flash_attention_forward(nullptr, nullptr, nullptr, nullptr, nullptr, empty, DType::bf16, nullptr);
  cuda::fast::flash_attention_backward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                       empty, DType::bf16, nullptr, nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
}  // namespace zinf
