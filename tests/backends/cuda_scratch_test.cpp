// cuda_scratch_test.cpp — the CUDA ops' scratch blocks go back to the device's caching allocator only
// once the compute stream has drained: kernels still queued may read the old block, and the cache
// hands freed blocks to the next allocation at once. A wrapper device notes, at every free, whether
// work is still pending on the compute stream; long work is queued before each op whose scratch
// grows. Skips with the reason without a GPU.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "../common/forwarding_device.h"
#include "cuda/cuda.h"
#include "cuda/cuda_ops.h"
#include "zinf/backends/gpu.h"
#include "zinf/device.h"

namespace zinf {
namespace {

// The CUDA device, with every free() noting whether the compute stream still had work queued.
class FreeWatch final : public ::zinf::test::ForwardingDevice {
 public:
  explicit FreeWatch(std::unique_ptr<Device> in) : ForwardingDevice(std::move(in)) {}
  std::vector<bool> busy_at_free;  // one entry per free, while watching
  bool watching = false;

  void free(void* p) override {
    if (watching) busy_at_free.push_back(!ForwardingDevice::record(StreamRole::compute)->done());
    ForwardingDevice::free(p);
  }
};

TEST(CudaScratch, GrowingAttentionScratchWaitsForTheStream) {
  const cuda::GpuQuery q = cuda::query_gpus();
  if (q.gpus.empty()) GTEST_SKIP() << "no GPU: " << q.status;
  FreeWatch dev(cuda::make_cuda_device(0, std::size_t{4} << 30));
  auto ops = cuda::make_cuda_ops(dev);
  const int B = 1, C = 64, H = 4, KV = 2, D = C / H, T_big = 256;
  const std::size_t rows = static_cast<std::size_t>(B) * T_big;
  DeviceBuffer qkv(dev, rows * 3 * C * 4, "qkv"), dqkv(dev, rows * 3 * C * 4, "dqkv"), dout(dev, rows * C * 4, "dout"),
      out(dev, rows * C * 4, "out"), att(dev, static_cast<std::size_t>(B) * H * T_big * T_big * 4, "att");
  ops->zero(qkv.as<float>(), rows * 3 * C);
  ops->zero(dout.as<float>(), rows * C);
  ops->zero(att.as<float>(), static_cast<std::size_t>(B) * H * T_big * T_big);
  // Long work ahead of an op, so the stream is certainly still busy when the op's host code runs:
  // a few gigabytes of memset take milliseconds, the host's path to the free microseconds.
  const std::size_t filler_floats = std::size_t{256} << 20;  // 1 GiB
  DeviceBuffer filler(dev, filler_floats * 4, "filler");
  auto queue_long_work = [&] {
    for (int i = 0; i < 8; ++i) ops->zero(filler.as<float>(), filler_floats);
  };

  for (int T : {32, 64, 128, T_big}) {  // each call needs a larger [B,H,T,T] scratch
    queue_long_work();
    dev.watching = true;
    ops->attention_backward(dqkv.as<float>(), dout.as<float>(), qkv.as<float>(), att.as<float>(), out.as<float>(), B, T,
                            C, H);
    dev.watching = false;
  }
  for (int T : {32, 64, 128, T_big}) {  // the GQA backward's per-row scratch
    queue_long_work();
    dev.watching = true;
    const float* x = qkv.as<float>();
    float* dx = dqkv.as<float>();
    ops->gqa_attention_backward(dx, dx + rows * C, dx + 2 * rows * C, dout.as<float>(), x, x + rows * C,
                                x + 2 * rows * C, att.as<float>(), out.as<float>(), B, T, H, KV, D, 0);
    dev.watching = false;
  }
  dev.synchronize();
  ASSERT_FALSE(dev.busy_at_free.empty()) << "no scratch block was replaced";
  for (std::size_t i = 0; i < dev.busy_at_free.size(); ++i)
    EXPECT_FALSE(dev.busy_at_free[i]) << "free #" << i << " handed a block back while kernels were still queued";
}

}  // namespace
}  // namespace zinf
