// cudnn_fake.h — what a test may ask the executor's cuDNN fake (cudnn.cpp) beyond cuDNN's own API.
#pragma once

#include <vector>

namespace zinf::cudax {

// The by-value scalars of the last cudnnBackendExecute call in this process, as the caller passed
// them, in ascending order of their tensors' unique ids (empty before the first call).
std::vector<float> cudnn_fake_last_scalars();

}  // namespace zinf::cudax
