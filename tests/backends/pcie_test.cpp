// pcie_test.cpp — the nominal PCIe rates behind `zinf bench pcie` (plain arithmetic, no GPU needed),
// and the GPU measurement itself, which skips with the reason where no GPU is visible.
#include <gtest/gtest.h>

#include "zinf/backends/gpu.h"
#include "zinf/error.h"

namespace zinf::cuda {
namespace {

TEST(Pcie, NominalRatesPerDirection) {
  EXPECT_NEAR(pcie_nominal_gbps(3, 16), 15.75, 0.01);  // 8 GT/s × 128/130 × 16 / 8
  EXPECT_NEAR(pcie_nominal_gbps(4, 16), 31.51, 0.01);
  EXPECT_NEAR(pcie_nominal_gbps(5, 16), 63.02, 0.01);  // H100 / H200 SXM hosts
  EXPECT_NEAR(pcie_nominal_gbps(2, 8), 4.0, 1e-9);     // 8b/10b
  EXPECT_EQ(pcie_nominal_gbps(0, 16), 0.0);
}

TEST(PcieGpu, MeasuresBothDirections) {
  const GpuQuery q = query_gpus();
  if (q.gpus.empty()) GTEST_SKIP() << "no GPU: " << q.status;
  const PcieResult r = bench_pcie(0, 64 << 20, 2, [](const std::string&) {});
  EXPECT_GT(r.h2d_gbps, 0.0);
  EXPECT_GT(r.d2h_gbps, 0.0);
  EXPECT_GT(r.both_gbps, 0.0);
  if (r.nominal_gbps > 0) {
    EXPECT_LT(r.h2d_gbps, 1.2 * r.nominal_gbps);
  }
}

TEST(PcieGpu, WithoutAGpuItIsOneClearError) {
  const GpuQuery q = query_gpus();
  if (!q.gpus.empty()) GTEST_SKIP() << "a GPU is visible";
  try {
    bench_pcie(0, 1 << 20, 1, [](const std::string&) {});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bench pcie"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace zinf::cuda
