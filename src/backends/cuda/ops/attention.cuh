// attention.cuh — causal multi-head self-attention with the softmax fused with masking and scaling
// (scale 1/√(C/H)); qkv [B,T,3C] → out [B,T,C], att [B,H,T,T] kept for backward. scratch holds
// B·H·T·T floats for the backward.
#pragma once
#include <cuda_runtime.h>
namespace zinf::cuda::ops {
void launch_attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int H, cudaStream_t s);
// dqkv = … (overwritten)
void launch_attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* att,
                               int B, int T, int C, int H, cudaStream_t s);
}  // namespace zinf::cuda::ops
