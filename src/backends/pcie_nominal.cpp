// pcie_nominal.cpp — nominal PCIe bandwidth per direction and the sysfs link attributes it is read
// from (zinf/backends/gpu.h); plain C++, built with or without CUDA.
#include <cstdlib>
#include <string>

#include "zinf/backends/gpu.h"

namespace zinf::cuda {

double pcie_nominal_gbps(int gen, int width) {
  // GT/s per lane and encoding efficiency: gen1/2 8b/10b, gen3+ 128b/130b (gen6 FLIT ≈ 242/256).
  double gts = 0, eff = 128.0 / 130.0;
  switch (gen) {
    case 1: gts = 2.5, eff = 0.8; break;
    case 2: gts = 5.0, eff = 0.8; break;
    case 3: gts = 8.0; break;
    case 4: gts = 16.0; break;
    case 5: gts = 32.0; break;
    case 6: gts = 64.0, eff = 242.0 / 256.0; break;
    default: return 0;
  }
  return gts * eff / 8.0 * width;
}

int pcie_gen_from_sysfs_speed(const std::string& line) {
  const double gts = std::atof(line.c_str());  // the leading number; "Unknown" and "" give 0
  if (gts >= 63) return 6;
  if (gts >= 31) return 5;
  if (gts >= 15) return 4;
  if (gts >= 7.9) return 3;
  if (gts >= 4.9) return 2;
  if (gts >= 2.4) return 1;
  return 0;
}

int pcie_width_from_sysfs(const std::string& line) {
  const int w = std::atoi(line.c_str());
  return w > 0 && w <= 32 ? w : 0;  // x1 … x32; anything else is not a width
}

PcieLink pcie_nominal_link(const GpuInfo& g) {
  if (g.pcie_gen_max > 0 && g.pcie_width_max > 0) return {g.pcie_gen_max, g.pcie_width_max};
  return {g.pcie_gen, g.pcie_width};
}

}  // namespace zinf::cuda
