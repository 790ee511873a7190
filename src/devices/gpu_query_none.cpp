// gpu_query_none.cpp — the GPU query in a build without CUDA (ZINF_CUDA=OFF or no nvcc).
#include "gpu_query.h"

namespace zinf::cuda {

GpuQuery query_gpus() {
  GpuQuery q;
  q.status = "built without CUDA (configure with -DZINF_CUDA=ON and nvcc to enable the GPU device)";
  return q;
}

}  // namespace zinf::cuda
