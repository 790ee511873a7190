// cuda_rows_test.cpp — the fast path's row, column and elementwise kernels (cuda/ops/rows.cuh) against
// the CPU reference ops, for storage fp32 and bf16, and their determinism. Skips with the reason
// where no GPU is visible.
//
// Inputs are rounded to S on the host first, so both sides read the same values; the reference then
// runs in fp32. Tolerances (|got − want| ≤ rel·|want| + abs):
// - every S-typed output adds one rounding: rel += 2⁻⁸ for bf16 (half an ulp of its 8-bit significand);
// - per-element arithmetic done by the same float operations on both sides (RoPE, bias, residual,
//   cross-entropy gradient, embedding lookups, conversions): exact for fp32 outputs;
// - exp-based elementwise ops (SwiGLU): 2e-6 relative (CUDA's expf is within 2 ulp, the reference's
//   within 1), 4e-6 for dgate (σ's error is amplified by up to |1 + g(1 − 2σ)| ≈ 7 at |g| = 8, against a
//   factor near 1 in the result); GELU: the tanh bound stated in gelu_slack;
// - row and column reductions (norms, column sums, the softmax's log-sum-exp), whose summation order
//   differs from the reference's: 1e-4 relative + 1e-5 absolute (1e-4 absolute for sums over hundreds
//   of rows);
// - the embedding gradient adds each token's rows in row order from the gradient's old value, as the
//   reference does: equal bits.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/random_floats.h"
#include "cpu/ops_gpt.h"
#include "cpu/ops_llama.h"
#include "cuda/ops/rows.cuh"
#include "model/backend.h"
#include "zinf/backends/gpu.h"
#include "zinf/cpu_adam/spec.h"

namespace zinf {
namespace {

namespace fast = cuda::fast;
namespace spec = cpu_adam::spec;
using VF = std::vector<float>;

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x

// Values as storage S holds them (each rounded to nearest even), widened back to fp32.
VF round_to(const VF& v, DType t) {
  VF r(v);
  for (auto& x : r) {
    if (t == DType::bf16) x = spec::bf16_to_fp32(spec::fp32_to_bf16(x));
    if (t == DType::fp16) x = spec::fp16_to_fp32(spec::fp32_to_fp16(x));
  }
  return r;
}

// Device memory owned by the test; freed at the end.
class Mem {
 public:
  ~Mem() {
    for (void* p : ptrs_) cudaFree(p);
  }
  void* alloc(std::size_t bytes) {
    void* p = nullptr;
    if (cudaMalloc(&p, bytes == 0 ? 16 : bytes) != cudaSuccess) throw std::runtime_error("cudaMalloc failed");
    ptrs_.push_back(p);
    return p;
  }
  // v in dtype t (rounded); `offset` elements of padding in front (to test unaligned rows).
  void* up(const VF& v, DType t, std::size_t offset = 0) {
    const std::size_t eb = dtype_bytes(t);
    std::vector<unsigned char> bytes((v.size() + offset) * eb, 0);
    for (std::size_t i = 0; i < v.size(); ++i) {
      unsigned char* d = bytes.data() + (i + offset) * eb;
      if (t == DType::fp32) {
        std::memcpy(d, &v[i], 4);
      } else {
        const std::uint16_t h = t == DType::bf16 ? spec::fp32_to_bf16(v[i]) : spec::fp32_to_fp16(v[i]);
        std::memcpy(d, &h, 2);
      }
    }
    void* p = alloc(bytes.size());
    cudaMemcpy(p, bytes.data(), bytes.size(), cudaMemcpyHostToDevice);
    return static_cast<unsigned char*>(p) + offset * eb;
  }
  float* upf(const VF& v) { return static_cast<float*>(up(v, DType::fp32)); }
  int* upi(const std::vector<int>& v) {
    void* p = alloc(v.size() * 4);
    cudaMemcpy(p, v.data(), v.size() * 4, cudaMemcpyHostToDevice);
    return static_cast<int*>(p);
  }
  float* zeros(std::size_t n) {
    void* p = alloc(n * 4);
    cudaMemset(p, 0, n * 4);
    return static_cast<float*>(p);
  }
  static VF down(const void* p, std::size_t n, DType t) {
    cudaDeviceSynchronize();
    const std::size_t eb = dtype_bytes(t);
    std::vector<unsigned char> bytes(n * eb);
    cudaMemcpy(bytes.data(), p, bytes.size(), cudaMemcpyDeviceToHost);
    VF v(n);
    for (std::size_t i = 0; i < n; ++i) {
      if (t == DType::fp32) {
        std::memcpy(&v[i], bytes.data() + i * 4, 4);
      } else {
        std::uint16_t h;
        std::memcpy(&h, bytes.data() + i * 2, 2);
        v[i] = t == DType::bf16 ? spec::bf16_to_fp32(h) : spec::fp16_to_fp32(h);
      }
    }
    return v;
  }
  static std::vector<unsigned char> raw(const void* p, std::size_t bytes) {
    cudaDeviceSynchronize();
    std::vector<unsigned char> v(bytes);
    cudaMemcpy(v.data(), p, bytes, cudaMemcpyDeviceToHost);
    return v;
  }

 private:
  std::vector<void*> ptrs_;
};

bool have_gpu(std::string* why) {
  const cuda::GpuQuery q = cuda::query_gpus();
  if (q.gpus.empty()) {
    *why = q.status;
    return false;
  }
  return true;
}

double store_rel(DType t) { return t == DType::bf16 ? 1.0 / 256 : t == DType::fp16 ? 1.0 / 2048 : 0.0; }

void expect_close(const std::string& what, const VF& got, const VF& want, double rel, double abs) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - want[i]);
    worst = std::max(worst, d);
    if (!(d <= rel * std::fabs(want[i]) + abs) && bad++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: " << got[i] << " vs " << want[i];
  }
  EXPECT_EQ(bad, 0) << what << ": worst |diff| " << worst;
}

const DType kTypes[] = {DType::fp32, DType::bf16};

// Row lengths: a warp per row with 16-byte packs, a block per row without packs (1030 is no multiple
// of a pack), a block per row with packs.
const int kWidths[] = {24, 1030, 2048};

TEST(CudaRows, NormsMatchTheCpuReference) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << "no GPU: " << why;
  ops::ChunkPool pool(2);
  const int R = 300;  // several row chunks in the column sums
  for (DType t : kTypes)
    for (int C : kWidths) {
      const std::string tag = std::string(to_string(t)) + " C=" + std::to_string(C) + ": ";
      const double sr = store_rel(t);
      const std::size_t n = static_cast<std::size_t>(R) * C;
      Mem m;
      const VF x = round_to(randf(n, 1, 2.0f), t), w = round_to(randf(C, 2), t), b = round_to(randf(C, 3), t),
               dy = round_to(randf(n, 4), t), dx0 = round_to(randf(n, 5), t), dw0 = randf(C, 6), db0 = randf(C, 7);
      void *gx = m.up(x, t), *gw = m.up(w, t), *gb = m.up(b, t), *gdy = m.up(dy, t);
      float* partials = m.zeros(fast::column_partials_floats(R, C));
      // LayerNorm forward and backward
      VF out(n), mean(R), rstd(R);
      ops::layernorm_forward(pool, out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), R, C);
      void* gout = m.up(VF(n), t);
      float *gmean = m.zeros(R), *grstd = m.zeros(R);
      fast::layernorm_forward(gout, gmean, grstd, gx, gw, gb, R, C, t, nullptr);
      expect_close(tag + "layernorm out", Mem::down(gout, n, t), out, sr + 1e-4, 1e-5);
      expect_close(tag + "layernorm mean", Mem::down(gmean, R, DType::fp32), mean, 1e-4, 1e-5);
      expect_close(tag + "layernorm rstd", Mem::down(grstd, R, DType::fp32), rstd, 1e-4, 1e-5);
      VF dx = dx0, dw = dw0, db = db0;
      ops::layernorm_backward(pool, dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(),
                              rstd.data(), R, C);
      void* gdx = m.up(dx0, t);
      float *gdw = m.upf(dw0), *gdb = m.upf(db0);
      fast::layernorm_backward(gdx, gdw, gdb, gdy, gx, gw, m.upf(mean), m.upf(rstd), R, C, t, partials, nullptr);
      expect_close(tag + "layernorm dinp", Mem::down(gdx, n, t), dx, sr + 1e-4, 1e-5);
      expect_close(tag + "layernorm dw", Mem::down(gdw, C, DType::fp32), dw, 1e-4, 1e-4);
      expect_close(tag + "layernorm db", Mem::down(gdb, C, DType::fp32), db, 1e-4, 1e-4);
      // RMSNorm forward and backward
      VF rout(n), rr(R);
      ops::rmsnorm_forward(pool, rout.data(), rr.data(), x.data(), w.data(), R, C, 1e-5f);
      void* grout = m.up(VF(n), t);
      float* grr = m.zeros(R);
      fast::rmsnorm_forward(grout, grr, gx, gw, R, C, 1e-5f, t, nullptr);
      expect_close(tag + "rmsnorm out", Mem::down(grout, n, t), rout, sr + 1e-4, 1e-5);
      expect_close(tag + "rmsnorm rstd", Mem::down(grr, R, DType::fp32), rr, 1e-4, 1e-5);
      VF rdx = dx0, rdw = dw0;
      ops::rmsnorm_backward(pool, rdx.data(), rdw.data(), dy.data(), x.data(), w.data(), rr.data(), R, C);
      void* grdx = m.up(dx0, t);
      float* grdw = m.upf(dw0);
      fast::rmsnorm_backward(grdx, grdw, gdy, gx, gw, m.upf(rr), R, C, t, partials, nullptr);
      expect_close(tag + "rmsnorm dinp", Mem::down(grdx, n, t), rdx, sr + 1e-4, 1e-5);
      expect_close(tag + "rmsnorm dw", Mem::down(grdw, C, DType::fp32), rdw, 1e-4, 1e-4);
      // column_sum (acc += Σ_r x, rows in order) and add_bias (out += bias)
      VF cs = dw0;
      for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) cs[c] += x[static_cast<std::size_t>(r) * C + c];
      float* gcs = m.upf(dw0);
      fast::column_sum(gcs, gx, R, C, t, partials, nullptr);
      expect_close(tag + "column_sum", Mem::down(gcs, C, DType::fp32), cs, 1e-4, 1e-4);
      VF ob = dx0;
      for (std::size_t i = 0; i < n; ++i) ob[i] += b[i % C];
      void* gob = m.up(dx0, t);
      fast::add_bias(gob, gb, R, C, t, nullptr);
      expect_close(tag + "add_bias", Mem::down(gob, n, t), ob, sr, 0);
      CUDA_OK(cudaGetLastError());
    }
}

// GELU's tanh: CUDA's tanhf is within 2 ulp and the reference's within 1, so |Δt| ≤ 3·2⁻²⁴; it reaches
// the forward as ½|x|·Δt and the backward as |dout|·(½ + |x|k(1 + 3·0.044715x²))·Δt (one ulp to spare).
double gelu_slack(float x, float dout, bool backward) {
  constexpr double kDt = 4.0 / 16777216.0, k = 0.7978845608028654;
  const double ax = std::fabs(static_cast<double>(x));
  if (!backward) return 0.5 * ax * kDt;
  return std::fabs(static_cast<double>(dout)) * (0.5 + ax * k * (1.0 + 3.0 * 0.044715 * ax * ax)) * kDt;
}

TEST(CudaRows, ElementwiseOpsMatchTheCpuReference) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << "no GPU: " << why;
  ops::ChunkPool pool(2);
  for (DType t : kTypes)
    for (std::size_t n : {std::size_t{4099}, std::size_t{64}, std::size_t{3}}) {  // packs and a tail; tail only
      const std::string tag = std::string(to_string(t)) + " n=" + std::to_string(n) + ": ";
      const double sr = store_rel(t);
      Mem m;
      const VF x = round_to(randf(n, 11, 2.0f), t), y = round_to(randf(n, 12), t), d = round_to(randf(n, 13), t);
      void *gx = m.up(x, t), *gy = m.up(y, t), *gd = m.up(d, t);
      // GELU
      VF ge(n), gb(n);
      ops::gelu_forward(pool, ge.data(), x.data(), n);
      ops::gelu_backward(pool, gb.data(), x.data(), d.data(), n);
      void *gge = m.up(VF(n), t), *ggb = m.up(VF(n), t);
      fast::gelu_forward(gge, gx, n, t, nullptr);
      fast::gelu_backward(ggb, gx, gd, n, t, nullptr);
      const VF ge_got = Mem::down(gge, n, t), gb_got = Mem::down(ggb, n, t);
      for (std::size_t i = 0; i < n; ++i) {
        const double tf = (sr + 1e-6) * std::fabs(ge[i]) + 1e-7 + gelu_slack(x[i], 0, false);
        const double tb = (sr + 1e-6) * std::fabs(gb[i]) + 1e-7 + gelu_slack(x[i], d[i], true);
        ASSERT_LE(std::fabs(static_cast<double>(ge_got[i]) - ge[i]), tf) << tag << "gelu_forward[" << i << "]";
        ASSERT_LE(std::fabs(static_cast<double>(gb_got[i]) - gb[i]), tb) << tag << "gelu_backward[" << i << "]";
      }
      // residual add
      VF acc = y;
      ops::add_inplace(pool, acc.data(), x.data(), n);
      void* gacc = m.up(y, t);
      fast::add_inplace(gacc, gx, n, t, nullptr);
      expect_close(tag + "add_inplace", Mem::down(gacc, n, t), acc, sr, 0);
      // SwiGLU
      VF so(n), sdg(n), sdu(n);
      ops::swiglu_forward(pool, so.data(), x.data(), y.data(), n);
      ops::swiglu_backward(pool, sdg.data(), sdu.data(), d.data(), x.data(), y.data(), n);
      void *gso = m.up(VF(n), t), *gsdg = m.up(VF(n), t), *gsdu = m.up(VF(n), t);
      fast::swiglu_forward(gso, gx, gy, n, t, nullptr);
      fast::swiglu_backward(gsdg, gsdu, gd, gx, gy, n, t, nullptr);
      expect_close(tag + "swiglu out", Mem::down(gso, n, t), so, sr + 2e-6, 1e-7);
      expect_close(tag + "swiglu dgate", Mem::down(gsdg, n, t), sdg, sr + 4e-6, 1e-6);
      expect_close(tag + "swiglu dup", Mem::down(gsdu, n, t), sdu, sr + 2e-6, 1e-7);
      // conversions: to every dtype and back (each rounding as the host's round to nearest even)
      for (DType to : {DType::fp32, DType::bf16, DType::fp16}) {
        void* gc = m.up(VF(n), to);
        fast::convert(gc, to, gx, t, n, nullptr);
        const VF got = Mem::down(gc, n, to), want = round_to(x, to);
        ASSERT_EQ(0, std::memcmp(got.data(), want.data(), n * 4)) << tag << "convert to " << to_string(to);
      }
      CUDA_OK(cudaGetLastError());
    }
}

// The kernels' 16-bit rounding (cuda/round16.cuh) on the GPU's own conversion instructions is
// cpu_adam/spec.h's, bit for bit, where the two could part: fp32 zeros and subnormals (exponent field
// 0), the smallest normals (1), the largest finite values (254), inf and NaN (255), both signs, every
// 61st mantissa and the mantissas at the rounding edges. (tests/cpu_adam/bf16_rule_test.cpp walks all
// 2^32 inputs with NVIDIA's host code for the instructions.)
TEST(CudaRows, ConvertRoundsAsTheSpecAtTheEdges) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << "no GPU: " << why;
  std::vector<std::uint32_t> mants;
  for (std::uint32_t m = 0; m < 0x800000u; m += 61) mants.push_back(m);
  for (std::uint32_t m : {1u, 2u, 0x7FFFu, 0x8000u, 0x8001u, 0x17FFFu, 0x18000u, 0x3FFFFFu, 0x400000u, 0x400001u,
                          0x7F7FFFu, 0x7F8000u, 0x7FFFFFu, 0x0FFFu, 0x1000u, 0x1001u, 0x2000u})
    mants.push_back(m);
  std::vector<std::uint32_t> u;
  for (std::uint32_t sign : {0u, 0x80000000u})
    for (std::uint32_t e : {0u, 1u, 254u, 255u})
      for (std::uint32_t m : mants) u.push_back(sign | (e << 23) | m);
  const std::size_t n = u.size();
  Mem m;
  void* gx = m.alloc(n * 4);
  CUDA_OK(cudaMemcpy(gx, u.data(), n * 4, cudaMemcpyHostToDevice));
  for (DType to : {DType::bf16, DType::fp16}) {
    void* gc = m.alloc(n * 2);
    fast::convert(gc, to, gx, DType::fp32, n, nullptr);
    std::vector<std::uint16_t> got(n);
    CUDA_OK(cudaMemcpy(got.data(), gc, n * 2, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const float x = spec::float_of(u[i]);
      const std::uint16_t want = to == DType::bf16 ? spec::fp32_to_bf16(x) : spec::fp32_to_fp16(x);
      if (got[i] != want && bad++ < 5)
        ADD_FAILURE() << std::hex << to_string(to) << ": x=0x" << u[i] << " gives 0x" << got[i] << ", spec.h 0x"
                      << want;
    }
    EXPECT_EQ(bad, 0) << to_string(to) << ": inputs whose rounding differs from spec.h's";
  }
  CUDA_OK(cudaGetLastError());
}

TEST(CudaRows, RopeMatchesTheCpuReference) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << "no GPU: " << why;
  ops::ChunkPool pool(2);
  const int B = 2, T = 7, heads = 3;
  for (DType t : kTypes)
    for (int D : {64, 6}) {  // packs of pairs; single pairs
      const std::string tag = std::string(to_string(t)) + " D=" + std::to_string(D) + ": ";
      const int R = B * T;
      const std::size_t n = static_cast<std::size_t>(R) * heads * D;
      Mem m;
      const VF x = round_to(randf(n, 21), t), co = randf(static_cast<std::size_t>(T) * D / 2, 22),
               si = randf(static_cast<std::size_t>(T) * D / 2, 23);
      for (bool backward : {false, true}) {
        VF want = x;
        ops::rope_apply(pool, want.data(), co.data(), si.data(), R, T, heads, D, backward);
        void* gx = m.up(x, t);
        fast::rope_apply(gx, m.upf(co), m.upf(si), R, T, heads, D, backward, t, nullptr);
        expect_close(tag + (backward ? "rope backward" : "rope forward"), Mem::down(gx, n, t), want, store_rel(t), 0);
      }
      CUDA_OK(cudaGetLastError());
    }
}

std::vector<int> mixed_tokens(int R, int vocab, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int> tok(static_cast<std::size_t>(R));
  // Half the rows from a few common tokens (long runs), half spread over the vocabulary.
  for (auto& v : tok) v = static_cast<int>(rng() % 2 ? rng() % 5 : rng() % static_cast<unsigned>(vocab));
  return tok;
}

TEST(CudaRows, EmbeddingsMatchTheCpuReference) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << "no GPU: " << why;
  ops::ChunkPool pool(2);
  for (DType t : kTypes)
    for (int C : {24, 30}) {
      // GPT's encoder: small vocabulary, many repeats.
      const int B = 3, T = 50, V = 37, R = B * T;
      const std::string tag = std::string(to_string(t)) + " C=" + std::to_string(C) + ": ";
      const std::size_t n = static_cast<std::size_t>(R) * C;
      Mem m;
      const std::vector<int> tok = mixed_tokens(R, V, 31);
      const VF wte = round_to(randf(static_cast<std::size_t>(V) * C, 32), t),
               wpe = round_to(randf(static_cast<std::size_t>(T) * C, 33), t), dy = round_to(randf(n, 34), t),
               dwte0 = randf(wte.size(), 35), dwpe0 = randf(wpe.size(), 36);
      int* gtok = m.upi(tok);
      VF out(n);
      ops::encoder_forward(pool, out.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
      void* gout = m.up(VF(n), t);
      fast::encoder_forward(gout, gtok, m.up(wte, t), m.up(wpe, t), B, T, C, t, nullptr);
      expect_close(tag + "encoder_forward", Mem::down(gout, n, t), out, store_rel(t), 0);
      VF dwte = dwte0, dwpe = dwpe0;
      ops::encoder_backward(pool, dwte.data(), dwpe.data(), dy.data(), tok.data(), B, T, C);
      float *gdwte = m.upf(dwte0), *gdwpe = m.upf(dwpe0);
      int* scratch = static_cast<int*>(m.alloc(fast::token_sort_ints(R) * 4));
      fast::encoder_backward(gdwte, gdwpe, m.up(dy, t), gtok, B, T, C, t, scratch, nullptr);
      expect_close(tag + "encoder dwte", Mem::down(gdwte, dwte.size(), DType::fp32), dwte, 0, 0);
      expect_close(tag + "encoder dwpe", Mem::down(gdwpe, dwpe.size(), DType::fp32), dwpe, 1e-5, 1e-6);
      // Llama's embedding: a vocabulary past 2^16 (five radix digits) and R past the sort's 512 threads.
      const int R2 = 3000, V2 = 70000;
      const std::size_t n2 = static_cast<std::size_t>(R2) * C;
      const std::vector<int> tok2 = mixed_tokens(R2, V2, 37);
      const VF e2 = round_to(randf(static_cast<std::size_t>(V2) * C, 38), t), dy2 = round_to(randf(n2, 39), t);
      VF out2(n2), de2(e2.size(), 0.0f);
      ops::embedding_forward(pool, out2.data(), tok2.data(), e2.data(), R2, C);
      int* gtok2 = m.upi(tok2);
      void* gout2 = m.up(VF(n2), t);
      fast::embedding_forward(gout2, gtok2, m.up(e2, t), R2, C, t, nullptr);
      expect_close(tag + "embedding_forward", Mem::down(gout2, n2, t), out2, 0, 0);
      ops::embedding_backward(pool, de2.data(), dy2.data(), tok2.data(), R2, C);
      float* gde2 = m.zeros(e2.size());
      int* scratch2 = static_cast<int*>(m.alloc(fast::token_sort_ints(R2) * 4));
      fast::embedding_backward(gde2, m.up(dy2, t), gtok2, R2, C, t, scratch2, nullptr);
      expect_close(tag + "embedding dwte", Mem::down(gde2, de2.size(), DType::fp32), de2, 0, 0);
      CUDA_OK(cudaGetLastError());
    }
}

TEST(CudaRows, CrossEntropyMatchesTheReference) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << "no GPU: " << why;
  for (DType t : kTypes)
    for (int V : {37, 50257, 4096}) {  // unaligned rows; aligned rows
      const int R = 9;
      const std::string tag = std::string(to_string(t)) + " V=" + std::to_string(V) + ": ";
      const std::size_t n = static_cast<std::size_t>(R) * V;
      Mem m;
      const VF logits = round_to(randf(n, 41, 3.0f), t);
      std::vector<int> tg(R);
      // Every third row masked (target -1: loss 0, no gradient).
      for (int r = 0; r < R; ++r) tg[static_cast<std::size_t>(r)] = r % 3 == 1 ? -1 : (r * 7919) % V;
      // Reference in double: probs = softmax, loss = −log p[target] (0 for a masked row).
      VF probs(n), losses(R);
      for (int r = 0; r < R; ++r) {
        const float* l = logits.data() + static_cast<std::size_t>(r) * V;
        double mx = -INFINITY, sum = 0;
        for (int v = 0; v < V; ++v) mx = std::max(mx, static_cast<double>(l[v]));
        for (int v = 0; v < V; ++v) sum += std::exp(l[v] - mx);
        for (int v = 0; v < V; ++v)
          probs[static_cast<std::size_t>(r) * V + v] = static_cast<float>(std::exp(l[v] - mx) / sum);
        const int target = tg[static_cast<std::size_t>(r)];
        losses[r] = target < 0 ? 0.0f : static_cast<float>(mx + std::log(sum) - l[target]);
      }
      void* gp = m.up(logits, t);
      float* gl = m.zeros(R);
      int* gtg = m.upi(tg);
      fast::softmax_crossentropy(gp, gl, gtg, R, V, V, t, nullptr);
      const VF gprobs = Mem::down(gp, n, t);
      expect_close(tag + "probs", gprobs, probs, store_rel(t) + 1e-5, 1e-9);
      expect_close(tag + "losses", Mem::down(gl, R, DType::fp32), losses, 1e-5, 1e-6);
      // dlogits = (probs − onehot)·dscale from the kernel's own probs: the same float operations.
      const float dscale = 1.0f / 3;
      VF dl(n);
      for (std::size_t i = 0; i < n; ++i)
        dl[i] = tg[i / V] < 0 ? 0.0f : (gprobs[i] - (static_cast<int>(i % V) == tg[i / V] ? 1.0f : 0.0f)) * dscale;
      void* gdl = m.up(VF(n), t);
      fast::crossentropy_backward(gdl, gp, gtg, dscale, R, V, V, t, nullptr);
      expect_close(tag + "dlogits", Mem::down(gdl, n, t), dl, store_rel(t), 0);
      fast::crossentropy_backward(gp, gp, gtg, dscale, R, V, V, t, nullptr);  // in place
      expect_close(tag + "dlogits in place", Mem::down(gp, n, t), dl, store_rel(t), 0);
      CUDA_OK(cudaGetLastError());
    }
}

// The LM head's rows padded as the fast kernels lay them out (model/backend.h): rows `ld` = V rounded
// up to 64 apart, the pad columns NaN. The softmax and its backward read and write the V classes of
// each row only: the results are the double reference's, and the pad is still NaN afterwards.
TEST(CudaRows, CrossEntropyStepsThroughPaddedRows) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << "no GPU: " << why;
  for (DType t : kTypes)
    for (int V : {37, 50257}) {
      const int R = 5, ld = logits_row_stride(V, LogitsRows::padded);
      ASSERT_GT(ld, V);
      const std::string tag = std::string(to_string(t)) + " V=" + std::to_string(V) + ": ";
      const std::size_t n = static_cast<std::size_t>(R) * ld;
      const auto at = [ld](int r, int v) { return static_cast<std::size_t>(r) * ld + v; };
      Mem m;
      const VF packed = round_to(randf(static_cast<std::size_t>(R) * V, 43, 3.0f), t);
      VF logits(n, std::nanf(""));
      std::vector<int> tg(R);
      for (int r = 0; r < R; ++r) {
        tg[static_cast<std::size_t>(r)] = r == 2 ? -1 : (r * 7919) % V;
        for (int v = 0; v < V; ++v) logits[at(r, v)] = packed[static_cast<std::size_t>(r) * V + v];
      }
      // Reference in double, in the padded layout (the pad stays NaN).
      VF probs(n, std::nanf("")), losses(R), dl(n, std::nanf(""));
      const float dscale = 1.0f / 3;
      for (int r = 0; r < R; ++r) {
        double mx = -INFINITY, sum = 0;
        for (int v = 0; v < V; ++v) mx = std::max(mx, static_cast<double>(logits[at(r, v)]));
        for (int v = 0; v < V; ++v) sum += std::exp(logits[at(r, v)] - mx);
        for (int v = 0; v < V; ++v) probs[at(r, v)] = static_cast<float>(std::exp(logits[at(r, v)] - mx) / sum);
        const int target = tg[static_cast<std::size_t>(r)];
        losses[static_cast<std::size_t>(r)] =
            target < 0 ? 0.0f : static_cast<float>(mx + std::log(sum) - logits[at(r, target)]);
      }
      void* gp = m.up(logits, t);
      float* gl = m.zeros(R);
      int* gtg = m.upi(tg);
      fast::softmax_crossentropy(gp, gl, gtg, R, V, ld, t, nullptr);
      const VF gprobs = Mem::down(gp, n, t);
      const auto pads_nan = [&](const VF& x, const char* what) {
        int written = 0;
        for (int r = 0; r < R; ++r)
          for (int v = V; v < ld; ++v) written += std::isnan(x[at(r, v)]) ? 0 : 1;
        EXPECT_EQ(written, 0) << tag << what << ": pad elements written";
      };
      pads_nan(gprobs, "probs");
      VF got(static_cast<std::size_t>(R) * V), want(got.size());
      const auto unpad = [&](const VF& x, VF& out) {
        for (int r = 0; r < R; ++r)
          for (int v = 0; v < V; ++v) out[static_cast<std::size_t>(r) * V + v] = x[at(r, v)];
      };
      unpad(gprobs, got);
      unpad(probs, want);
      expect_close(tag + "probs", got, want, store_rel(t) + 1e-5, 1e-9);
      expect_close(tag + "losses", Mem::down(gl, R, DType::fp32), losses, 1e-5, 1e-6);
      for (int r = 0; r < R; ++r)
        for (int v = 0; v < V; ++v) {
          const int target = tg[static_cast<std::size_t>(r)];
          dl[at(r, v)] = target < 0 ? 0.0f : (gprobs[at(r, v)] - (v == target ? 1.0f : 0.0f)) * dscale;
        }
      void* gdl = m.up(VF(n, std::nanf("")), t);
      fast::crossentropy_backward(gdl, gp, gtg, dscale, R, V, ld, t, nullptr);
      const VF gdlv = Mem::down(gdl, n, t);
      pads_nan(gdlv, "dlogits");
      unpad(gdlv, got);
      unpad(dl, want);
      expect_close(tag + "dlogits", got, want, store_rel(t), 0);
      CUDA_OK(cudaGetLastError());
    }
}

// Two runs of the reductions give the same bits. The column sums and the embedding gradients also give
// the same bits on the packed and the unpacked path (inputs one element off 16-byte alignment take the
// unpacked one): their order is fixed by R and C alone. (A row's own sums, as in dinp, are split
// across lanes by pack, so those two paths may differ in the last bits.)
TEST(CudaRows, ReductionsAreDeterministic) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << "no GPU: " << why;
  const DType t = DType::bf16;
  const int B = 8, T = 512, R = B * T, C = 768, V = 50257;
  const std::size_t n = static_cast<std::size_t>(R) * C;
  Mem m;
  const VF x = randf(n, 51), dy = randf(n, 52), w = randf(C, 53);
  const std::vector<int> tok = mixed_tokens(R, V, 54);
  void* gx = m.up(x, t);
  void* gdy = m.up(dy, t);
  void* gw = m.up(w, t);
  void* gx_off = m.up(x, t, 1);
  void* gdy_off = m.up(dy, t, 1);
  float *mean = m.zeros(R), *rstd = m.zeros(R);
  fast::layernorm_forward(m.up(VF(n), t), mean, rstd, gx, gw, gw, R, C, t, nullptr);
  float* partials = m.zeros(fast::column_partials_floats(R, C));
  int* gtok = m.upi(tok);
  int* scratch = static_cast<int*>(m.alloc(fast::token_sort_ints(R) * 4));
  std::vector<std::vector<unsigned char>> runs[3];
  for (int k = 0; k < 3; ++k) {
    const bool off = k == 2;
    void* xi = off ? gx_off : gx;
    void* dyi = off ? gdy_off : gdy;
    void* dx = m.up(VF(n), t);
    float *dw = m.zeros(C), *db = m.zeros(C), *cs = m.zeros(C);
    fast::layernorm_backward(dx, dw, db, dyi, xi, gw, mean, rstd, R, C, t, partials, nullptr);
    fast::column_sum(cs, dyi, R, C, t, partials, nullptr);
    float *dwte = m.zeros(static_cast<std::size_t>(V) * C), *dwpe = m.zeros(static_cast<std::size_t>(T) * C);
    fast::encoder_backward(dwte, dwpe, dyi, gtok, B, T, C, t, scratch, nullptr);
    const int Rs = 64;  // x as logits [64, n/64] for the softmax's row sums
    const int Vs = static_cast<int>(n / Rs);
    void* probs = m.alloc(n * 2);
    cudaMemcpy(probs, xi, n * 2, cudaMemcpyDeviceToDevice);
    float* loss = m.zeros(Rs);
    std::vector<int> tg(Rs, 5);
    fast::softmax_crossentropy(probs, loss, m.upi(tg), Rs, Vs, Vs, t, nullptr);
    runs[k] = {Mem::raw(dx, n * 2),
               Mem::raw(dw, C * 4),
               Mem::raw(db, C * 4),
               Mem::raw(cs, C * 4),
               Mem::raw(dwte, static_cast<std::size_t>(V) * C * 4),
               Mem::raw(dwpe, static_cast<std::size_t>(T) * C * 4),
               Mem::raw(loss, Rs * 4)};
    CUDA_OK(cudaGetLastError());
  }
  const char* names[] = {"layernorm dinp", "layernorm dw", "layernorm db", "column_sum", "dwte", "dwpe", "losses"};
  for (std::size_t i = 0; i < runs[0].size(); ++i) {
    EXPECT_TRUE(runs[0][i] == runs[1][i]) << names[i] << ": two runs differ";
    if (i > 0) {
      EXPECT_TRUE(runs[0][i] == runs[2][i]) << names[i] << ": packed and unpacked differ";
    }
  }
}

TEST(CudaRows, EmptyShapesLaunchNothing) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << "no GPU: " << why;
  for (DType t : kTypes) {
    fast::layernorm_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 8, t, nullptr);
    fast::layernorm_backward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 8, t, nullptr,
                             nullptr);
    fast::rmsnorm_forward(nullptr, nullptr, nullptr, nullptr, 0, 8, 1e-5f, t, nullptr);
    fast::rmsnorm_backward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 8, t, nullptr, nullptr);
    fast::column_sum(nullptr, nullptr, 0, 8, t, nullptr, nullptr);
    fast::add_bias(nullptr, nullptr, 0, 8, t, nullptr);
    fast::gelu_forward(nullptr, nullptr, 0, t, nullptr);
    fast::gelu_backward(nullptr, nullptr, nullptr, 0, t, nullptr);
    fast::add_inplace(nullptr, nullptr, 0, t, nullptr);
    fast::swiglu_forward(nullptr, nullptr, nullptr, 0, t, nullptr);
    fast::swiglu_backward(nullptr, nullptr, nullptr, nullptr, nullptr, 0, t, nullptr);
    fast::rope_apply(nullptr, nullptr, nullptr, 0, 4, 2, 8, false, t, nullptr);
    fast::encoder_forward(nullptr, nullptr, nullptr, nullptr, 0, 4, 8, t, nullptr);
    fast::encoder_backward(nullptr, nullptr, nullptr, nullptr, 0, 4, 8, t, nullptr, nullptr);
    fast::embedding_forward(nullptr, nullptr, nullptr, 0, 8, t, nullptr);
    fast::embedding_backward(nullptr, nullptr, nullptr, 0, 8, t, nullptr, nullptr);
    fast::softmax_crossentropy(nullptr, nullptr, nullptr, 0, 8, 8, t, nullptr);
    fast::crossentropy_backward(nullptr, nullptr, nullptr, 1.0f, 0, 8, 8, t, nullptr);
    fast::convert(nullptr, t, nullptr, DType::fp32, 0, nullptr);
  }
  EXPECT_EQ(fast::column_partials_floats(0, 8), 0u);
  EXPECT_EQ(fast::token_sort_ints(0), 0u);
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaGetLastError());
}

}  // namespace
}  // namespace zinf
