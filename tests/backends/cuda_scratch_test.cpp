// cuda_scratch_test.cpp — the CUDA ops' scratch blocks go back to the device's caching allocator only
// once the compute stream has drained: kernels still queued may read the old block, and the cache
// hands freed blocks to the next allocation at once. A wrapper device notes, at every free, whether
// work is still pending on the compute stream; long work is queued before each op whose scratch
// grows. Skips with the reason without a GPU.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "cuda/cuda.h"
#include "cuda/cuda_ops.h"
#include "zinf/backends/gpu.h"
#include "zinf/device.h"

namespace zinf {
namespace {

// The CUDA device, with every free() noting whether the compute stream still had work queued.
class FreeWatch final : public Device {
 public:
  explicit FreeWatch(std::unique_ptr<Device> in) : in_(std::move(in)) {}
  std::vector<bool> busy_at_free;  // one entry per free, while watching
  bool watching = false;

  std::string name() const override { return in_->name(); }
  void* allocate(std::size_t bytes, const std::string& what) override { return in_->allocate(bytes, what); }
  void free(void* p) override {
    if (watching) busy_at_free.push_back(!in_->record(StreamRole::compute)->done());
    in_->free(p);
  }
  std::size_t budget() const override { return in_->budget(); }
  std::size_t in_use() const override { return in_->in_use(); }
  std::size_t peak() const override { return in_->peak(); }
  void copy_to_device(void* d, const void* s, std::size_t n, StreamRole r) override { in_->copy_to_device(d, s, n, r); }
  void copy_to_host(void* d, const void* s, std::size_t n, StreamRole r) override { in_->copy_to_host(d, s, n, r); }
  void launch(StreamRole s, std::function<void()> fn) override { in_->launch(s, std::move(fn)); }
  void* native_stream(StreamRole s) override { return in_->native_stream(s); }
  EventHandle record(StreamRole s) override { return in_->record(s); }
  void wait_event(StreamRole s, EventHandle e) override { in_->wait_event(s, std::move(e)); }
  double elapsed_seconds(const EventHandle& a, const EventHandle& b) override { return in_->elapsed_seconds(a, b); }
  void synchronize(StreamRole s) override { in_->synchronize(s); }
  void synchronize() override { in_->synchronize(); }
  bool ops_stream_ordered() const override { return in_->ops_stream_ordered(); }
  void busy_begin(StreamRole s) override { in_->busy_begin(s); }
  void busy_end(StreamRole s) override { in_->busy_end(s); }
  double take_busy(StreamRole s) override { return in_->take_busy(s); }

 private:
  std::unique_ptr<Device> in_;
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
                                x + 2 * rows * C, att.as<float>(), out.as<float>(), B, T, H, KV, D);
    dev.watching = false;
  }
  dev.synchronize();
  ASSERT_FALSE(dev.busy_at_free.empty()) << "no scratch block was replaced";
  for (std::size_t i = 0; i < dev.busy_at_free.size(); ++i)
    EXPECT_FALSE(dev.busy_at_free[i]) << "free #" << i << " handed a block back while kernels were still queued";
}

}  // namespace
}  // namespace zinf
