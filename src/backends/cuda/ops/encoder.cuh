// encoder.cuh — token + position embedding forward; backward scatters into wte/wpe by columns.
#pragma once
#include <cuda_runtime.h>
namespace zinf::cuda::ops {
void launch_encoder_forward(float* out, const int* tokens, const float* wte, const float* wpe, int B, int T, int C,
                            cudaStream_t s);
// dwte += …; dwpe += … (one thread per channel, rows in order: repeated tokens never race)
void launch_encoder_backward(float* dwte, float* dwpe, const float* dout, const int* tokens, int B, int T, int C,
                             cudaStream_t s);
}  // namespace zinf::cuda::ops
