// flash_attention_test.cpp — the CUDA flash-attention kernels (cuda/ops/flash_attention.cuh) against
// their CPU twin (cpu/ops_attention_tiled.h) run with the same tiles and rounding points, for fp32,
// fp16 and bf16, GPT's packed qkv and Llama's grouped-query heads, head widths on the tensor-core
// path (32, 64, 128) and off it (24), T not a multiple of the blocks, and T = 1. The two differ by the
// summation order inside a tile and the last bit of exp, and the GPU rounds its outputs to S once:
//   fp32   |gpu − cpu| ≤ 1e-5·(|cpu| + max|cpu|)
//   16-bit |gpu − cpu| ≤ u·|cpu| + 2u·max|cpu|, u = 2^-8 (bf16) or 2^-11 (fp16): the output's own
//          rounding plus a few P or dS elements that round the other way.
// Also: two runs give the same bits (no atomics). Skips with the reason without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/ops_attention_tiled.h"
#include "cuda/ops/flash_attention.cuh"
#include "zinf/backends/gpu.h"
#include "zinf/cpu_adam/spec.h"

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

void expect_close(const VF& g, const VF& c, double u, const char* what) {
  ASSERT_EQ(g.size(), c.size());
  double amax = 0;
  for (float x : c) amax = std::max(amax, static_cast<double>(std::fabs(x)));
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double tol = u == 0 ? 1e-5 * (std::fabs(c[i]) + amax) : u * std::fabs(c[i]) + 2 * u * amax;
    if (!(std::fabs(static_cast<double>(g[i]) - c[i]) <= tol) && bad++ == 0) first = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << g.size() << " off; first at " << first << " gpu " << g[first]
                     << " cpu " << c[first];
}

// One case: separate q [R, H·D], k, v [R, KV·D] (Llama) or packed qkv [R, 3C] (GPT, KV = H).
void check_case(int B, int T, int H, int KV, int D, bool packed, DType S) {
  SCOPED_TRACE(::testing::Message() << "B=" << B << " T=" << T << " H=" << H << " KV=" << KV << " D=" << D
                                    << (packed ? " packed" : " gqa") << " " << to_string(S));
  const std::size_t R = static_cast<std::size_t>(B) * T;
  const long qw = static_cast<long>(H) * D, kw = static_cast<long>(KV) * D;
  // The layout: GPT keeps q, k, v in one buffer; Llama in three.
  const long qs = packed ? 3 * qw : qw, ks = packed ? 3 * qw : kw, vs = ks;
  const std::size_t koff = packed ? static_cast<std::size_t>(qw) : 0, voff = packed ? 2 * koff : 0;
  const ops::AttnShapeCpu a{B, T, H, KV, D, qs, ks, vs, qw};
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
  ops::ChunkPool pool(1);
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
  for (int run = 0; run < 2; ++run) {
    cuda::fast::flash_attention_forward(gout.p, static_cast<float*>(glse.p), gq.p, gkp, gvp, a, S, nullptr);
    cuda::fast::flash_attention_backward(gdq.p, gdkp, gdvp, gdo.p, gq.p, gkp, gvp, gout.p,
                                         static_cast<const float*>(glse.p), a, S, scratch.p, nullptr);
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
  expect_close(g_out, out, u, "out");
  expect_close(g_lse, lse, 0.0, "lse");
  expect_close(g_dq, dq, u, packed ? "dqkv" : "dq");
  if (!packed) {
    expect_close(g_dk, dk, u, "dk");
    expect_close(g_dv, dv, u, "dv");
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
