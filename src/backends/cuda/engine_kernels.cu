// engine_kernels.cu — EngineKernels on the GPU (engine_kernels.h). Compiled with --fmad=false: the
// spec's separate multiplies and adds stay separate.
#include <cuda_runtime.h>

#include <cmath>
#include <string>
#include <vector>

#include "cuda/cuda.h"
#include "cuda/cuda_check.cuh"
#include "zinf/cpu_adam/host_threads.h"
#include "zinf/cpu_adam/spec.h"
#include "zinf/error.h"

namespace zinf::cuda {
namespace {

using cpu_adam::GradType;
using cpu_adam::HalfType;
namespace spec = cpu_adam::spec;

__device__ inline float load_grad(const void* g, GradType t, std::size_t i) {
  if (t == GradType::fp32) return static_cast<const float*>(g)[i];
  const std::uint16_t h = static_cast<const std::uint16_t*>(g)[i];
  return t == GradType::fp16 ? spec::fp16_to_fp32(h) : spec::bf16_to_fp32(h);
}

__global__ void to_half_kernel(const float* s, std::uint16_t* d, std::size_t n, HalfType t) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) d[i] = t == HalfType::fp16 ? spec::fp32_to_fp16(s[i]) : spec::fp32_to_bf16(s[i]);
}
__global__ void from_half_kernel(const std::uint16_t* s, float* d, std::size_t n, HalfType t) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) d[i] = t == HalfType::fp16 ? spec::fp16_to_fp32(s[i]) : spec::bf16_to_fp32(s[i]);
}
__global__ void add_kernel(float* acc, const float* x, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) acc[i] += x[i];
}
// One thread per (64 Ki block, lane): lane l sums elements l, l+16, … of its block, as cpu_adam does.
__global__ void sum_squares_kernel(const void* g, GradType t, std::size_t n, double* partial) {
  const std::size_t idx = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  const std::size_t block = idx / 16, lane = idx % 16;
  const std::size_t begin = block * cpu_adam::kNormBlock;
  if (begin >= n) return;
  const std::size_t end = begin + cpu_adam::kNormBlock < n ? begin + cpu_adam::kNormBlock : n;
  double acc = 0;
  for (std::size_t i = begin + lane; i < end; i += 16) {
    const double x = load_grad(g, t, i);
    acc += x * x;  // x·x is exact in double: with or without contraction the same bits
  }
  partial[idx] = acc;
}
__device__ inline void store_param16(const cpu_adam::UpdateChunk& c, std::size_t i, float p) {
  if (!c.param16) return;
  auto* out = static_cast<std::uint16_t*>(c.param16);
  out[i] = c.param16_type == HalfType::fp16 ? spec::fp32_to_fp16(p) : spec::fp32_to_bf16(p);
}

// fp32 and bf16 states. Element i of cpu_adam/reference.cpp's adam_scalar_range, one thread per
// element: both call the spec's adam_element and conversions, so the GPU's Update equals the host's
// bit for bit.
template <cpu_adam::StateFormat S>
__global__ void adam_kernel(cpu_adam::AdamStep st, cpu_adam::UpdateChunk c) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= c.n) return;
  float p = c.master[i], m, v;
  if constexpr (S == cpu_adam::StateFormat::fp32) {
    m = static_cast<const float*>(c.m)[i];
    v = static_cast<const float*>(c.v)[i];
  } else {
    m = spec::bf16_to_fp32(static_cast<const std::uint16_t*>(c.m)[i]);
    v = spec::bf16_to_fp32(static_cast<const std::uint16_t*>(c.v)[i]);
  }
  spec::adam_element(st, load_grad(c.grad, c.grad_type, i), p, m, v);
  c.master[i] = p;
  if constexpr (S == cpu_adam::StateFormat::fp32) {
    static_cast<float*>(c.m)[i] = m;
    static_cast<float*>(c.v)[i] = v;
  } else {
    static_cast<std::uint16_t*>(c.m)[i] = spec::fp32_to_bf16(m);
    static_cast<std::uint16_t*>(c.v)[i] = spec::fp32_to_bf16(v);
  }
  store_param16(c, i, p);
}

// The largest of each thread's x over the CTA (kQ8Block threads), for every thread. No atomics.
__device__ inline std::uint32_t block_max(std::uint32_t x, std::uint32_t* warp_max) {
  for (int o = 16; o > 0; o /= 2) x = max(x, __shfl_xor_sync(0xFFFFFFFFu, x, o));
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x / 32] = x;
  __syncthreads();
  std::uint32_t r = 0;
  for (unsigned w = 0; w < cpu_adam::kQ8Block / 32; ++w) r = max(r, warp_max[w]);
  return r;
}

// q8 states: one CTA of kQ8Block threads per block (a partial last block has idle threads). Each
// thread decodes its m and v, runs the spec's step, and takes part in the block-wide maximum of the
// exponents of the new values; then each encodes its own element under the block's exponent, as
// spec::q8_encode_block does for the whole block on the host.
__global__ void adam_q8_kernel(cpu_adam::AdamStep st, cpu_adam::UpdateChunk c) {
  using cpu_adam::StateKind;
  __shared__ std::uint32_t m_warp[cpu_adam::kQ8Block / 32], v_warp[cpu_adam::kQ8Block / 32];
  const std::size_t blk = blockIdx.x, i = blk * cpu_adam::kQ8Block + threadIdx.x;
  const bool live = i < c.n;
  auto* mc = static_cast<std::uint8_t*>(c.m);
  auto* vc = static_cast<std::uint8_t*>(c.v);
  float m = 0, v = 0;
  std::uint32_t me = 0, ve = 0;
  if (live) {
    float p = c.master[i];
    m = spec::q8_decode(mc[i], c.m_scale[blk], StateKind::m);
    v = spec::q8_decode(vc[i], c.v_scale[blk], StateKind::v);
    spec::adam_element(st, load_grad(c.grad, c.grad_type, i), p, m, v);
    c.master[i] = p;
    store_param16(c, i, p);
    me = spec::q8_exponent(m);
    ve = spec::q8_exponent(v);
  }
  // Every thread has read the scales before block_max's barrier; thread 0 rewrites them after it.
  const std::uint32_t E_m = spec::q8_block_exponent(block_max(me, m_warp), StateKind::m);
  const std::uint32_t E_v = spec::q8_block_exponent(block_max(ve, v_warp), StateKind::v);
  if (threadIdx.x == 0) {
    c.m_scale[blk] = spec::q8_scale(E_m);
    c.v_scale[blk] = spec::q8_scale(E_v);
  }
  if (live) {
    mc[i] = spec::q8_encode(m, E_m, StateKind::m);
    vc[i] = spec::q8_encode(v, E_v, StateKind::v);
  }
}

class CudaEngineKernels final : public offload::EngineKernels {
 public:
  explicit CudaEngineKernels(Device& d) : dev_(d) {}
  // n = 0 (bytes = 0) is a no-op (engine_kernels.h): a launch of zero blocks is an invalid
  // configuration, so every launcher returns before it.
  void zero(void* p, std::size_t bytes, StreamRole s) override {
    if (bytes) ZINF_CUDA(cudaMemsetAsync(p, 0, bytes, st(s)));
  }
  void to_half(const float* src, void* dst, std::size_t n, HalfType t, StreamRole s) override {
    if (!n) return;
    cuda::launch(to_half_kernel, ops::blocks_for(n, 256), 256, 0, st(s), src, static_cast<std::uint16_t*>(dst), n, t);
    ZINF_CUDA_LAUNCH_CHECK("to_half");
  }
  void from_half(const void* src, float* dst, std::size_t n, HalfType t, StreamRole s) override {
    if (!n) return;
    cuda::launch(from_half_kernel, ops::blocks_for(n, 256), 256, 0, st(s), static_cast<const std::uint16_t*>(src), dst,
                 n, t);
    ZINF_CUDA_LAUNCH_CHECK("from_half");
  }
  // Device memory, or the pinned pool (the fp32 compute copy of a parameter home in host memory,
  // written by the device's Update): cudaMemcpyDefault lets the runtime tell which by the unified
  // address, where a fixed DeviceToDevice kind would be undefined for a host pointer.
  void copy(void* dst, const void* src, std::size_t bytes, StreamRole s) override {
    if (!bytes) return;
    ZINF_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, st(s)));
  }
  void add(float* acc, const float* x, std::size_t n, StreamRole s) override {
    if (!n) return;
    cuda::launch(add_kernel, ops::blocks_for(n, 256), 256, 0, st(s), acc, x, n);
    ZINF_CUDA_LAUNCH_CHECK("add");
  }
  std::vector<std::vector<double>> block_sums(const std::vector<NormInput>& in, StreamRole s) override {
    std::vector<std::size_t> first(in.size() + 1, 0);  // each input's first 16-lane slot in `partial_`
    for (std::size_t i = 0; i < in.size(); ++i)
      first[i + 1] = first[i] + (in[i].n + cpu_adam::kNormBlock - 1) / cpu_adam::kNormBlock * 16;
    std::vector<std::vector<double>> out(in.size());
    if (first.back() == 0) return out;
    if (partial_.size() < first.back() * sizeof(double))
      partial_ = DeviceBuffer(dev_, first.back() * sizeof(double), "norm partials");
    for (std::size_t i = 0; i < in.size(); ++i) {  // every unit's kernel, then one copy and one wait
      const std::size_t threads = first[i + 1] - first[i];
      if (!threads) continue;
      cuda::launch(sum_squares_kernel, ops::blocks_for(threads, 128), 128, 0, st(s), in[i].g, in[i].t, in[i].n,
                   partial_.as<double>() + first[i]);
      ZINF_CUDA_LAUNCH_CHECK("sum_squares");
    }
    host_.resize(first.back());
    ZINF_CUDA(cudaMemcpyAsync(host_.data(), partial_.as<double>(), first.back() * sizeof(double),
                              cudaMemcpyDeviceToHost, st(s)));
    ZINF_CUDA(cudaStreamSynchronize(st(s)));
    for (std::size_t i = 0; i < in.size(); ++i)
      for (std::size_t b = first[i]; b < first[i + 1]; b += 16) out[i].push_back(spec::fold16(host_.data() + b));
    return out;
  }
  void adam_update(const cpu_adam::AdamStep& s, const cpu_adam::UpdateChunk& c, StreamRole r) override {
    if (!c.n) return;
    cpu_adam::UpdateChunk k = c;
    // The new 16-bit compute copy may go to a parameter home in pinned host memory (parameters
    // offloaded, optimizer on the device): the kernel writes it through the page-locked memory's
    // device address, never through the host pointer.
    if (k.param16) k.param16 = device_address(k.param16, "the Update's 16-bit parameter output");
    switch (k.states) {
      case cpu_adam::StateFormat::fp32:
        cuda::launch(adam_kernel<cpu_adam::StateFormat::fp32>, ops::blocks_for(k.n, 256), 256, 0, st(r), s, k);
        break;
      case cpu_adam::StateFormat::bf16:
        cuda::launch(adam_kernel<cpu_adam::StateFormat::bf16>, ops::blocks_for(k.n, 256), 256, 0, st(r), s, k);
        break;
      case cpu_adam::StateFormat::q8: {
        const std::size_t blocks = cpu_adam::state_scales(k.states, k.n);
        ZINF_CHECK(blocks <= 0x7FFFFFFFu);
        cuda::launch(adam_q8_kernel, static_cast<unsigned>(blocks), cpu_adam::kQ8Block, 0, st(r), s, k);
        break;
      }
    }
    ZINF_CUDA_LAUNCH_CHECK("adam_update");
  }

 private:
  cudaStream_t st(StreamRole s) const { return static_cast<cudaStream_t>(dev_.native_stream(s)); }
  // The address a kernel may use for `p`: itself for device memory; the mapped device address of
  // registered (page-locked) host memory; an error for host memory the device cannot reach.
  static void* device_address(void* p, const char* what) {
    cudaPointerAttributes a{};
    ZINF_CUDA(cudaPointerGetAttributes(&a, p));
    if (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged) return p;
    if (a.type == cudaMemoryTypeHost && a.devicePointer) return a.devicePointer;
    throw Error(std::string("CUDA engine kernels: ") + what + " is host memory that is not registered with the device",
                "a kernel can only write page-locked memory registered with cudaHostRegister (the engine's pinned "
                "pool); this is a bug in the engine, please report it");
  }
  Device& dev_;
  DeviceBuffer partial_;
  std::vector<double> host_;
};

}  // namespace

std::unique_ptr<offload::EngineKernels> make_cuda_engine_kernels(Device& dev) {
  if (!dev.native_stream(StreamRole::compute) || dev.name().rfind("cpu", 0) == 0)
    throw Error("CUDA engine kernels need the CUDA device");
  return std::make_unique<CudaEngineKernels>(dev);
}

}  // namespace zinf::cuda
