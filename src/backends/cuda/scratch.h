// scratch.h — a block of device scratch an op keeps between calls and grows on demand. The caching
// allocator is not stream-ordered: a freed block may be handed out again at once, while kernels queued
// on the stream still read it. So growing drains the stream first, then frees the old block (before
// taking the larger one, so the two are never held together).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "cuda/cuda_check.cuh"
#include "zinf/device.h"

namespace zinf::cuda {

class Scratch {
 public:
  explicit Scratch(const char* what) : what_(what) {}
  // At least `bytes` of device memory, valid for work enqueued on `s` until the next larger request.
  void* get(Device& dev, cudaStream_t s, std::size_t bytes) {
    if (bytes > buf_.size()) {
      ZINF_CUDA(cudaStreamSynchronize(s));  // kernels queued on the old block may still read it
      buf_.reset();
      buf_ = DeviceBuffer(dev, bytes, what_);
    }
    return buf_.as<void>();
  }

 private:
  const char* what_;
  DeviceBuffer buf_;
};

}  // namespace zinf::cuda
