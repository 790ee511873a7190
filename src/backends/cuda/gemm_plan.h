// gemm_plan.h — the host-side half of the CUDA backend's GEMMs, in plain C++ so it is tested on the
// CPU (tests/backends/gemm_plan_test.cpp): the plan of each op's GEMMs (shapes, transposes, leading
// dimensions, dtypes, beta and the fused epilogue) built from the row-major op's arguments, how a
// column-major call maps to cuBLASLt's stored-matrix layouts, the pointer alignments handed to its
// heuristic, and the key under which a chosen algorithm is cached. gemm.h executes the plans.
//
// The model is row-major; the plans hand cuBLAS the column-major transposes (outᵀ = Wᵀ·inpᵀ).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "model/tensor.h"
#include "zinf/error.h"

namespace zinf::cuda {

// A stored column-major matrix: rows × cols with leading dimension ld (≥ rows).
struct StoredMatrix {
  std::uint64_t rows = 0, cols = 0;
  std::int64_t ld = 0;
  bool operator==(const StoredMatrix& o) const { return rows == o.rows && cols == o.cols && ld == o.ld; }
};

// op(X) is op_rows × op_cols; the matrix in memory is that, or its transpose when `trans`.
inline StoredMatrix stored_matrix(bool trans, int op_rows, int op_cols, int ld, const char* name) {
  if (op_rows <= 0 || op_cols <= 0)
    throw Error(std::string("GEMM operand ") + name + ": empty shape " + std::to_string(op_rows) + "x" +
                std::to_string(op_cols));
  StoredMatrix s;
  s.rows = static_cast<std::uint64_t>(trans ? op_cols : op_rows);
  s.cols = static_cast<std::uint64_t>(trans ? op_rows : op_cols);
  s.ld = ld;
  if (ld < 0 || static_cast<std::uint64_t>(ld) < s.rows)
    throw Error(std::string("GEMM operand ") + name + ": leading dimension " + std::to_string(ld) + " < its " +
                std::to_string(s.rows) + " stored rows");
  return s;
}

// The largest power of two (capped at 256, cuBLASLt's default assumption) dividing the address: the
// heuristic must not be promised more alignment than the pointers have.
inline std::uint32_t pointer_alignment(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t al = 256;
  while (al > 1 && (a % al) != 0) al /= 2;
  return al;
}

// ---- plans ------------------------------------------------------------------------------------------
//
// A GemmPlan is one column-major call, D[m,n] = op(A)·op(B) + beta·C with C = D, followed by an
// epilogue. Every dtype is the operand's storage type; the arithmetic is fp32 with fp32 accumulation
// whatever the storage, and each element of D (and of the epilogue's outputs) is rounded once.
//
// Epilogues and the roles of their pointers (GemmOperands):
//   none           D = op(A)·op(B) + beta·C.
//   bias           D[i,j] = (op(A)·op(B))[i,j] + beta·C[i,j] + bias[i]; `bias` read, m elements of
//                  bias_type (broadcast along the columns: a row-major op's per-output-feature bias).
//   gelu_aux_bias  pre = op(A)·op(B) + bias (bias may be absent), beta must be 0; `aux` written with
//                  pre (m × n, leading dimension aux_ld, aux_type); D = gelu(pre) from the fp32 pre,
//                  not from its rounded copy.
//   bgrad          D as for none; `bias_grad` written (=, not +=) with Σ_k op(A)[i,k], m fp32
//                  elements: the bias gradient when A is the output gradient.
// Batches: `batch` independent calls; call t reads and writes each operand X at X + t·stride_x
// (elements), the aux matrix at aux + t·aux_ld·n; bias vectors are shared.
// cuBLASLt fuses gelu_aux_bias only when aux_ld is a multiple of 8; where it offers no fused algorithm
// the executor says so and the caller runs without_epilogue() and the epilogue's own kernels.
enum class Epilogue : std::uint8_t { none, bias, gelu_aux_bias, bgrad };

constexpr const char* to_string(Epilogue e) {
  switch (e) {
    case Epilogue::none: return "none";
    case Epilogue::bias: return "bias";
    case Epilogue::gelu_aux_bias: return "gelu_aux_bias";
    case Epilogue::bgrad: return "bgrad";
  }
  return "?";
}

struct GemmPlan {
  bool ta = false, tb = false;
  int m = 0, n = 0, k = 0;
  int lda = 0, ldb = 0, ldc = 0;
  int batch = 1;
  long long stride_a = 0, stride_b = 0, stride_c = 0;
  DType a_type = DType::fp32, b_type = DType::fp32, c_type = DType::fp32;
  float beta = 0;
  Epilogue epilogue = Epilogue::none;
  DType bias_type = DType::fp32;  // bias: the bias vector's type; bgrad: always fp32
  DType aux_type = DType::fp32;   // gelu_aux_bias: the pre-activation's type
  int aux_ld = 0;
};

// The call's pointers, by role (see Epilogue): unused ones are null.
struct GemmOperands {
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;  // C and D: read when beta ≠ 0, written
  const void* bias = nullptr;
  void* aux = nullptr;
  void* bias_grad = nullptr;
};

struct GemmCall {
  GemmPlan plan;
  GemmOperands ops;
};

// Checks a plan against itself (shapes, leading dimensions, the epilogue's needs) and its pointers;
// an inconsistent call is a bug in the caller, named here.
inline void validate(const GemmPlan& p, const GemmOperands& o) {
  (void)stored_matrix(p.ta, p.m, p.k, p.lda, "A");
  (void)stored_matrix(p.tb, p.k, p.n, p.ldb, "B");
  (void)stored_matrix(false, p.m, p.n, p.ldc, "C");
  const std::string what = std::string("GEMM ") + std::to_string(p.m) + "x" + std::to_string(p.n) + "x" +
                           std::to_string(p.k) + " with epilogue " + to_string(p.epilogue);
  if (p.batch < 1) throw Error(what + ": batch count " + std::to_string(p.batch) + " < 1");
  if (!o.a || !o.b || !o.c) throw Error(what + ": operand A, B or C is null");
  switch (p.epilogue) {
    case Epilogue::none: break;
    case Epilogue::bias:
      if (!o.bias) throw Error(what + ": no bias vector");
      break;
    case Epilogue::gelu_aux_bias:
      if (!o.aux) throw Error(what + ": no aux (pre-activation) matrix");
      if (p.aux_ld < p.m) throw Error(what + ": aux leading dimension " + std::to_string(p.aux_ld) + " < m");
      if (p.beta != 0.0f) throw Error(what + ": beta must be 0 (the GELU applies to the whole sum)");
      break;
    case Epilogue::bgrad:
      if (!o.bias_grad) throw Error(what + ": no bias-gradient vector");
      break;
  }
}

// The same GEMM with its epilogue left to separate kernels (the reference path, and the fallback
// where cuBLASLt offers no algorithm with the epilogue).
inline GemmCall without_epilogue(GemmCall g) {
  g.plan.epilogue = Epilogue::none;
  g.ops.bias = nullptr;
  g.ops.aux = nullptr;
  g.ops.bias_grad = nullptr;
  return g;
}

// ---- the plans of the model's ops ------------------------------------------------------------------
//
// The ops are row-major (cpu/ops_gpt.h); a row-major X[r,c] is the column-major Xᵀ with leading
// dimension c, so each op is handed to the column-major GEMM as its transpose. S: the activations'
// and weights' storage type; weight gradients are fp32.

// A weight gradient, accumulated in fp32 (beta 1), column-major: dw[m,n] (ldc = m) += a[m,k] (lda = m)
// · bᵀ, b stored n×k (ldb ≥ n); a and b in S. matmul_backward's dW and lm_head_backward's dwte.
inline GemmCall weight_grad_gemm(float* dw, const void* a, const void* b, int m, int n, int k, int ldb, DType S) {
  GemmCall g;
  GemmPlan& p = g.plan;
  p.tb = true;
  p.m = m, p.n = n, p.k = k;
  p.lda = m, p.ldb = ldb, p.ldc = m;
  p.a_type = p.b_type = S;
  p.c_type = DType::fp32;
  p.beta = 1.0f;
  g.ops = {a, b, dw, nullptr, nullptr, nullptr};
  return g;
}

// matmul_forward: out[R,OC] = inp[R,IC]·W[IC,OC] + bias  ⇔  outᵀ[OC,R] = Wᵀ[OC,IC]·inpᵀ[IC,R] (+ bias per
// row of outᵀ).
inline GemmCall matmul_forward_gemm(void* out, const void* inp, const void* w, const void* bias, int R, int IC, int OC,
                                    DType S) {
  GemmCall g;
  GemmPlan& p = g.plan;
  p.m = OC, p.n = R, p.k = IC;
  p.lda = OC, p.ldb = IC, p.ldc = OC;
  p.a_type = p.b_type = p.c_type = p.bias_type = S;
  p.epilogue = bias ? Epilogue::bias : Epilogue::none;
  g.ops = {w, inp, out, bias, nullptr, nullptr};
  return g;
}

// matmul_gelu_forward: pre = inp·W + bias, out = gelu(pre); the same GEMM, out as D and pre as aux.
inline GemmCall matmul_gelu_forward_gemm(void* pre, void* out, const void* inp, const void* w, const void* bias, int R,
                                         int IC, int OC, DType S) {
  GemmCall g = matmul_forward_gemm(out, inp, w, bias, R, IC, OC, S);
  g.plan.epilogue = Epilogue::gelu_aux_bias;
  g.plan.aux_type = S;
  g.plan.aux_ld = OC;
  g.ops.aux = pre;
  return g;
}

// matmul_backward:
//   dinp[R,IC] += dout[R,OC]·Wᵀ  ⇔  dinpᵀ[IC,R] += W·doutᵀ: A = W (row-major [IC,OC], so stored OC×IC),
//                                   transposed; B = doutᵀ;
//   dW[IC,OC] += inpᵀ·dout       ⇔  dWᵀ[OC,IC] += doutᵀ[OC,R]·inp[R,IC]: A = doutᵀ, B = inp stored IC×R,
//                                   transposed;
//   dbias[OC] += Σ_r dout[r,·]   = the row sums of A = doutᵀ over k = R: the bgrad epilogue of the dW
//                                   GEMM, written into `dbias_partial` (fp32 [OC]) for the caller to add
//                                   to dbias (the epilogue overwrites, the op accumulates).
struct MatmulBackwardGemms {
  bool has_dinp = false;
  GemmCall dinp;
  GemmCall dw;
  bool dbias_by_epilogue = false;  // else the caller sums dout's columns itself (when it wants dbias)
};
inline MatmulBackwardGemms matmul_backward_gemms(void* dinp, float* dw, float* dbias_partial, const void* dout,
                                                 const void* inp, const void* w, int R, int IC, int OC, DType S) {
  MatmulBackwardGemms b;
  if (dinp) {
    b.has_dinp = true;
    GemmPlan& p = b.dinp.plan;
    p.ta = true;
    p.m = IC, p.n = R, p.k = OC;
    p.lda = OC, p.ldb = OC, p.ldc = IC;
    p.a_type = p.b_type = p.c_type = S;
    p.beta = 1.0f;
    b.dinp.ops = {w, dout, dinp, nullptr, nullptr, nullptr};
  }
  b.dw = weight_grad_gemm(dw, dout, inp, OC, IC, R, IC, S);
  if (dbias_partial) {
    b.dw.plan.epilogue = Epilogue::bgrad;
    b.dw.ops.bias_grad = dbias_partial;
    b.dbias_by_epilogue = true;
  }
  return b;
}

// lm_head_forward's logits: logits[R,V] = x[R,C]·wteᵀ  ⇔  logitsᵀ[V,R] = wte (stored C×V, transposed)·xᵀ;
// written into the probs buffer, which the softmax then overwrites in place. The logits rows are `ld`
// elements apart (ld ≥ V: model/backend.h's logits_row_stride); only their first V elements are written.
inline GemmCall lm_head_forward_gemm(void* logits, const void* x, const void* wte, int R, int C, int V, int ld,
                                     DType S) {
  GemmCall g;
  GemmPlan& p = g.plan;
  p.ta = true;
  p.m = V, p.n = R, p.k = C;
  p.lda = C, p.ldb = C, p.ldc = ld;
  p.a_type = p.b_type = p.c_type = S;
  g.ops = {wte, x, logits, nullptr, nullptr, nullptr};
  return g;
}

// lm_head_backward, after dlogits (rows `ld` elements apart, as the forward's logits; only the first V
// elements of each row are read):
//   dx[R,C] = dlogits[R,V]·wte[V,C]  ⇔  dxᵀ[C,R] = wteᵀ[C,V]·dlogitsᵀ[V,R]  (overwritten: beta 0);
//   dwte[V,C] += dlogitsᵀ·x          ⇔  dwteᵀ[C,V] += xᵀ[C,R]·dlogits (stored V×R, transposed).
struct LmHeadBackwardGemms {
  GemmCall dx, dwte;
};
inline LmHeadBackwardGemms lm_head_backward_gemms(void* dx, float* dwte, const void* dlogits, const void* x,
                                                  const void* wte, int R, int C, int V, int ld, DType S) {
  LmHeadBackwardGemms b;
  GemmPlan& p = b.dx.plan;
  p.m = C, p.n = R, p.k = V;
  p.lda = C, p.ldb = ld, p.ldc = C;
  p.a_type = p.b_type = p.c_type = S;
  b.dx.ops = {wte, dlogits, dx, nullptr, nullptr, nullptr};
  b.dwte = weight_grad_gemm(dwte, x, dlogits, C, V, R, ld, S);
  return b;
}

// ---- the algorithm cache's key ---------------------------------------------------------------------

// Everything the algorithm choice and the descriptors depend on: the plan (shapes, transposes,
// beta ≠ 0, dtypes, epilogue, batches) and the pointers' alignments.
struct GemmKey {
  bool ta = false, tb = false, accumulate = false;
  int m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  std::uint32_t align_a = 0, align_b = 0, align_c = 0;
  DType a_type = DType::fp32, b_type = DType::fp32, c_type = DType::fp32;
  Epilogue epilogue = Epilogue::none;
  bool has_bias = false;  // gelu_aux_bias without a bias is cuBLASLt's GELU_AUX
  DType bias_type = DType::fp32, aux_type = DType::fp32;
  int aux_ld = 0, batch = 1;
  long long stride_a = 0, stride_b = 0, stride_c = 0;
  std::uint32_t align_bias = 0, align_aux = 0;
  bool operator==(const GemmKey& o) const {  // spelled out: the CUDA translation units are C++17
    return ta == o.ta && tb == o.tb && accumulate == o.accumulate && m == o.m && n == o.n && k == o.k && lda == o.lda &&
           ldb == o.ldb && ldc == o.ldc && align_a == o.align_a && align_b == o.align_b && align_c == o.align_c &&
           a_type == o.a_type && b_type == o.b_type && c_type == o.c_type && epilogue == o.epilogue &&
           has_bias == o.has_bias && bias_type == o.bias_type && aux_type == o.aux_type && aux_ld == o.aux_ld &&
           batch == o.batch && stride_a == o.stride_a && stride_b == o.stride_b && stride_c == o.stride_c &&
           align_bias == o.align_bias && align_aux == o.align_aux;
  }
};

// The key of a validated call (no checks here; make_gemm_key checks).
inline GemmKey gemm_key_of(const GemmPlan& p, const GemmOperands& o) {
  GemmKey key;
  key.ta = p.ta, key.tb = p.tb, key.accumulate = p.beta != 0.0f;
  key.m = p.m, key.n = p.n, key.k = p.k, key.lda = p.lda, key.ldb = p.ldb, key.ldc = p.ldc;
  key.align_a = pointer_alignment(o.a), key.align_b = pointer_alignment(o.b), key.align_c = pointer_alignment(o.c);
  key.a_type = p.a_type, key.b_type = p.b_type, key.c_type = p.c_type;
  key.epilogue = p.epilogue;
  key.batch = p.batch;
  if (p.batch > 1) key.stride_a = p.stride_a, key.stride_b = p.stride_b, key.stride_c = p.stride_c;
  switch (p.epilogue) {
    case Epilogue::none: break;
    case Epilogue::bias:
      key.has_bias = true, key.bias_type = p.bias_type, key.align_bias = pointer_alignment(o.bias);
      break;
    case Epilogue::gelu_aux_bias:
      key.has_bias = o.bias != nullptr;
      if (key.has_bias) key.bias_type = p.bias_type, key.align_bias = pointer_alignment(o.bias);
      key.aux_type = p.aux_type, key.aux_ld = p.aux_ld, key.align_aux = pointer_alignment(o.aux);
      break;
    case Epilogue::bgrad: key.has_bias = true, key.align_bias = pointer_alignment(o.bias_grad); break;
  }
  return key;
}

inline GemmKey make_gemm_key(const GemmPlan& p, const GemmOperands& o) {
  validate(p, o);
  return gemm_key_of(p, o);
}

// A plain fp32 call (no epilogue). The pointers only give their alignment (null counts as fully
// aligned), so only the layouts are checked.
inline GemmKey make_gemm_key(bool ta, bool tb, int m, int n, int k, const void* a, int lda, const void* b, int ldb,
                             float beta, const void* c, int ldc) {
  GemmPlan p;
  p.ta = ta, p.tb = tb, p.m = m, p.n = n, p.k = k, p.lda = lda, p.ldb = ldb, p.ldc = ldc, p.beta = beta;
  // Validate every operand's layout up front: an inconsistent call is a bug, named here.
  (void)stored_matrix(ta, m, k, lda, "A");
  (void)stored_matrix(tb, k, n, ldb, "B");
  (void)stored_matrix(false, m, n, ldc, "C");
  return gemm_key_of(p, GemmOperands{a, b, const_cast<void*>(c)});
}

struct GemmKeyHash {
  std::size_t operator()(const GemmKey& k) const {
    std::size_t h = 1469598103934665603ull;
    auto mix = [&h](std::uint64_t v) { h = (h ^ v) * 1099511628211ull; };
    mix(static_cast<std::uint64_t>(k.ta) | static_cast<std::uint64_t>(k.tb) << 1 |
        static_cast<std::uint64_t>(k.accumulate) << 2 | static_cast<std::uint64_t>(k.has_bias) << 3 |
        static_cast<std::uint64_t>(k.epilogue) << 8 | static_cast<std::uint64_t>(k.a_type) << 16 |
        static_cast<std::uint64_t>(k.b_type) << 20 | static_cast<std::uint64_t>(k.c_type) << 24 |
        static_cast<std::uint64_t>(k.bias_type) << 28 | static_cast<std::uint64_t>(k.aux_type) << 32);
    for (int v : {k.m, k.n, k.k, k.lda, k.ldb, k.ldc, k.aux_ld, k.batch}) mix(static_cast<std::uint32_t>(v));
    for (long long v : {k.stride_a, k.stride_b, k.stride_c}) mix(static_cast<std::uint64_t>(v));
    mix(static_cast<std::uint64_t>(k.align_a) << 32 | static_cast<std::uint64_t>(k.align_b) << 16 | k.align_c);
    mix(static_cast<std::uint64_t>(k.align_bias) << 16 | k.align_aux);
    return h;
  }
};

}  // namespace zinf::cuda
