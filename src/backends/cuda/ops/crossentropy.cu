// crossentropy.cu — one thread per row for the softmax statistics; elementwise gradient.
#include "cuda/cuda_check.cuh"
#include "cuda/ops/crossentropy.cuh"

namespace zinf::cuda::ops {
namespace {
__global__ void softmax_ce(float* probs, float* losses, const int* targets, int R, int V) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= R) return;
  float* l = probs + static_cast<std::size_t>(r) * V;
  float mx = -INFINITY;
  for (int v = 0; v < V; ++v) mx = fmaxf(mx, l[v]);
  float sum = 0;
  for (int v = 0; v < V; ++v) {
    l[v] = expf(l[v] - mx);
    sum += l[v];
  }
  const float inv = 1.0f / sum;
  for (int v = 0; v < V; ++v) l[v] *= inv;
  const int t = targets[r];
  // -1: a masked position (kIgnoreTarget); any other id outside the vocabulary is NaN, as in the fast kernel
  losses[r] = t == -1 ? 0.0f : (t < 0 || t >= V) ? NAN : -logf(fmaxf(l[t], 1e-30f));
}
__global__ void ce_backward(float* dlogits, const float* probs, const int* targets, float dscale, int R, int V) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<std::size_t>(R) * V) return;
  const int r = static_cast<int>(i / V), v = static_cast<int>(i % V);
  const int t = targets[r];
  dlogits[i] = t == -1 ? 0.0f : (probs[i] - (v == t ? 1.0f : 0.0f)) * dscale;  // -1: masked, no gradient
}
}  // namespace
void launch_softmax_crossentropy(float* probs, float* losses, const int* targets, int R, int V, cudaStream_t s) {
  cuda::launch(softmax_ce, blocks_for(R, 128), 128, 0, s, probs, losses, targets, R, V);
  ZINF_CUDA_LAUNCH_CHECK("softmax_crossentropy");
}
void launch_crossentropy_backward(float* dlogits, const float* probs, const int* targets, float dscale, int R, int V,
                                  cudaStream_t s) {
  cuda::launch(ce_backward, blocks_for(static_cast<std::size_t>(R) * V, 256), 256, 0, s, dlogits, probs, targets,
               dscale, R, V);
  ZINF_CUDA_LAUNCH_CHECK("crossentropy_backward");
}
}  // namespace zinf::cuda::ops
