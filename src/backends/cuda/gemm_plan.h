// gemm_plan.h — the host-side half of the CUDA backend's GEMMs, in plain C++ so it is tested on the
// CPU (tests/src/gemm_plan_test.cpp): how a column-major C[m,n] = op(A)·op(B) (+ beta·C) call maps to
// cuBLASLt's stored-matrix layouts, the pointer alignments handed to its heuristic, and the key under
// which a chosen algorithm is cached.
//
// The model is row-major; cuda_ops.cu hands cuBLAS the column-major transposes (outᵀ = Wᵀ·inpᵀ), so
// every call arrives here already in column-major terms.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

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

// Everything the algorithm choice depends on: shapes, transposes, beta ≠ 0 and alignments.
struct GemmKey {
  bool ta = false, tb = false, accumulate = false;
  int m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  std::uint32_t align_a = 0, align_b = 0, align_c = 0;
  bool operator==(const GemmKey& o) const {  // spelled out: the CUDA translation units are C++17
    return ta == o.ta && tb == o.tb && accumulate == o.accumulate && m == o.m && n == o.n && k == o.k && lda == o.lda &&
           ldb == o.ldb && ldc == o.ldc && align_a == o.align_a && align_b == o.align_b && align_c == o.align_c;
  }
};

inline GemmKey make_gemm_key(bool ta, bool tb, int m, int n, int k, const void* a, int lda, const void* b, int ldb,
                             float beta, const void* c, int ldc) {
  // Validate every operand's layout up front: an inconsistent call is a bug, named here.
  (void)stored_matrix(ta, m, k, lda, "A");
  (void)stored_matrix(tb, k, n, ldb, "B");
  (void)stored_matrix(false, m, n, ldc, "C");
  return GemmKey{
      ta, tb, beta != 0.0f, m, n, k, lda, ldb, ldc, pointer_alignment(a), pointer_alignment(b), pointer_alignment(c)};
}

struct GemmKeyHash {
  std::size_t operator()(const GemmKey& k) const {
    std::size_t h = 1469598103934665603ull;
    auto mix = [&h](std::uint64_t v) { h = (h ^ v) * 1099511628211ull; };
    mix(static_cast<std::uint64_t>(k.ta) | static_cast<std::uint64_t>(k.tb) << 1 |
        static_cast<std::uint64_t>(k.accumulate) << 2);
    for (int v : {k.m, k.n, k.k, k.lda, k.ldb, k.ldc}) mix(static_cast<std::uint32_t>(v));
    mix(static_cast<std::uint64_t>(k.align_a) << 32 | static_cast<std::uint64_t>(k.align_b) << 16 | k.align_c);
    return h;
  }
};

}  // namespace zinf::cuda
