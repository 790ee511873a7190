// pcie.cu — pinned H2D, D2H and both at once on dedicated non-default streams, timed with CUDA
// events; compared with the nominal rate of the link the GPU reports through sysfs.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "cuda/cuda_check.cuh"
#include "zinf/backends/gpu.h"
#include "zinf/error.h"

namespace zinf::cuda {
PcieResult bench_pcie(int device, std::uint64_t bytes, int reps,
                      const std::function<void(const std::string&)>& progress) {
  const GpuQuery q = query_gpus(kNoOwnGpu);  // static facts: the bench makes its context itself
  if (q.gpus.empty()) throw Error("bench pcie: " + q.status, "run it on a machine with an NVIDIA GPU and driver");
  if (device < 0 || device >= static_cast<int>(q.gpus.size()))
    throw ConfigError("bench pcie: --device " + std::to_string(device) + " does not exist (" + q.status + ")");
  const GpuInfo& g = q.gpus[static_cast<std::size_t>(device)];
  PcieResult r;
  r.gpu = g.name;
  const PcieLink link = pcie_nominal_link(g);  // the maximum link: an idle GPU's current one is stepped down
  r.pcie_gen = link.gen;
  r.pcie_width = link.width;
  r.nominal_gbps = pcie_nominal_gbps(link.gen, link.width);
  r.bytes = bytes;
  ZINF_CUDA(cudaSetDevice(device));
  void *h_src = nullptr, *h_dst = nullptr, *d_a = nullptr, *d_b = nullptr;
  cudaStream_t h2d = nullptr, d2h = nullptr;
  cudaEvent_t e[7] = {};
  auto cleanup = [&] {
    for (auto& ev : e)
      if (ev) cudaEventDestroy(ev);
    if (h2d) cudaStreamDestroy(h2d);
    if (d2h) cudaStreamDestroy(d2h);
    if (d_a) cudaFree(d_a);
    if (d_b) cudaFree(d_b);
    if (h_src) cudaFreeHost(h_src);
    if (h_dst) cudaFreeHost(h_dst);
  };
  try {
    ZINF_CUDA(cudaHostAlloc(&h_src, bytes, cudaHostAllocDefault));
    ZINF_CUDA(cudaHostAlloc(&h_dst, bytes, cudaHostAllocDefault));
    ZINF_CUDA(cudaMalloc(&d_a, bytes));
    ZINF_CUDA(cudaMalloc(&d_b, bytes));
    ZINF_CUDA(cudaStreamCreateWithFlags(&h2d, cudaStreamNonBlocking));
    ZINF_CUDA(cudaStreamCreateWithFlags(&d2h, cudaStreamNonBlocking));
    for (auto& ev : e) ZINF_CUDA(cudaEventCreate(&ev));
    std::memset(h_src, 1, bytes);
    auto time_ms = [&](cudaEvent_t a, cudaEvent_t b) {
      float ms = 0;
      ZINF_CUDA(cudaEventElapsedTime(&ms, a, b));
      return static_cast<double>(ms);
    };
    double best_h2d = 1e30, best_d2h = 1e30, best_both = 1e30;
    for (int rep = 0; rep < reps; ++rep) {
      progress("rep " + std::to_string(rep + 1) + "/" + std::to_string(reps));
      ZINF_CUDA(cudaEventRecord(e[0], h2d));
      ZINF_CUDA(cudaMemcpyAsync(d_a, h_src, bytes, cudaMemcpyHostToDevice, h2d));
      ZINF_CUDA(cudaEventRecord(e[1], h2d));
      ZINF_CUDA(cudaEventSynchronize(e[1]));
      best_h2d = std::min(best_h2d, time_ms(e[0], e[1]));
      ZINF_CUDA(cudaEventRecord(e[2], d2h));
      ZINF_CUDA(cudaMemcpyAsync(h_dst, d_a, bytes, cudaMemcpyDeviceToHost, d2h));
      ZINF_CUDA(cudaEventRecord(e[3], d2h));
      ZINF_CUDA(cudaEventSynchronize(e[3]));
      best_d2h = std::min(best_d2h, time_ms(e[2], e[3]));
      // Both directions at once: the d2h stream waits for the h2d stream's start event; each stream
      // records its own end, and the pair took until the later of the two.
      ZINF_CUDA(cudaEventRecord(e[4], h2d));
      ZINF_CUDA(cudaStreamWaitEvent(d2h, e[4], 0));
      ZINF_CUDA(cudaMemcpyAsync(d_b, h_src, bytes, cudaMemcpyHostToDevice, h2d));
      ZINF_CUDA(cudaMemcpyAsync(h_dst, d_a, bytes, cudaMemcpyDeviceToHost, d2h));
      ZINF_CUDA(cudaEventRecord(e[5], h2d));
      ZINF_CUDA(cudaEventRecord(e[6], d2h));
      ZINF_CUDA(cudaEventSynchronize(e[5]));
      ZINF_CUDA(cudaEventSynchronize(e[6]));
      best_both = std::min(best_both, std::max(time_ms(e[4], e[5]), time_ms(e[4], e[6])));
    }
    r.h2d_gbps = static_cast<double>(bytes) / (best_h2d * 1e-3) / 1e9;
    r.d2h_gbps = static_cast<double>(bytes) / (best_d2h * 1e-3) / 1e9;
    r.both_gbps = 2.0 * static_cast<double>(bytes) / (best_both * 1e-3) / 1e9;
  } catch (...) {
    cleanup();
    throw;
  }
  cleanup();
  return r;
}

}  // namespace zinf::cuda
