// cudnn_attention_version.h — the cuDNN version this zinf runs with (cudnnGetVersion, "x.y.z"), for
// zinf info; plain C++. Defined in cudnn_attention.cu, built only with cuDNN (ZINF_HAVE_CUDNN).
#pragma once

namespace zinf::cuda {
const char* cudnn_build_version();
}  // namespace zinf::cuda
