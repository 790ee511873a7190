// gemm_plan_test.cpp — the host-side half of the CUDA backend's GEMMs (src/cuda/gemm_plan.h), on the
// CPU: stored layouts of transposed and plain operands, layout errors that name the operand, the
// alignments promised to cuBLASLt's heuristic, and the algorithm-cache key.
#include <gtest/gtest.h>

#include <cstdint>
#include <unordered_set>

#include "cuda/gemm_plan.h"

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

}  // namespace
}  // namespace zinf::cuda
