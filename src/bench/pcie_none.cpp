// pcie_none.cpp — `zinf bench pcie` in a build without CUDA.
#include "bench/pcie.h"
#include "zinf/error.h"

namespace zinf::cuda {

PcieResult bench_pcie(int, std::uint64_t, int, const std::function<void(const std::string&)>&) {
  throw Error("bench pcie: this zinf was built without CUDA", "configure with -DZINF_CUDA=ON on a machine with nvcc");
}

}  // namespace zinf::cuda
