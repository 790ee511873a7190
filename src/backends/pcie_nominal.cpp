// pcie_nominal.cpp — nominal PCIe bandwidth per direction (zinf/backends/gpu.h); plain C++, built with or without CUDA.
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

}  // namespace zinf::cuda
