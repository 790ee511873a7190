// cudnn_fake_test.cpp — hand-worked checks of the CPU executor's cuDNN graph backend (cudnn.cpp): the
// graphs are built here with the backend API alone, and every expected number is worked out in the
// comments from the operations' documented semantics (matmul over the last two dims with batch
// broadcasting, pointwise with broadcasting, reductions to dims of extent 1 or in consecutive groups,
// reshapes as views of the same offsets), not taken from a run.
//
// The attention case, T = 2 tokens, D = 2, scale 1 (passed by value), causal:
//   q = [[1, 0], [0, 1]], k = [[0, 0], [0, ln 3]], v = [[1, 2], [5, 6]]
//   scores s = q·kᵀ: row 0 = (0, masked), row 1 = (0, ln 3)
//   P: row 0 = (1, 0), row 1 = (1, 3)/4;  stats = log Σ exp s: row 0 = 0, row 1 = ln 4
//   O = P·v: row 0 = (1, 2), row 1 = (1/4)(1, 2) + (3/4)(5, 6) = (4, 5)
//   Without the mask row 0 would be P = (1/2, 1/2) (q0·k1 = 0) and O = (3, 4).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "cudax/cudnn_fake.h"
#include "cudax/runtime.h"

namespace {

using Desc = cudnnBackendDescriptor_t;

// Device memory with a copy of `v`.
struct Dev {
  explicit Dev(const std::vector<float>& v) : n(v.size()) {
    EXPECT_EQ(cudaMalloc(&p, n * 4), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p, v.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~Dev() { cudaFree(p); }
  std::vector<float> get() const {
    std::vector<float> o(n);
    EXPECT_EQ(cudaMemcpy(o.data(), p, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    return o;
  }
  std::size_t n;
  void* p = nullptr;
};

// Device memory of bf16 elements holding `v` rounded (to nearest even); read back as floats.
struct Dev16 {
  explicit Dev16(const std::vector<float>& v) : n(v.size()) {
    std::vector<__nv_bfloat16> h;
    for (float f : v) h.push_back(__float2bfloat16_rn(f));
    EXPECT_EQ(cudaMalloc(&p, n * 2), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p, h.data(), n * 2, cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~Dev16() { cudaFree(p); }
  std::vector<float> get() const {
    std::vector<__nv_bfloat16> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    std::vector<float> o;
    for (__nv_bfloat16 x : h) o.push_back(__bfloat162float(x));
    return o;
  }
  std::size_t n;
  void* p = nullptr;
};

// A graph built through the backend API, every descriptor kept until the end of the test.
class G {
 public:
  G() { EXPECT_EQ(cudnnCreate(&h_), CUDNN_STATUS_SUCCESS); }
  ~G() {
    for (auto it = all_.rbegin(); it != all_.rend(); ++it) cudnnBackendDestroyDescriptor(*it);
    cudnnDestroy(h_);
  }
  Desc make(cudnnBackendDescriptorType_t t) {
    Desc d = nullptr;
    EXPECT_EQ(cudnnBackendCreateDescriptor(t, &d), CUDNN_STATUS_SUCCESS);
    all_.push_back(d);
    return d;
  }
  Desc tensor(std::int64_t uid, std::vector<std::int64_t> dims, std::vector<std::int64_t> strides, bool virt = false,
              cudnnDataType_t type = CUDNN_DATA_FLOAT, bool by_value = false) {
    Desc d = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const auto n = static_cast<std::int64_t>(dims.size());
    std::int64_t align = 4;
    EXPECT_EQ(cudnnBackendSetAttribute(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type), 0);
    EXPECT_EQ(cudnnBackendSetAttribute(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, n, dims.data()), 0);
    EXPECT_EQ(cudnnBackendSetAttribute(d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, n, strides.data()), 0);
    EXPECT_EQ(cudnnBackendSetAttribute(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid), 0);
    EXPECT_EQ(cudnnBackendSetAttribute(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align), 0);
    EXPECT_EQ(cudnnBackendSetAttribute(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt), 0);
    EXPECT_EQ(cudnnBackendSetAttribute(d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value), 0);
    EXPECT_EQ(cudnnBackendFinalize(d), CUDNN_STATUS_SUCCESS);
    return d;
  }
  Desc virt(std::vector<std::int64_t> dims, cudnnDataType_t type = CUDNN_DATA_FLOAT) {
    std::vector<std::int64_t> s(dims.size());
    std::int64_t k = 1;
    for (std::size_t i = dims.size(); i-- > 0;) s[i] = k, k *= dims[i];
    return tensor(next_++, dims, s, true, type);
  }
  Desc scalar(std::int64_t uid) { return tensor(uid, {1, 1, 1, 1}, {1, 1, 1, 1}, false, CUDNN_DATA_FLOAT, true); }
  void set(Desc d, cudnnBackendAttributeName_t n, Desc v) {
    EXPECT_EQ(cudnnBackendSetAttribute(d, n, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v), CUDNN_STATUS_SUCCESS);
  }
  void matmul(Desc a, Desc b, Desc c) {
    Desc mm = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    cudnnDataType_t f = CUDNN_DATA_FLOAT;
    EXPECT_EQ(cudnnBackendSetAttribute(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f), 0);
    EXPECT_EQ(cudnnBackendFinalize(mm), 0);
    Desc op = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, mm);
    EXPECT_EQ(cudnnBackendFinalize(op), 0);
    ops_.push_back(op);
  }
  cudnnStatus_t pw(cudnnPointwiseMode_t m, Desc x, Desc b, Desc y, Desc t = nullptr, std::int64_t axis = -1) {
    Desc p = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    cudnnDataType_t f = CUDNN_DATA_FLOAT;
    EXPECT_EQ(cudnnBackendSetAttribute(p, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &m), 0);
    EXPECT_EQ(cudnnBackendSetAttribute(p, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &f), 0);
    if (axis >= 0) {
      EXPECT_EQ(cudnnBackendSetAttribute(p, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis), 0);
    }
    EXPECT_EQ(cudnnBackendFinalize(p), 0);
    Desc op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, p);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b) set(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
    if (t) set(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    EXPECT_EQ(cudnnBackendFinalize(op), 0);
    ops_.push_back(op);
    return CUDNN_STATUS_SUCCESS;
  }
  void reshape(Desc x, Desc y) {
    Desc op = make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x);
    set(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
    EXPECT_EQ(cudnnBackendFinalize(op), 0);
    ops_.push_back(op);
  }
  void reduce(cudnnReduceTensorOp_t m, Desc x, Desc y) {
    Desc r = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    cudnnDataType_t f = CUDNN_DATA_FLOAT;
    EXPECT_EQ(cudnnBackendSetAttribute(r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &m), 0);
    EXPECT_EQ(cudnnBackendSetAttribute(r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f), 0);
    EXPECT_EQ(cudnnBackendFinalize(r), 0);
    Desc op = make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x);
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, r);
    EXPECT_EQ(cudnnBackendFinalize(op), 0);
    ops_.push_back(op);
  }
  // Finalizes the graph (its status returned), then the heuristic's first configuration as a plan.
  cudnnStatus_t build() {
    Desc g = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    EXPECT_EQ(cudnnBackendSetAttribute(g, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                       static_cast<std::int64_t>(ops_.size()), ops_.data()),
              0);
    EXPECT_EQ(cudnnBackendSetAttribute(g, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h_), 0);
    if (const cudnnStatus_t st = cudnnBackendFinalize(g); st != CUDNN_STATUS_SUCCESS) return st;
    Desc heur = make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, g);
    cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    EXPECT_EQ(cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode), 0);
    EXPECT_EQ(cudnnBackendFinalize(heur), 0);
    Desc cfg = make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    std::int64_t n = 0;
    EXPECT_EQ(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &cfg),
              0);
    EXPECT_EQ(n, 1);
    Desc engine = make(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    EXPECT_EQ(cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &engine),
              0);
    cudnnBackendNumericalNote_t notes[8];
    EXPECT_EQ(
        cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE, 8, &n, notes), 0);
    EXPECT_EQ(n, 0) << "the fake's engine is deterministic: no NONDETERMINISTIC note";
    plan_ = make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    EXPECT_EQ(cudnnBackendSetAttribute(plan_, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h_), 0);
    set(plan_, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg);
    EXPECT_EQ(cudnnBackendFinalize(plan_), 0);
    EXPECT_EQ(
        cudnnBackendGetAttribute(plan_, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &workspace_),
        0);
    return CUDNN_STATUS_SUCCESS;
  }
  // Executes with these (uid, pointer) pairs and a workspace of the plan's size (or `ws`), then waits.
  cudnnStatus_t run(std::vector<std::int64_t> uids, std::vector<void*> ptrs, bool with_workspace = true) {
    Desc pack = make(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    void* ws = nullptr;
    if (with_workspace && workspace_ > 0) {
      EXPECT_EQ(cudaMalloc(&ws, static_cast<std::size_t>(workspace_)), 0);
    }
    EXPECT_EQ(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
                                       static_cast<std::int64_t>(uids.size()), uids.data()),
              0);
    EXPECT_EQ(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                                       static_cast<std::int64_t>(ptrs.size()), ptrs.data()),
              0);
    EXPECT_EQ(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws), 0);
    EXPECT_EQ(cudnnBackendFinalize(pack), 0);
    const cudnnStatus_t st = cudnnBackendExecute(h_, plan_, pack);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    if (ws) cudaFree(ws);
    return st;
  }
  cudnnHandle_t handle() const { return h_; }
  std::int64_t workspace() const { return workspace_; }
  cudnnStatus_t execute(Desc pack) { return cudnnBackendExecute(h_, plan_, pack); }

 private:
  cudnnHandle_t h_ = nullptr;
  std::vector<Desc> all_, ops_;
  Desc plan_ = nullptr;
  std::int64_t workspace_ = 0;
  std::int64_t next_ = 1000;
};

constexpr std::int64_t kQ = 1, kK = 2, kV = 3, kO = 4, kStats = 5, kScale = 6, kNegInf = 7, kDO = 8, kDQ = 9, kDK = 10,
                       kDV = 11, kKt = 12, kQt = 13, kOt = 14, kDOt = 15;
const float kLn3 = std::log(3.0f);

// The causal forward over [B, H, T, D] tensors whose rows are `row` elements apart (head h at column
// h·D), KV key/value heads; returns the finalize status.
cudnnStatus_t forward_graph(G& g, std::int64_t B, std::int64_t H, std::int64_t KV, std::int64_t T, std::int64_t D,
                            std::int64_t row) {
  const std::vector<std::int64_t> tt{B, H, T, T}, st{B, H, T, 1};
  Desc q = g.tensor(kQ, {B, H, T, D}, {T * row, D, row, 1});
  Desc kt = g.tensor(kK, {B, KV, D, T}, {T * row, D, 1, row});
  Desc v = g.tensor(kV, {B, KV, T, D}, {T * row, D, row, 1});
  Desc o = g.tensor(kO, {B, H, T, D}, {T * H * D, D, H * D, 1});
  Desc stats = g.tensor(kStats, st, {H * T, T, 1, 1});
  Desc s = g.virt(tt), ss = g.virt(tt), ri = g.virt(tt, CUDNN_DATA_INT32), ci = g.virt(tt, CUDNN_DATA_INT32),
       keep = g.virt(tt, CUDNN_DATA_BOOLEAN), sm = g.virt(tt), mx = g.virt(st), sub = g.virt(tt), e = g.virt(tt),
       l = g.virt(st), lg = g.virt(st), p = g.virt(tt);
  g.matmul(q, kt, s);
  g.pw(CUDNN_POINTWISE_MUL, s, g.scalar(kScale), ss);
  g.pw(CUDNN_POINTWISE_GEN_INDEX, ss, nullptr, ri, nullptr, 2);
  g.pw(CUDNN_POINTWISE_GEN_INDEX, ss, nullptr, ci, nullptr, 3);
  g.pw(CUDNN_POINTWISE_CMP_GE, ri, ci, keep);
  g.pw(CUDNN_POINTWISE_BINARY_SELECT, ss, g.scalar(kNegInf), sm, keep);
  g.reduce(CUDNN_REDUCE_TENSOR_MAX, sm, mx);
  g.pw(CUDNN_POINTWISE_SUB, sm, mx, sub);
  g.pw(CUDNN_POINTWISE_EXP, sub, nullptr, e);
  g.reduce(CUDNN_REDUCE_TENSOR_ADD, e, l);
  g.pw(CUDNN_POINTWISE_LOG, l, nullptr, lg);
  g.pw(CUDNN_POINTWISE_ADD, mx, lg, stats);
  g.pw(CUDNN_POINTWISE_DIV, e, l, p);
  g.matmul(p, v, o);
  return g.build();
}

void expect_near(const std::vector<float>& got, const std::vector<float>& want, float tol = 1e-6f) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
}

TEST(CudnnFake, CausalForwardWithStatistics) {
  G g;
  ASSERT_EQ(forward_graph(g, 1, 1, 1, 2, 2, 2), CUDNN_STATUS_SUCCESS);
  Dev q({1, 0, 0, 1}), k({0, 0, 0, kLn3}), v({1, 2, 5, 6}), o(std::vector<float>(4, NAN)), st({NAN, NAN});
  float scale = 1.0f, neg = -INFINITY;
  ASSERT_EQ(g.run({kQ, kK, kV, kO, kStats, kScale, kNegInf}, {q.p, k.p, v.p, o.p, st.p, &scale, &neg}),
            CUDNN_STATUS_SUCCESS);
  expect_near(o.get(), {1, 2, 4, 5}, 1e-5f);          // row 0 masked to key 0; row 1 = (1/4, 3/4)·v
  expect_near(st.get(), {0, std::log(4.0f)}, 1e-6f);  // log Σ exp: ln 1, ln(1 + 3)
}

TEST(CudnnFake, ScaleIsReadByValueAtTheCall) {
  // scale 2 doubles every score: row 1 = (0, 2 ln 3) → P = (1, 9)/10, O1 = (1 + 45, 2 + 54)/10,
  // stats1 = ln 10. The scale's variable is overwritten right after the call: the call read it.
  G g;
  ASSERT_EQ(forward_graph(g, 1, 1, 1, 2, 2, 2), CUDNN_STATUS_SUCCESS);
  Dev q({1, 0, 0, 1}), k({0, 0, 0, kLn3}), v({1, 2, 5, 6}), o(std::vector<float>(4, NAN)), st({NAN, NAN});
  float scale = 2.0f, neg = -INFINITY;
  ASSERT_EQ(g.run({kQ, kK, kV, kO, kStats, kScale, kNegInf}, {q.p, k.p, v.p, o.p, st.p, &scale, &neg}),
            CUDNN_STATUS_SUCCESS);
  scale = 100.0f;
  expect_near(o.get(), {1, 2, 4.6f, 5.6f}, 1e-5f);
  expect_near(st.get(), {0, std::log(10.0f)}, 1e-6f);
  // What the call read, as cudnn_fake.h reports it: kScale (uid 6) then kNegInf (uid 7).
  EXPECT_EQ(zinf::cudax::cudnn_fake_last_scalars(), (std::vector<float>{2.0f, -INFINITY}));
}

TEST(CudnnFake, StridedRowsAndGroupedHeads) {
  // B 1, H 2 query heads over KV 1 key/value head, rows 4 elements apart (q, k and v each hold two
  // heads' columns; the KV tensors read only the first D of each row). Head 0's query is the case
  // above; head 1's query is zero, so its scores are all 0: row 0 = (1, masked) → O = (1, 2), row 1 =
  // (1/2, 1/2) → O = (3, 4), stats = (0, ln 2). Out [T, H·D].
  G g;
  ASSERT_EQ(forward_graph(g, 1, 2, 1, 2, 2, 4), CUDNN_STATUS_SUCCESS);
  Dev q({1, 0, 0, 0, 0, 1, 0, 0}), k({0, 0, 99, 99, 0, kLn3, 99, 99}), v({1, 2, 99, 99, 5, 6, 99, 99});
  Dev o(std::vector<float>(8, NAN)), st(std::vector<float>(4, NAN));
  float scale = 1.0f, neg = -INFINITY;
  ASSERT_EQ(g.run({kQ, kK, kV, kO, kStats, kScale, kNegInf}, {q.p, k.p, v.p, o.p, st.p, &scale, &neg}),
            CUDNN_STATUS_SUCCESS);
  expect_near(o.get(), {1, 2, 1, 2, 4, 5, 3, 4}, 1e-5f);                 // [t][h][d]
  expect_near(st.get(), {0, std::log(4.0f), 0, std::log(2.0f)}, 1e-6f);  // [h][t]
}

// A sliding window's left bound in cudnn-frontend's band form: keep s[i][j] where j + W > i — the
// column index (INT32) plus the by-value W (a float) into a float tensor, CMP_GT the row index — else
// the by-value mask value. s = [[1, 2, 3], [4, 5, 6], [7, 8, 9]], mask -100:
//   W = 2: only (2, 0) fails (0 + 2 > 2 is false: the comparison is strict) → 1 … 6, -100, 8, 9
//   W = 1: j > i - 1 fails at (1, 0), (2, 0), (2, 1) → 1, 2, 3, -100, 5, 6, -100, -100, 9
// The same plan runs both windows: W is read at each call.
TEST(CudnnFake, BandMaskAddsTheWindowToTheColumnAndComparesStrictly) {
  G g;
  const std::vector<std::int64_t> tt{1, 1, 3, 3}, dense{9, 9, 3, 1};
  const std::int64_t kWindow = 20;
  Desc s = g.tensor(kQ, tt, dense), out = g.tensor(kO, tt, dense);
  Desc row = g.virt(tt, CUDNN_DATA_INT32), col = g.virt(tt, CUDNN_DATA_INT32), shifted = g.virt(tt),
       keep = g.virt(tt, CUDNN_DATA_BOOLEAN);
  g.pw(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, row, nullptr, 2);
  g.pw(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, col, nullptr, 3);
  g.pw(CUDNN_POINTWISE_ADD, col, g.scalar(kWindow), shifted);
  g.pw(CUDNN_POINTWISE_CMP_GT, shifted, row, keep);
  g.pw(CUDNN_POINTWISE_BINARY_SELECT, s, g.scalar(kNegInf), out, keep);
  ASSERT_EQ(g.build(), CUDNN_STATUS_SUCCESS);
  Dev sd({1, 2, 3, 4, 5, 6, 7, 8, 9}), od(std::vector<float>(9, NAN));
  float mask = -100, window = 2;
  ASSERT_EQ(g.run({kQ, kO, kNegInf, kWindow}, {sd.p, od.p, &mask, &window}), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(od.get(), (std::vector<float>{1, 2, 3, 4, 5, 6, -100, 8, 9}));
  window = 1;
  ASSERT_EQ(g.run({kQ, kO, kNegInf, kWindow}, {sd.p, od.p, &mask, &window}), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(od.get(), (std::vector<float>{1, 2, 3, -100, 5, 6, -100, -100, 9}));
}

TEST(CudnnFake, BackwardGradients) {
  // The forward case, dO = [[1, 0], [0, 1]], with O = [[1, 2], [4, 5]] and stats (0, ln 4) from above.
  //   dV_j = Σ_i P[i, j]·dO_i: dV0 = (1, 0) + (1/4)(0, 1) = (1, 1/4);  dV1 = (3/4)(0, 1) = (0, 3/4)
  //   dP[i, j] = dO_i·v_j: dP00 = 1, dP10 = 2, dP11 = 6;  Δ_i = dO_i·O_i: Δ0 = 1, Δ1 = 5
  //   dS = P∘(dP - Δ): dS00 = 0, dS10 = (1/4)(2 - 5) = -3/4, dS11 = (3/4)(6 - 5) = 3/4
  //   dQ_i = Σ_j dS[i, j]·k_j: dQ0 = 0, dQ1 = (3/4)(0, ln 3)
  //   dK_j = Σ_i dS[i, j]·q_i: dK0 = (-3/4)(0, 1), dK1 = (3/4)(0, 1)
  // Built in the [key j, query i] orientation: Sᵀ = K·Qᵀ, Pᵀ = exp(Sᵀ - statsᵀ), dV = Pᵀ·dO,
  // dPᵀ = V·dOᵀ, Δ = Σ_d (dOᵀ∘Oᵀ), dSᵀ = Pᵀ∘(dPᵀ - Δ), dK = dSᵀ·Q, dQᵀ = Kᵀ·dSᵀ.
  G g;
  const std::int64_t T = 2, D = 2;
  const std::vector<std::int64_t> tt{1, 1, T, T}, plain{T * D, T * D, D, 1}, trans{T * D, T * D, 1, D};
  Desc k = g.tensor(kK, {1, 1, T, D}, plain), kt = g.tensor(kKt, {1, 1, D, T}, trans);
  Desc q = g.tensor(kQ, {1, 1, T, D}, plain), qt = g.tensor(kQt, {1, 1, D, T}, trans);
  Desc v = g.tensor(kV, {1, 1, T, D}, plain), ot = g.tensor(kOt, {1, 1, D, T}, trans);
  Desc dout = g.tensor(kDO, {1, 1, T, D}, plain), doutt = g.tensor(kDOt, {1, 1, D, T}, trans);
  Desc statst = g.tensor(kStats, {1, 1, 1, T}, {T, T, T, 1});
  Desc dqt = g.tensor(kDQ, {1, 1, D, T}, trans), dk = g.tensor(kDK, {1, 1, T, D}, plain),
       dv = g.tensor(kDV, {1, 1, T, D}, plain);
  Desc s = g.virt(tt), ss = g.virt(tt), ri = g.virt(tt, CUDNN_DATA_INT32), ci = g.virt(tt, CUDNN_DATA_INT32),
       keep = g.virt(tt, CUDNN_DATA_BOOLEAN), sm = g.virt(tt), sub = g.virt(tt), p = g.virt(tt), dp = g.virt(tt),
       prod = g.virt({1, 1, D, T}), delta = g.virt({1, 1, 1, T}), diff = g.virt(tt), ds = g.virt(tt);
  g.matmul(k, qt, s);
  g.pw(CUDNN_POINTWISE_MUL, s, g.scalar(kScale), ss);
  g.pw(CUDNN_POINTWISE_GEN_INDEX, ss, nullptr, ri, nullptr, 2);
  g.pw(CUDNN_POINTWISE_GEN_INDEX, ss, nullptr, ci, nullptr, 3);
  g.pw(CUDNN_POINTWISE_CMP_LE, ri, ci, keep);
  g.pw(CUDNN_POINTWISE_BINARY_SELECT, ss, g.scalar(kNegInf), sm, keep);
  g.pw(CUDNN_POINTWISE_SUB, sm, statst, sub);
  g.pw(CUDNN_POINTWISE_EXP, sub, nullptr, p);
  g.matmul(p, dout, dv);
  g.matmul(v, doutt, dp);
  g.pw(CUDNN_POINTWISE_MUL, doutt, ot, prod);
  g.reduce(CUDNN_REDUCE_TENSOR_ADD, prod, delta);
  g.pw(CUDNN_POINTWISE_SUB, dp, delta, diff);
  g.pw(CUDNN_POINTWISE_MUL, p, diff, ds);
  g.matmul(ds, q, dk);
  g.matmul(kt, ds, dqt);
  ASSERT_EQ(g.build(), CUDNN_STATUS_SUCCESS);
  Dev qd({1, 0, 0, 1}), kd({0, 0, 0, kLn3}), vd({1, 2, 5, 6}), od({1, 2, 4, 5}), dod({1, 0, 0, 1});
  Dev std_({0, std::log(4.0f)}), dq(std::vector<float>(4, NAN)), dkd(std::vector<float>(4, NAN)),
      dvd(std::vector<float>(4, NAN));
  float scale = 1.0f, neg = -INFINITY;
  ASSERT_EQ(g.run({kK, kKt, kQ, kQt, kV, kOt, kDO, kDOt, kStats, kDQ, kDK, kDV, kScale, kNegInf},
                  {kd.p, kd.p, qd.p, qd.p, vd.p, od.p, dod.p, dod.p, std_.p, dq.p, dkd.p, dvd.p, &scale, &neg}),
            CUDNN_STATUS_SUCCESS);
  expect_near(dvd.get(), {1, 0.25f, 0, 0.75f}, 1e-6f);
  expect_near(dkd.get(), {0, -0.75f, 0, 0.75f}, 1e-6f);
  expect_near(dq.get(), {0, 0, 0, 0.75f * kLn3}, 1e-6f);
}

TEST(CudnnFake, SixteenBitVirtualTensorsHoldRoundedValues) {
  // y = identity of a bf16 virtual holding identity(x). bf16 keeps 7 fraction bits, so the neighbours
  // above 1 are 1, 1 + 2^-7, 1 + 2^-6: 1 + 2^-9 rounds to 1, 1 + 2^-7 + 2^-9 to 1 + 2^-7, and
  // 1 + 3·2^-8, halfway between the last two, to the even one, 1 + 2^-6.
  G g;
  Desc x = g.tensor(kQ, {1, 1, 1, 2}, {2, 2, 2, 1}), y = g.tensor(kO, {1, 1, 1, 2}, {2, 2, 2, 1});
  Desc mid = g.virt({1, 1, 1, 2}, CUDNN_DATA_BFLOAT16);
  g.pw(CUDNN_POINTWISE_IDENTITY, x, nullptr, mid);
  g.pw(CUDNN_POINTWISE_IDENTITY, mid, nullptr, y);
  Desc x3 = g.tensor(kK, {1, 1, 1, 1}, {1, 1, 1, 1}), y3 = g.tensor(kV, {1, 1, 1, 1}, {1, 1, 1, 1});
  Desc mid3 = g.virt({1, 1, 1, 1}, CUDNN_DATA_BFLOAT16);
  g.pw(CUDNN_POINTWISE_IDENTITY, x3, nullptr, mid3);
  g.pw(CUDNN_POINTWISE_IDENTITY, mid3, nullptr, y3);
  ASSERT_EQ(g.build(), CUDNN_STATUS_SUCCESS);
  Dev xd({1.0f + std::ldexp(1.0f, -9), 1.0f + std::ldexp(1.0f, -7) + std::ldexp(1.0f, -9)}), yd({NAN, NAN});
  Dev x3d({1.0f + 3 * std::ldexp(1.0f, -8)}), y3d({NAN});
  ASSERT_EQ(g.run({kQ, kO, kK, kV}, {xd.p, yd.p, x3d.p, y3d.p}), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(yd.get(), (std::vector<float>{1.0f, 1.0f + std::ldexp(1.0f, -7)}));
  EXPECT_EQ(y3d.get(), (std::vector<float>{1.0f + std::ldexp(1.0f, -6)}));
}

TEST(CudnnFake, ReshapeTransposesAVirtualTensorRoundingToItsType) {
  // P = [[1, 2, 3], [4, 5, 1 + 2^-9]] ([T_q 2, T_kv 3], a virtual fp32 tensor with dense strides
  // {3, 1}) reshaped to Pᵀ: dims [3, 2], strides {1, 3} — the same offsets, Pᵀ[j][i] = P[i][j] — in
  // bf16, as the frontend's backward makes its 16-bit Pᵀ. bf16 holds 1, 2, 3, 4, 5 but not 1 + 2^-9,
  // which rounds to 1 (its neighbours are 1 and 1 + 2^-7). So
  //   Pᵀ = [[1, 4], [2, 5], [3, 1]]                           (copied out through an identity)
  //   Pᵀ·(1, 1)ᵀ = (1 + 4, 2 + 5, 3 + 1) = (5, 7, 4)          (the rounded 1, not 1 + 2^-9, is summed)
  G g;
  Desc a = g.tensor(kQ, {1, 1, 2, 3}, {6, 6, 3, 1});
  Desc p = g.virt({1, 1, 2, 3});
  Desc pt = g.tensor(2000, {1, 1, 3, 2}, {6, 6, 1, 3}, true, CUDNN_DATA_BFLOAT16);
  Desc out = g.tensor(kO, {1, 1, 3, 2}, {6, 6, 2, 1});
  Desc ones = g.tensor(kDO, {1, 1, 2, 1}, {2, 2, 1, 1}), sums = g.tensor(kDV, {1, 1, 3, 1}, {3, 3, 1, 1});
  g.pw(CUDNN_POINTWISE_IDENTITY, a, nullptr, p);
  g.reshape(p, pt);
  g.pw(CUDNN_POINTWISE_IDENTITY, pt, nullptr, out);
  g.matmul(pt, ones, sums);
  ASSERT_EQ(g.build(), CUDNN_STATUS_SUCCESS);
  Dev ad({1, 2, 3, 4, 5, 1.0f + std::ldexp(1.0f, -9)}), od(std::vector<float>(6, NAN)), onesd({1, 1}),
      sd({NAN, NAN, NAN});
  ASSERT_EQ(g.run({kQ, kO, kDO, kDV}, {ad.p, od.p, onesd.p, sd.p}), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(od.get(), (std::vector<float>{1, 4, 2, 5, 3, 1}));
  EXPECT_EQ(sd.get(), (std::vector<float>{5, 7, 4}));
}

TEST(CudnnFake, ReshapeWritesANonVirtualViewAtItsOwnOffsets) {
  // K's rows are 4 elements apart in memory (T 3 rows of D 2, then 2 padding elements): Kᵀ is the
  // non-virtual [D 2, T 3] with strides {1, 4} (Kᵀ[d][s] at 4s + d), and the RESHAPE's non-virtual
  // output is K: [T 3, D 2], strides {4, 1} (K[s][d] at 4s + d). Both span the offsets
  // {0, 1, 4, 5, 8, 9}: the output gets the input's values there and nothing elsewhere — the padding
  // (99 in the input, NaN in the output) is neither read nor written.
  G g;
  Desc kt = g.tensor(kKt, {1, 1, 2, 3}, {12, 12, 1, 4}), k = g.tensor(kK, {1, 1, 3, 2}, {12, 12, 4, 1});
  g.reshape(kt, k);
  ASSERT_EQ(g.build(), CUDNN_STATUS_SUCCESS);
  Dev in({1, 2, 99, 99, 3, 4, 99, 99, 5, 6, 99, 99}), out(std::vector<float>(12, NAN));
  ASSERT_EQ(g.run({kKt, kK}, {in.p, out.p}), CUDNN_STATUS_SUCCESS);
  const std::vector<float> got = out.get();
  const std::vector<float> want{1, 2, NAN, NAN, 3, 4, NAN, NAN, 5, 6, NAN, NAN};
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << "element " << i << " is padding, never written";
    } else {
      EXPECT_EQ(got[i], want[i]) << "element " << i;
    }
  }
}

TEST(CudnnFake, MatmulReadsEachOperandAsItsOwnType) {
  // The backward's dQ = dS·K with dS a virtual fp32 tensor and K the bf16 RESHAPE of the non-virtual
  // bf16 Kᵀ (strides {1, 2}: K row-major in memory).
  //   dS = [[1 + 2^-9, 0, 0], [0, 1, 1]] (fp32 holds 1 + 2^-9; bf16 would not)
  //   K  = [[1, 0], [2, 3], [0.5, -1]]   (all exact in bf16)
  //   dQ row 0 = (1 + 2^-9)·(1, 0) = (1 + 2^-9, 0); row 1 = (2, 3) + (0.5, -1) = (2.5, 2)
  // into fp32 dQ exactly, and into a bf16 virtual dQ (then copied out) rounded: 1 + 2^-9 → 1.
  G g;
  Desc dsin = g.tensor(kDO, {1, 1, 2, 3}, {6, 6, 3, 1}), ds = g.virt({1, 1, 2, 3});
  Desc kt = g.tensor(kKt, {1, 1, 2, 3}, {6, 6, 1, 2}, false, CUDNN_DATA_BFLOAT16);
  Desc k = g.tensor(2000, {1, 1, 3, 2}, {6, 6, 2, 1}, true, CUDNN_DATA_BFLOAT16);
  Desc dq = g.tensor(kDQ, {1, 1, 2, 2}, {4, 4, 2, 1}), dq16 = g.virt({1, 1, 2, 2}, CUDNN_DATA_BFLOAT16);
  Desc out16 = g.tensor(kO, {1, 1, 2, 2}, {4, 4, 2, 1});
  g.pw(CUDNN_POINTWISE_IDENTITY, dsin, nullptr, ds);
  g.reshape(kt, k);
  g.matmul(ds, k, dq);
  g.matmul(ds, k, dq16);
  g.pw(CUDNN_POINTWISE_IDENTITY, dq16, nullptr, out16);
  ASSERT_EQ(g.build(), CUDNN_STATUS_SUCCESS);
  const float one_plus = 1.0f + std::ldexp(1.0f, -9);
  Dev dsd({one_plus, 0, 0, 0, 1, 1}), dqd(std::vector<float>(4, NAN)), o16(std::vector<float>(4, NAN));
  Dev16 ktd({1, 0, 2, 3, 0.5f, -1});
  ASSERT_EQ(g.run({kDO, kKt, kDQ, kO}, {dsd.p, ktd.p, dqd.p, o16.p}), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(dqd.get(), (std::vector<float>{one_plus, 0, 2.5f, 2}));
  EXPECT_EQ(o16.get(), (std::vector<float>{1, 0, 2.5f, 2}));
}

TEST(CudnnFake, GroupedReductionSumsConsecutiveHeads) {
  // dK from per-query-head rows: x [B 1, H_q 4, T 1, D 2] → y [1, H_k 2, 1, 2], G = 2. Key/value head
  // o sums query heads 2o and 2o + 1 (query head h reads key/value head h / G, as the matmul groups):
  //   heads (1, 2), (10, 20), (100, 200), (1000, 2000) → (11, 22), (1100, 2200).
  // The interleaved grouping (h mod H_k) would give (101, 202), (1010, 2020).
  {
    G g;
    Desc x = g.tensor(kQ, {1, 4, 1, 2}, {8, 2, 2, 1}), fh = g.virt({1, 4, 1, 2});
    Desc y = g.tensor(kDK, {1, 2, 1, 2}, {4, 2, 2, 1});
    g.pw(CUDNN_POINTWISE_IDENTITY, x, nullptr, fh);
    g.reduce(CUDNN_REDUCE_TENSOR_ADD, fh, y);
    ASSERT_EQ(g.build(), CUDNN_STATUS_SUCCESS);
    Dev xd({1, 2, 10, 20, 100, 200, 1000, 2000}), yd(std::vector<float>(4, NAN));
    ASSERT_EQ(g.run({kQ, kDK}, {xd.p, yd.p}), CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(yd.get(), (std::vector<float>{11, 22, 1100, 2200}));
  }
  // Summed in fp32, one rounding to a bf16 y: heads (1, 2^-9, 1, 3·2^-8), G = 2 →
  //   1 + 2^-9 → 1 (neighbours 1 and 1 + 2^-7), 1 + 3·2^-8 → halfway between 1 + 2^-7 and 1 + 2^-6,
  //   to the even one, 1 + 2^-6.
  G g;
  Desc x = g.tensor(kQ, {1, 4, 1, 1}, {4, 1, 1, 1}), fh = g.virt({1, 4, 1, 1});
  Desc y = g.tensor(kDK, {1, 2, 1, 1}, {2, 1, 1, 1}, false, CUDNN_DATA_BFLOAT16);
  g.pw(CUDNN_POINTWISE_IDENTITY, x, nullptr, fh);
  g.reduce(CUDNN_REDUCE_TENSOR_ADD, fh, y);
  ASSERT_EQ(g.build(), CUDNN_STATUS_SUCCESS);
  Dev xd({1, std::ldexp(1.0f, -9), 1, 3 * std::ldexp(1.0f, -8)});
  Dev16 yd({NAN, NAN});
  ASSERT_EQ(g.run({kQ, kDK}, {xd.p, yd.p}), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(yd.get(), (std::vector<float>{1, 1 + std::ldexp(1.0f, -6)}));
}

TEST(CudnnFake, RefusesReshapesThatAreNotViewsAndReductionsThatDoNotGroup) {
  auto reshape_status = [](std::vector<std::int64_t> xd, std::vector<std::int64_t> xs, std::vector<std::int64_t> yd,
                           std::vector<std::int64_t> ys) {
    G g;
    g.reshape(g.tensor(kQ, xd, xs), g.tensor(kO, yd, ys));
    return g.build();
  };
  // 6 elements into 4.
  EXPECT_EQ(reshape_status({1, 1, 2, 3}, {6, 6, 3, 1}, {1, 1, 2, 2}, {4, 4, 2, 1}), CUDNN_STATUS_BAD_PARAM);
  // y's offsets {0, 1, 3, 4, 6, 7}: 6 and 7 lie past x's {0 … 5}.
  EXPECT_EQ(reshape_status({1, 1, 2, 3}, {6, 6, 3, 1}, {1, 1, 3, 2}, {6, 6, 3, 1}), CUDNN_STATUS_BAD_PARAM);
  // x's offsets {0, 1, 4, 5}, y's {0, 1, 2, 3}: 2 and 3 are inside x's span but not x's elements.
  EXPECT_EQ(reshape_status({1, 1, 2, 2}, {8, 8, 4, 1}, {1, 1, 4, 1}, {8, 8, 1, 1}), CUDNN_STATUS_BAD_PARAM);
  // The same 4 offsets in another order of dims is a view.
  EXPECT_EQ(reshape_status({1, 1, 2, 2}, {8, 8, 4, 1}, {1, 1, 2, 2}, {8, 8, 1, 4}), CUDNN_STATUS_SUCCESS);
  {
    G g;  // a RESHAPE without its output, and an attribute a RESHAPE does not have
    Desc op = g.make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    Desc x = g.tensor(kQ, {1, 1, 1, 2}, {2, 2, 2, 1});
    g.set(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x);
    EXPECT_EQ(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x),
              CUDNN_STATUS_NOT_SUPPORTED);
    EXPECT_EQ(cudnnBackendFinalize(op), CUDNN_STATUS_BAD_PARAM);
  }
  auto reduce_status = [](cudnnReduceTensorOp_t m, std::vector<std::int64_t> yd, std::vector<std::int64_t> ys) {
    G g;
    g.reduce(m, g.tensor(kQ, {1, 4, 1, 2}, {8, 2, 2, 1}), g.tensor(kO, yd, ys));
    return g.build();
  };
  EXPECT_EQ(reduce_status(CUDNN_REDUCE_TENSOR_ADD, {1, 3, 1, 2}, {6, 2, 2, 1}), CUDNN_STATUS_BAD_PARAM);  // 3 ∤ 4
  EXPECT_EQ(reduce_status(CUDNN_REDUCE_TENSOR_MAX, {1, 2, 1, 2}, {4, 2, 2, 1}), CUDNN_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(reduce_status(CUDNN_REDUCE_TENSOR_ADD, {1, 2, 1, 2}, {4, 2, 2, 1}), CUDNN_STATUS_SUCCESS);
}

TEST(CudnnFake, RefusesWhatItDoesNotImplement) {
  G g;
  Desc d = nullptr;
  EXPECT_EQ(cudnnBackendCreateDescriptor(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, &d), CUDNN_STATUS_NOT_SUPPORTED);
  // A pointwise mode outside the attention graphs: the graph is refused when finalized.
  Desc x = g.tensor(kQ, {1, 1, 1, 2}, {2, 2, 2, 1}), y = g.tensor(kO, {1, 1, 1, 2}, {2, 2, 2, 1});
  g.pw(CUDNN_POINTWISE_TANH_FWD, x, nullptr, y);
  EXPECT_EQ(g.build(), CUDNN_STATUS_NOT_SUPPORTED);
  // A wrong attribute type, and setting a finalized descriptor.
  Desc t = g.make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  float wrong = 1;
  EXPECT_EQ(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_FLOAT, 1, &wrong),
            CUDNN_STATUS_BAD_PARAM);
  std::int64_t uid = 5;
  EXPECT_EQ(cudnnBackendSetAttribute(x, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid),
            CUDNN_STATUS_BAD_PARAM);
}

// A pointwise descriptor's math precision: FLOAT for every mode, BOOLEAN for the comparisons only.
TEST(CudnnFake, ComparisonsTakeABooleanMathPrecisionOthersDoNot) {
  const auto finalize_with = [](cudnnPointwiseMode_t m, cudnnDataType_t prec) {
    cudnnBackendDescriptor_t p = nullptr;
    EXPECT_EQ(cudnnBackendCreateDescriptor(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, &p), CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(cudnnBackendSetAttribute(p, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &m), 0);
    EXPECT_EQ(cudnnBackendSetAttribute(p, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec), 0);
    const cudnnStatus_t st = cudnnBackendFinalize(p);
    cudnnBackendDestroyDescriptor(p);
    return st;
  };
  EXPECT_EQ(finalize_with(CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(finalize_with(CUDNN_POINTWISE_CMP_LE, CUDNN_DATA_BOOLEAN), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(finalize_with(CUDNN_POINTWISE_CMP_GT, CUDNN_DATA_BOOLEAN), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(finalize_with(CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_FLOAT), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(finalize_with(CUDNN_POINTWISE_MUL, CUDNN_DATA_BOOLEAN), CUDNN_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(finalize_with(CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_HALF), CUDNN_STATUS_NOT_SUPPORTED);
}

TEST(CudnnFake, ExecuteChecksMemoryWorkspaceAndAlignment) {
  G g;
  ASSERT_EQ(forward_graph(g, 1, 1, 1, 2, 2, 2), CUDNN_STATUS_SUCCESS);
  Dev q({1, 0, 0, 1}), k({0, 0, 0, kLn3}), v({1, 2, 5, 6}), o(std::vector<float>(4, NAN)), st({NAN, NAN});
  float scale = 1.0f, neg = -INFINITY;
  const std::vector<std::int64_t> uids{kQ, kK, kV, kO, kStats, kScale, kNegInf};
  // No workspace where the plan asked for one.
  EXPECT_EQ(g.run(uids, {q.p, k.p, v.p, o.p, st.p, &scale, &neg}, false), CUDNN_STATUS_BAD_PARAM);
  // Host memory for a device tensor.
  std::vector<float> host(4, 0);
  EXPECT_EQ(g.run(uids, {host.data(), k.p, v.p, o.p, st.p, &scale, &neg}), CUDNN_STATUS_BAD_PARAM);
  // A tensor missing from the variant pack.
  EXPECT_EQ(g.run({kQ, kK, kV, kO, kScale, kNegInf}, {q.p, k.p, v.p, o.p, &scale, &neg}), CUDNN_STATUS_BAD_PARAM);
  // A pointer less aligned than the tensor's 4 bytes.
  EXPECT_EQ(g.run(uids, {static_cast<char*>(q.p) + 2, k.p, v.p, o.p, st.p, &scale, &neg}), CUDNN_STATUS_BAD_PARAM);
  // Nothing was written by the refused calls.
  for (float x : o.get()) EXPECT_TRUE(std::isnan(x));
}

// Each plan's workspace is the fake's own choice, 256 bytes per operation of its graph (the forward
// graph above has 14: two matmuls, ten pointwise, two reductions → 3584 bytes; two identities → 512),
// or ZINF_CUDNN_FAKE_WORKSPACE bytes; the engine config reports the same.
TEST(CudnnFake, PlanWorkspaceIsTheFakesChoicePerGraph) {
  {
    G g;
    ASSERT_EQ(forward_graph(g, 1, 1, 1, 2, 2, 2), CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(g.workspace(), 14 * 256);
  }
  {
    G g;
    Desc x = g.tensor(kQ, {1, 1, 1, 2}, {2, 2, 2, 1}), y = g.tensor(kO, {1, 1, 1, 2}, {2, 2, 2, 1});
    Desc mid = g.virt({1, 1, 1, 2});
    g.pw(CUDNN_POINTWISE_IDENTITY, x, nullptr, mid);
    g.pw(CUDNN_POINTWISE_IDENTITY, mid, nullptr, y);
    ASSERT_EQ(g.build(), CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(g.workspace(), 2 * 256);
  }
  setenv("ZINF_CUDNN_FAKE_WORKSPACE", "1000", 1);
  G g;
  const cudnnStatus_t st = forward_graph(g, 1, 1, 1, 2, 2, 2);
  unsetenv("ZINF_CUDNN_FAKE_WORKSPACE");
  ASSERT_EQ(st, CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(g.workspace(), 1000);
  // A workspace one byte short of the plan's need is refused.
  Dev q({1, 0, 0, 1}), k({0, 0, 0, kLn3}), v({1, 2, 5, 6}), o(std::vector<float>(4, NAN)), stats({NAN, NAN});
  void* ws = nullptr;
  ASSERT_EQ(cudaMalloc(&ws, 999), cudaSuccess);
  float scale = 1.0f, neg = -INFINITY;
  const std::vector<std::int64_t> uids{kQ, kK, kV, kO, kStats, kScale, kNegInf};
  std::vector<void*> ptrs{q.p, k.p, v.p, o.p, stats.p, &scale, &neg};
  Desc pack = g.make(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  EXPECT_EQ(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 7, uids.data()), 0);
  EXPECT_EQ(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 7, ptrs.data()),
            0);
  EXPECT_EQ(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws), 0);
  EXPECT_EQ(cudnnBackendFinalize(pack), 0);
  EXPECT_EQ(g.execute(pack), CUDNN_STATUS_BAD_PARAM);
  cudaFree(ws);
}

TEST(CudnnFake, TestHooksRefuseAShapeAndFailARun) {
  setenv("ZINF_CUDNN_FAKE_REFUSE", "1,1,2,2", 1);
  {
    G g;
    EXPECT_EQ(forward_graph(g, 1, 1, 1, 2, 2, 2), CUDNN_STATUS_NOT_SUPPORTED_SHAPE);
  }
  {
    G g;  // another shape (T 3) is accepted
    EXPECT_EQ(forward_graph(g, 1, 1, 1, 3, 2, 2), CUDNN_STATUS_SUCCESS);
  }
  unsetenv("ZINF_CUDNN_FAKE_REFUSE");
  G g;
  ASSERT_EQ(forward_graph(g, 1, 1, 1, 2, 2, 2), CUDNN_STATUS_SUCCESS);
  Dev q({1, 0, 0, 1}), k({0, 0, 0, kLn3}), v({1, 2, 5, 6}), o(std::vector<float>(4, NAN)), st({NAN, NAN});
  float scale = 1.0f, neg = -INFINITY;
  setenv("ZINF_CUDNN_FAKE_FAIL_EXECUTE", "1", 1);
  EXPECT_EQ(g.run({kQ, kK, kV, kO, kStats, kScale, kNegInf}, {q.p, k.p, v.p, o.p, st.p, &scale, &neg}),
            CUDNN_STATUS_EXECUTION_FAILED);
  unsetenv("ZINF_CUDNN_FAKE_FAIL_EXECUTE");
}

}  // namespace
