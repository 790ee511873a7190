// crossentropy.cuh — softmax + cross-entropy over logits [R,V] (in place: logits become probs, one
// loss per row), and its gradient dlogits = (probs − onehot)·dscale.
#pragma once
#include <cuda_runtime.h>
namespace zinf::cuda::ops {
void launch_softmax_crossentropy(float* probs, float* losses, const int* targets, int R, int V, cudaStream_t s);
void launch_crossentropy_backward(float* dlogits, const float* probs, const int* targets, float dscale, int R, int V,
                                  cudaStream_t s);
}  // namespace zinf::cuda::ops
