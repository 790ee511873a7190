// gemm_plan_test.cpp — the host-side half of the CUDA backend's GEMMs (src/backends/cuda/gemm_plan.h),
// on the CPU: stored layouts of transposed and plain operands, layout errors that name the operand, the
// alignments promised to cuBLASLt's heuristic, the algorithm-cache key, and the plans of the model's
// ops: a column-major reference GEMM with the plans' epilogues runs each plan on row-major data and
// must give what the row-major CPU reference ops give, on odd shapes (sizes not multiples of 8, one
// row), so operand order, leading dimensions, transposes, beta and epilogues are all checked.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <unordered_set>
#include <vector>

#include "common/random_floats.h"
#include "cpu/ops_gpt.h"
#include "cuda/gemm_plan.h"
#include "gemm_reference.h"
#include "model/backend.h"

namespace zinf::cuda {
namespace {

TEST(GemmPlan, StoredMatrixFollowsTheTranspose) {
  // op(A) is 6x4: untransposed it is stored 6x4, transposed it is stored 4x6.
  EXPECT_EQ(stored_matrix(false, 6, 4, 6, "A"), (StoredMatrix{6, 4, 6}));
  EXPECT_EQ(stored_matrix(true, 6, 4, 4, "A"), (StoredMatrix{4, 6, 4}));
  // A leading dimension larger than the rows (a sub-matrix) is allowed.
  EXPECT_EQ(stored_matrix(false, 6, 4, 10, "A").ld, 10);
}

TEST(GemmPlan, ModelCallsMapToConsistentLayouts) {
  // matmul_forward's column-major call: out^T[OC,R] = W^T[OC,IC] · inp^T[IC,R], no transposes.
  const int R = 8, IC = 16, OC = 48;
  const GemmKey f = make_gemm_key(false, false, OC, R, IC, nullptr, OC, nullptr, IC, 0.0f, nullptr, OC);
  EXPECT_FALSE(f.accumulate);
  // matmul_backward's dW: dW^T[OC,IC] += dout^T[OC,R] · inp[R,IC] (B transposed, stored IC x R).
  const GemmKey dw = make_gemm_key(false, true, OC, IC, R, nullptr, OC, nullptr, IC, 1.0f, nullptr, OC);
  EXPECT_TRUE(dw.accumulate);
  EXPECT_EQ(stored_matrix(true, R, IC, IC, "B"),
            (StoredMatrix{static_cast<std::uint64_t>(IC), static_cast<std::uint64_t>(R), IC}));
  // dinp: dinp^T[IC,R] += W[IC,OC] · dout^T[OC,R] (A transposed, stored OC x IC).
  EXPECT_NO_THROW(make_gemm_key(true, false, IC, R, OC, nullptr, OC, nullptr, OC, 1.0f, nullptr, IC));
}

TEST(GemmPlan, BadLayoutsNameTheOperand) {
  try {
    make_gemm_key(false, false, 8, 4, 2, nullptr, 7, nullptr, 2, 0.0f, nullptr, 8);
    FAIL() << "lda < m accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("operand A"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("leading dimension 7"), std::string::npos) << e.what();
  }
  try {
    make_gemm_key(false, true, 8, 4, 2, nullptr, 8, nullptr, 3, 0.0f, nullptr, 8);  // B stored 4x2 needs ldb >= 4
    FAIL() << "ldb < stored rows accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("operand B"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_gemm_key(false, false, 8, 4, 2, nullptr, 8, nullptr, 2, 0.0f, nullptr, 4), Error);  // ldc < m
  EXPECT_THROW(stored_matrix(false, 0, 4, 1, "A"), Error);
}

TEST(GemmPlan, AlignmentIsTheLargestPowerOfTwoUpTo256) {
  alignas(256) static float buf[1024];
  const auto* base = reinterpret_cast<const unsigned char*>(buf);
  EXPECT_EQ(pointer_alignment(base), 256u);
  EXPECT_EQ(pointer_alignment(base + 512), 256u);  // capped
  EXPECT_EQ(pointer_alignment(base + 4), 4u);
  EXPECT_EQ(pointer_alignment(base + 12), 4u);
  EXPECT_EQ(pointer_alignment(base + 16), 16u);
  EXPECT_EQ(pointer_alignment(base + 48), 16u);
  EXPECT_EQ(pointer_alignment(base + 128), 128u);
  EXPECT_EQ(pointer_alignment(base + 1), 1u);
}

TEST(GemmPlan, KeyDistinguishesWhatTheAlgorithmDependsOn) {
  alignas(256) static float buf[4096];
  const GemmKey k = make_gemm_key(false, false, 64, 32, 16, buf, 64, buf, 16, 0.0f, buf, 64);
  std::unordered_set<GemmKey, GemmKeyHash> seen{k};
  EXPECT_EQ(seen.count(make_gemm_key(false, false, 64, 32, 16, buf + 64, 64, buf, 16, 0.0f, buf, 64)), 1u)
      << "same shape, same alignment: same key";
  const GemmKey variants[] = {
      make_gemm_key(true, false, 64, 32, 16, buf, 16, buf, 16, 0.0f, buf, 64),       // transpose
      make_gemm_key(false, false, 64, 32, 16, buf, 64, buf, 16, 1.0f, buf, 64),      // accumulate
      make_gemm_key(false, false, 64, 32, 8, buf, 64, buf, 16, 0.0f, buf, 64),       // k
      make_gemm_key(false, false, 64, 32, 16, buf + 1, 64, buf, 16, 0.0f, buf, 64),  // alignment of A
      make_gemm_key(false, false, 64, 32, 16, buf, 64, buf, 16, 0.0f, buf, 80),      // ldc
  };
  for (const GemmKey& v : variants) {
    EXPECT_FALSE(v == k);
    EXPECT_TRUE(seen.insert(v).second);
  }
}

// ---- the plans of the model's ops, run by a column-major reference ----------------------------------

using gemm_ref::run_column_major;

void expect_near_all(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-5 + 1e-5 * std::fabs(want[i])) << what << " element " << i;
}

// x [rows, cols] row-major → its transpose [cols, rows].
std::vector<float> transposed(const std::vector<float>& x, int rows, int cols) {
  std::vector<float> t(x.size());
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      t[static_cast<std::size_t>(c) * rows + r] = x[static_cast<std::size_t>(r) * cols + c];
  return t;
}

struct Shape {
  int R, IC, OC;
};
// Sizes that are not multiples of 8, one row, one output feature, IC ≠ OC both ways.
constexpr Shape kShapes[] = {{1, 5, 7}, {13, 11, 9}, {3, 17, 1}, {7, 1, 6}, {10, 6, 23}};

ops::ChunkPool& pool() {
  static ops::ChunkPool p(1);
  return p;
}

TEST(GemmPlanRun, MatmulForwardMatchesTheRowMajorReference) {
  for (const Shape& s : kShapes)
    for (bool with_bias : {true, false}) {
      SCOPED_TRACE(testing::Message() << "R=" << s.R << " IC=" << s.IC << " OC=" << s.OC << " bias=" << with_bias);
      const auto inp = randf(static_cast<std::size_t>(s.R) * s.IC, 1),
                 w = randf(static_cast<std::size_t>(s.IC) * s.OC, 2), b = randf(static_cast<std::size_t>(s.OC), 3);
      std::vector<float> out(static_cast<std::size_t>(s.R) * s.OC, 99.0f), ref = out;
      const float* bias = with_bias ? b.data() : nullptr;
      const GemmCall g = matmul_forward_gemm(out.data(), inp.data(), w.data(), bias, s.R, s.IC, s.OC, DType::fp32);
      EXPECT_EQ(g.plan.epilogue, with_bias ? Epilogue::bias : Epilogue::none);
      run_column_major(g);
      ops::matmul_forward(pool(), ref.data(), inp.data(), w.data(), bias, s.R, s.IC, s.OC);
      expect_near_all(out, ref, "out");
      // Without its epilogue the GEMM leaves the bias to a separate kernel.
      std::vector<float> plain(out.size(), 99.0f);
      GemmCall bare = without_epilogue(g);
      bare.ops.c = plain.data();
      run_column_major(bare);
      if (bias)
        for (int r = 0; r < s.R; ++r)
          for (int o = 0; o < s.OC; ++o) plain[static_cast<std::size_t>(r) * s.OC + o] += bias[o];
      expect_near_all(plain, ref, "out without epilogue + bias");
    }
}

TEST(GemmPlanRun, MatmulGeluForwardKeepsThePreActivation) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(testing::Message() << "R=" << s.R << " IC=" << s.IC << " OC=" << s.OC);
    const std::size_t n = static_cast<std::size_t>(s.R) * s.OC;
    const auto inp = randf(static_cast<std::size_t>(s.R) * s.IC, 4),
               w = randf(static_cast<std::size_t>(s.IC) * s.OC, 5), b = randf(static_cast<std::size_t>(s.OC), 6);
    std::vector<float> pre(n, 7.0f), out(n, 8.0f), ref_pre(n), ref_out(n);
    const GemmCall g =
        matmul_gelu_forward_gemm(pre.data(), out.data(), inp.data(), w.data(), b.data(), s.R, s.IC, s.OC, DType::fp32);
    EXPECT_EQ(g.plan.epilogue, Epilogue::gelu_aux_bias);
    run_column_major(g);
    ops::matmul_gelu_forward(pool(), ref_pre.data(), ref_out.data(), inp.data(), w.data(), b.data(), s.R, s.IC, s.OC);
    expect_near_all(pre, ref_pre, "pre");
    expect_near_all(out, ref_out, "out");
  }
}

TEST(GemmPlanRun, MatmulBackwardMatchesTheRowMajorReference) {
  for (const Shape& s : kShapes)
    for (int variant = 0; variant < 3; ++variant) {  // 0: all, 1: dbias by column sum, 2: no dinp, no dbias
      SCOPED_TRACE(testing::Message() << "R=" << s.R << " IC=" << s.IC << " OC=" << s.OC << " variant " << variant);
      const std::size_t nin = static_cast<std::size_t>(s.R) * s.IC, nw = static_cast<std::size_t>(s.IC) * s.OC,
                        nout = static_cast<std::size_t>(s.R) * s.OC;
      const auto dout = randf(nout, 7), inp = randf(nin, 8), w = randf(nw, 9);
      // The outputs accumulate: start them non-zero.
      std::vector<float> dinp = randf(nin, 10), dw = randf(nw, 11), db = randf(static_cast<std::size_t>(s.OC), 12);
      std::vector<float> rdinp = dinp, rdw = dw, rdb = db, partial(static_cast<std::size_t>(s.OC), 5.0f);
      float* want_dinp = variant == 2 ? nullptr : dinp.data();
      const MatmulBackwardGemms g =
          matmul_backward_gemms(want_dinp, dw.data(), variant == 0 ? partial.data() : nullptr, dout.data(), inp.data(),
                                w.data(), s.R, s.IC, s.OC, DType::fp32);
      EXPECT_EQ(g.has_dinp, variant != 2);
      EXPECT_EQ(g.dbias_by_epilogue, variant == 0);
      if (g.has_dinp) {
        EXPECT_EQ(g.dinp.plan.beta, 1.0f);
        run_column_major(g.dinp);
      }
      EXPECT_EQ(g.dw.plan.beta, 1.0f);
      run_column_major(g.dw);
      if (variant == 0)
        for (int o = 0; o < s.OC; ++o) db[static_cast<std::size_t>(o)] += partial[static_cast<std::size_t>(o)];
      if (variant == 1)  // the separate column sum
        for (int r = 0; r < s.R; ++r)
          for (int o = 0; o < s.OC; ++o)
            db[static_cast<std::size_t>(o)] += dout[static_cast<std::size_t>(r) * s.OC + o];
      ops::matmul_backward(pool(), variant == 2 ? nullptr : rdinp.data(), rdw.data(),
                           variant == 2 ? nullptr : rdb.data(), dout.data(), inp.data(), w.data(), s.R, s.IC, s.OC);
      expect_near_all(dinp, rdinp, "dinp");
      expect_near_all(dw, rdw, "dw");
      expect_near_all(db, rdb, "dbias");
    }
}

// Both logits layouts (model/backend.h): rows V apart, and rows padded to a multiple of 64. The pad
// columns start as NaN and must come out as they went in: the plans neither write nor read them (a
// read would spread the NaN into dx or dwte).
TEST(GemmPlanRun, LmHeadMatchesTheRowMajorReference) {
  for (const LogitsRows rows : {LogitsRows::packed, LogitsRows::padded})
    for (const Shape& s : kShapes) {
      const int R = s.R, C = s.IC, V = s.OC + 2;  // vocabulary: odd sizes too
      const int ld = logits_row_stride(V, rows);
      SCOPED_TRACE(testing::Message() << "R=" << R << " C=" << C << " V=" << V << " ld=" << ld);
      const std::size_t nx = static_cast<std::size_t>(R) * C, ne = static_cast<std::size_t>(V) * C,
                        nl = static_cast<std::size_t>(R) * V, nld = static_cast<std::size_t>(R) * ld;
      const auto x = randf(nx, 13), wte = randf(ne, 14, 0.3f);
      std::vector<int> targets(static_cast<std::size_t>(R));
      for (int r = 0; r < R; ++r) targets[static_cast<std::size_t>(r)] = (r * 7 + 3) % V;
      const auto at = [&](int r, int v) { return static_cast<std::size_t>(r) * ld + v; };
      // Forward: the plan's logits, softmaxed here, against the reference's probabilities.
      std::vector<float> probs(nld, std::nanf("")), ref_probs(nl), losses(static_cast<std::size_t>(R));
      for (int r = 0; r < R; ++r)
        for (int v = 0; v < V; ++v) probs[at(r, v)] = 3.0f;
      run_column_major(lm_head_forward_gemm(probs.data(), x.data(), wte.data(), R, C, V, ld, DType::fp32));
      std::vector<float> packed(nl);
      for (int r = 0; r < R; ++r) {
        float* l = probs.data() + at(r, 0);
        const float mx = *std::max_element(l, l + V);
        float sum = 0;
        for (int v = 0; v < V; ++v) sum += (l[v] = std::exp(l[v] - mx));
        for (int v = 0; v < V; ++v) packed[static_cast<std::size_t>(r) * V + v] = l[v] / sum;
        for (int v = V; v < ld; ++v) EXPECT_TRUE(std::isnan(l[v])) << "row " << r << " pad column " << v << " written";
      }
      ops::lm_head_forward(pool(), ref_probs.data(), losses.data(), x.data(), wte.data(), targets.data(), R, C, V);
      expect_near_all(packed, ref_probs, "probs");
      // Backward from the reference's probabilities: dlogits as the op makes it, then the plans.
      const float dscale = 1.0f / static_cast<float>(R);
      std::vector<float> dl(nld, std::nanf("")), rdl(nl, 1.0f), dx(nx, 4.0f), rdx(nx, 4.0f);
      std::vector<float> dwte = randf(ne, 15), rdwte = dwte;
      for (int r = 0; r < R; ++r)
        for (int v = 0; v < V; ++v) {
          const std::size_t i = static_cast<std::size_t>(r) * V + v;
          dl[at(r, v)] = (ref_probs[i] - (v == targets[static_cast<std::size_t>(r)] ? 1.0f : 0.0f)) * dscale;
        }
      const LmHeadBackwardGemms g =
          lm_head_backward_gemms(dx.data(), dwte.data(), dl.data(), x.data(), wte.data(), R, C, V, ld, DType::fp32);
      EXPECT_EQ(g.dx.plan.beta, 0.0f) << "dx is overwritten";
      EXPECT_EQ(g.dwte.plan.beta, 1.0f) << "dwte accumulates";
      run_column_major(g.dx);
      run_column_major(g.dwte);
      ops::lm_head_backward(pool(), rdx.data(), rdwte.data(), rdl.data(), ref_probs.data(), x.data(), wte.data(),
                            targets.data(), dscale, R, C, V);
      std::vector<float> dl_packed(nl);
      for (int r = 0; r < R; ++r)
        for (int v = 0; v < V; ++v) dl_packed[static_cast<std::size_t>(r) * V + v] = dl[at(r, v)];
      expect_near_all(dl_packed, rdl, "dlogits");
      expect_near_all(dx, rdx, "dx");
      expect_near_all(dwte, rdwte, "dwte");
    }
}

// GPT-2's vocabulary (50257, odd) under the CUDA fast kernels' layout: the LM head's three GEMMs get
// leading dimensions that are multiples of 64 and, from a buffer that starts 256-byte aligned as the
// model lays it out (ViewCursor::take_logits), 256-byte aligned pointers, every row of a 16-bit
// buffer 128-byte aligned. With rows V apart (the other backends' layout) the same calls would get an
// odd leading dimension.
TEST(GemmPlan, LmHeadOfAnOddVocabularyGetsAlignedLeadingDimensions) {
  constexpr int V = 50257, C = 768, R = 4 * 1024;
  EXPECT_EQ(logits_rows_of(DeviceType::cuda, Kernels::fast), LogitsRows::padded);
  EXPECT_EQ(logits_rows_of(DeviceType::cuda, Kernels::reference), LogitsRows::packed);
  EXPECT_EQ(logits_rows_of(DeviceType::cpu, Kernels::fast), LogitsRows::packed);
  EXPECT_EQ(logits_rows_of(DeviceType::cpu, Kernels::reference), LogitsRows::packed);
  EXPECT_EQ(logits_row_stride(V, LogitsRows::packed), V);
  const int ld = logits_row_stride(V, logits_rows_of(DeviceType::cuda, Kernels::fast));
  EXPECT_EQ(ld, 50304);
  EXPECT_EQ(logits_row_stride(50304, LogitsRows::padded), 50304) << "a vocabulary padded by hand stays as it is";
  EXPECT_EQ(logits_row_stride(64, LogitsRows::padded), 64);
  EXPECT_EQ(logits_row_stride(65, LogitsRows::padded), 128);
  // Fake device addresses, as the allocator and the model's layout give them (only their alignment
  // is looked at: nothing runs).
  const auto addr = [](std::uintptr_t a) { return reinterpret_cast<void*>(a); };
  void *logits = addr(std::uintptr_t{1} << 30), *x = addr(std::uintptr_t{2} << 30),
       *wte = addr(std::uintptr_t{3} << 30);
  float* dwte = static_cast<float*>(addr(std::uintptr_t{4} << 30));
  void* dx = addr(std::uintptr_t{5} << 30);
  for (DType S : {DType::bf16, DType::fp16, DType::fp32}) {
    SCOPED_TRACE(to_string(S));
    const GemmCall f = lm_head_forward_gemm(logits, x, wte, R, C, V, ld, S);
    const LmHeadBackwardGemms b = lm_head_backward_gemms(dx, dwte, logits, x, wte, R, C, V, ld, S);
    EXPECT_EQ(f.plan.ldc % 64, 0);
    EXPECT_EQ(b.dx.plan.ldb % 64, 0);
    EXPECT_EQ(b.dwte.plan.ldb % 64, 0);
    EXPECT_EQ(f.plan.m, V) << "the GEMM computes the V classes only";
    EXPECT_EQ(b.dx.plan.k, V);
    EXPECT_EQ(b.dwte.plan.n, V);
    const GemmKey kf = make_gemm_key(f.plan, f.ops), kdx = make_gemm_key(b.dx.plan, b.dx.ops),
                  kdw = make_gemm_key(b.dwte.plan, b.dwte.ops);
    EXPECT_EQ(kf.align_c, 256u);
    EXPECT_EQ(kdx.align_b, 256u);
    EXPECT_EQ(kdw.align_b, 256u);
    // Every row starts 128-byte aligned in 16-bit storage (a row of an fp32 buffer: 256-byte).
    const std::size_t row_bytes = static_cast<std::size_t>(ld) * dtype_bytes(S);
    EXPECT_EQ(row_bytes % 128, 0u);
    const GemmCall packed = lm_head_forward_gemm(logits, x, wte, R, C, V, V, S);
    EXPECT_NE(packed.plan.ldc % 8, 0) << "rows V apart: not even 16-byte aligned";
  }
}

// 16-bit plans on 16-bit data: each plan's operand types must match the buffers the op hands it
// (activations and weights in S, weight gradients fp32), and each output is the fp32 reference on the
// widened inputs, rounded once to its type.
struct Half {
  DType t;
  std::vector<std::uint16_t> v;
  Half(DType type, const std::vector<float>& x) : t(type), v(x.size()) {
    for (std::size_t i = 0; i < x.size(); ++i) gemm_ref::store(t, v.data(), i, x[i]);
  }
  std::vector<float> widened() const {
    std::vector<float> x(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) x[i] = gemm_ref::load(t, v.data(), i);
    return x;
  }
};
// The reference's fp32 results rounded once to t, then widened again, against the plan's.
void expect_rounded(const Half& got, std::vector<float> want, const char* what) {
  const Half w(got.t, want);
  const std::vector<float> g = got.widened(), r = w.widened();
  for (std::size_t i = 0; i < g.size(); ++i)  // one unit in the last place: k-order sums may differ by fma-free ulps
    ASSERT_NEAR(g[i], r[i], 1e-6 + std::fabs(r[i]) / (got.t == DType::bf16 ? 128.0 : 1024.0))
        << what << " element " << i;
}

TEST(GemmPlanRun, SixteenBitPlansMatchTheReferenceRoundedOnce) {
  for (DType S : {DType::bf16, DType::fp16})
    for (const Shape& s : kShapes) {
      SCOPED_TRACE(testing::Message() << to_string(S) << " R=" << s.R << " IC=" << s.IC << " OC=" << s.OC);
      const std::size_t nin = static_cast<std::size_t>(s.R) * s.IC, nw = static_cast<std::size_t>(s.IC) * s.OC,
                        nout = static_cast<std::size_t>(s.R) * s.OC;
      const Half inp(S, randf(nin, 21)), w(S, randf(nw, 22, 0.5f)), b(S, randf(static_cast<std::size_t>(s.OC), 23));
      const auto inpf = inp.widened(), wf = w.widened(), bf = b.widened();
      // matmul_gelu_forward: pre and out in S.
      Half pre(S, std::vector<float>(nout)), out(S, std::vector<float>(nout));
      run_column_major(matmul_gelu_forward_gemm(pre.v.data(), out.v.data(), inp.v.data(), w.v.data(), b.v.data(), s.R,
                                                s.IC, s.OC, S));
      std::vector<float> rpre(nout), rout(nout);
      ops::matmul_gelu_forward(pool(), rpre.data(), rout.data(), inpf.data(), wf.data(), bf.data(), s.R, s.IC, s.OC);
      expect_rounded(pre, rpre, "pre");
      // out is GELU of the fp32 pre-activation, not of its rounded copy: within one rounding of it.
      expect_rounded(out, rout, "out");
      // matmul_backward: dinp in S (+=), dw and the bias gradient fp32.
      const Half dout(S, randf(nout, 24));
      const auto doutf = dout.widened();
      Half dinp(S, randf(nin, 25));
      std::vector<float> dinpf = dinp.widened(), dw = randf(nw, 26), rdw = dw, partial(static_cast<std::size_t>(s.OC)),
                         rdb(static_cast<std::size_t>(s.OC), 0.0f);
      const MatmulBackwardGemms g = matmul_backward_gemms(dinp.v.data(), dw.data(), partial.data(), dout.v.data(),
                                                          inp.v.data(), w.v.data(), s.R, s.IC, s.OC, S);
      run_column_major(g.dinp);
      run_column_major(g.dw);
      ops::matmul_backward(pool(), dinpf.data(), rdw.data(), rdb.data(), doutf.data(), inpf.data(), wf.data(), s.R,
                           s.IC, s.OC);
      expect_rounded(dinp, dinpf, "dinp");
      expect_near_all(dw, rdw, "dw");
      expect_near_all(partial, rdb, "bias gradient");
      // lm_head: logits and dx in S, dwte fp32.
      const int V = s.OC;
      Half logits(S, std::vector<float>(static_cast<std::size_t>(s.R) * V)), dx(S, std::vector<float>(nin));
      run_column_major(lm_head_forward_gemm(logits.v.data(), inp.v.data(), w.v.data(), s.R, s.IC, V, V, S));
      std::vector<float> rlogits(static_cast<std::size_t>(s.R) * V);
      ops::matmul_forward(pool(), rlogits.data(), inpf.data(), transposed(wf, V, s.IC).data(), nullptr, s.R, s.IC, V);
      expect_rounded(logits, rlogits, "logits");
      std::vector<float> dwte = randf(nw, 27), rdwte = transposed(dwte, V, s.IC), rdx(nin, 0.0f);
      const LmHeadBackwardGemms lm =
          lm_head_backward_gemms(dx.v.data(), dwte.data(), dout.v.data(), inp.v.data(), w.v.data(), s.R, s.IC, V, V, S);
      run_column_major(lm.dx);
      run_column_major(lm.dwte);
      // dx = dlogits·wte and dwte += dlogitsᵀ·x, with dout as dlogits [R, V] and w as wte [V, IC].
      ops::matmul_backward(pool(), rdx.data(), rdwte.data(), nullptr, doutf.data(), inpf.data(),
                           transposed(wf, V, s.IC).data(), s.R, s.IC, V);
      expect_rounded(dx, rdx, "dx");
      expect_near_all(transposed(dwte, V, s.IC), rdwte, "dwte");
    }
}

TEST(GemmPlanRun, BatchesStepThroughTheirStrides) {
  // Two matmul_forward GEMMs as one batched call equal the two calls.
  const int R = 3, IC = 5, OC = 7, nb = 2;
  const auto inp = randf(static_cast<std::size_t>(nb) * R * IC, 16),
             w = randf(static_cast<std::size_t>(nb) * IC * OC, 17);
  std::vector<float> out(static_cast<std::size_t>(nb) * R * OC), ref(out.size());
  GemmCall g = matmul_forward_gemm(out.data(), inp.data(), w.data(), nullptr, R, IC, OC, DType::fp32);
  g.plan.batch = nb, g.plan.stride_a = IC * OC, g.plan.stride_b = R * IC, g.plan.stride_c = R * OC;
  run_column_major(g);
  for (int t = 0; t < nb; ++t)
    ops::matmul_forward(pool(), ref.data() + t * R * OC, inp.data() + t * R * IC, w.data() + t * IC * OC, nullptr, R,
                        IC, OC);
  expect_near_all(out, ref, "batched out");
}

TEST(GemmPlan, SixteenBitPlansKeepWeightGradientsInFp32) {
  float f = 0;  // only the plans' types are looked at
  const GemmCall fwd = matmul_gelu_forward_gemm(&f, &f, &f, &f, &f, 3, 5, 7, DType::bf16);
  EXPECT_EQ(fwd.plan.a_type, DType::bf16);
  EXPECT_EQ(fwd.plan.b_type, DType::bf16);
  EXPECT_EQ(fwd.plan.c_type, DType::bf16);
  EXPECT_EQ(fwd.plan.bias_type, DType::bf16);
  EXPECT_EQ(fwd.plan.aux_type, DType::bf16);
  const MatmulBackwardGemms bwd = matmul_backward_gemms(&f, &f, &f, &f, &f, &f, 3, 5, 7, DType::fp16);
  EXPECT_EQ(bwd.dinp.plan.c_type, DType::fp16);
  EXPECT_EQ(bwd.dw.plan.a_type, DType::fp16);
  EXPECT_EQ(bwd.dw.plan.c_type, DType::fp32);
  const LmHeadBackwardGemms lm = lm_head_backward_gemms(&f, &f, &f, &f, &f, 3, 5, 7, 7, DType::bf16);
  EXPECT_EQ(lm.dx.plan.c_type, DType::bf16);
  EXPECT_EQ(lm.dwte.plan.c_type, DType::fp32);
}

TEST(GemmPlan, EpiloguesNeedTheirPointers) {
  float f = 0;
  GemmCall g = matmul_gelu_forward_gemm(&f, &f, &f, &f, &f, 1, 1, 1, DType::fp32);
  EXPECT_NO_THROW(validate(g.plan, g.ops));
  g.plan.beta = 1.0f;
  EXPECT_THROW(validate(g.plan, g.ops), Error) << "GELU of an accumulated sum";
  g.plan.beta = 0.0f;
  g.ops.aux = nullptr;
  EXPECT_THROW(validate(g.plan, g.ops), Error);
  MatmulBackwardGemms b = matmul_backward_gemms(nullptr, &f, &f, &f, &f, &f, 1, 1, 1, DType::fp32);
  b.dw.ops.bias_grad = nullptr;
  try {
    validate(b.dw.plan, b.dw.ops);
    FAIL() << "bgrad without its vector accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bgrad"), std::string::npos) << e.what();
  }
}

TEST(GemmPlan, KeyDistinguishesDtypesAndEpilogues) {
  alignas(256) static float buf[4096];
  const GemmCall plain = matmul_forward_gemm(buf, buf, buf, nullptr, 8, 16, 32, DType::fp32);
  const GemmCall bias = matmul_forward_gemm(buf, buf, buf, buf, 8, 16, 32, DType::fp32);
  const GemmCall bf = matmul_forward_gemm(buf, buf, buf, nullptr, 8, 16, 32, DType::bf16);
  const GemmCall gelu = matmul_gelu_forward_gemm(buf, buf, buf, buf, buf, 8, 16, 32, DType::fp32);
  std::unordered_set<GemmKey, GemmKeyHash> seen;
  for (const GemmCall* g : {&plain, &bias, &bf, &gelu}) EXPECT_TRUE(seen.insert(make_gemm_key(g->plan, g->ops)).second);
  EXPECT_EQ(seen.count(make_gemm_key(plain.plan, plain.ops)), 1u);
}

}  // namespace
}  // namespace zinf::cuda
