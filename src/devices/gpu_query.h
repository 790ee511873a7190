// gpu_query.h — the GPU query behind `zinf info`; implemented in gpu_query.cu with CUDA, or by
// gpu_query_none.cpp in a build without it. Plain types only, so callers need no CUDA headers.
#pragma once

#include <string>
#include <vector>

#include "zinf/sysinfo.h"

namespace zinf::cuda {

struct GpuQuery {
  bool built = false;             // this binary has the CUDA device
  std::string status;             // one line for `zinf info`
  std::vector<GpuInfo> gpus;
  std::string runtime, driver, nccl;
};

GpuQuery query_gpus();

}  // namespace zinf::cuda
