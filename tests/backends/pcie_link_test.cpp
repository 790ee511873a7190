// pcie_link_test.cpp — the PCIe link behind `zinf bench pcie`'s nominal rate, read from sysfs
// attributes (plain C++, fixture strings as Linux writes them; no GPU needed).
#include <gtest/gtest.h>

#include "zinf/backends/gpu.h"

namespace zinf::cuda {
namespace {

// The sysfs link attributes as Linux writes them, and the link the nominal rate is taken from.
TEST(Pcie, ReadsSysfsLinkAttributes) {
  EXPECT_EQ(pcie_gen_from_sysfs_speed("32.0 GT/s PCIe"), 5);
  EXPECT_EQ(pcie_gen_from_sysfs_speed("16.0 GT/s PCIe"), 4);
  EXPECT_EQ(pcie_gen_from_sysfs_speed("8.0 GT/s PCIe"), 3);
  EXPECT_EQ(pcie_gen_from_sysfs_speed("8 GT/s"), 3);  // older kernels
  EXPECT_EQ(pcie_gen_from_sysfs_speed("2.5 GT/s PCIe"), 1);
  EXPECT_EQ(pcie_gen_from_sysfs_speed("64.0 GT/s PCIe"), 6);
  EXPECT_EQ(pcie_gen_from_sysfs_speed("Unknown"), 0);
  EXPECT_EQ(pcie_gen_from_sysfs_speed(""), 0);  // no such file
  EXPECT_EQ(pcie_width_from_sysfs("16"), 16);
  EXPECT_EQ(pcie_width_from_sysfs("8\n"), 8);
  EXPECT_EQ(pcie_width_from_sysfs("255"), 0);  // "unknown" as some kernels print it
  EXPECT_EQ(pcie_width_from_sysfs(""), 0);
}

// An idle H200 reads gen1 x16 now and gen5 x16 at most: the nominal rate is the maximum link's.
TEST(Pcie, NominalRateUsesTheMaximumLink) {
  GpuInfo idle;
  idle.pcie_gen = pcie_gen_from_sysfs_speed("2.5 GT/s PCIe");
  idle.pcie_width = pcie_width_from_sysfs("16");
  idle.pcie_gen_max = pcie_gen_from_sysfs_speed("32.0 GT/s PCIe");
  idle.pcie_width_max = pcie_width_from_sysfs("16");
  const PcieLink link = pcie_nominal_link(idle);
  EXPECT_EQ(link.gen, 5);
  EXPECT_EQ(link.width, 16);
  EXPECT_NEAR(pcie_nominal_gbps(link.gen, link.width), 63.02, 0.01);
  GpuInfo unknown_max;  // no max_link_* files: the current link
  unknown_max.pcie_gen = 4;
  unknown_max.pcie_width = 8;
  EXPECT_EQ(pcie_nominal_link(unknown_max).gen, 4);
  EXPECT_EQ(pcie_nominal_link(unknown_max).width, 8);
}

}  // namespace
}  // namespace zinf::cuda
