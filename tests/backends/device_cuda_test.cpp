// device_cuda_test.cpp — the CUDA device through the device interface: budgeted allocation, async
// copies on the role streams ordered by events, and a host job's error reaching synchronize().
// Skips with the reason where no GPU is visible.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "cuda/cuda.h"
#include "zinf/backends/gpu.h"
#include "zinf/comm.h"
#include "zinf/device.h"

namespace zinf {
namespace {

std::unique_ptr<Device> gpu_or_skip(std::size_t budget, std::string* why) {
  const cuda::GpuQuery q = cuda::query_gpus();
  if (q.gpus.empty()) {
    *why = q.status;
    return nullptr;
  }
  return cuda::make_cuda_device(0, budget);
}

TEST(CudaDevice, CopiesRoundTripAcrossStreamsOrderedByEvents) {
  std::string why;
  auto dev = gpu_or_skip(64 << 20, &why);
  if (!dev) GTEST_SKIP() << "no GPU: " << why;
  std::vector<float> src(1 << 20), dst(1 << 20, 0.0f);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i) * 0.5f;
  dev->register_host(src.data(), src.size() * 4);
  dev->register_host(dst.data(), dst.size() * 4);
  DeviceBuffer d(*dev, src.size() * 4, "roundtrip");
  dev->copy_to_device(d.as<void>(), src.data(), src.size() * 4, StreamRole::h2d);
  auto landed = dev->record(StreamRole::h2d);
  dev->wait_event(StreamRole::d2h, landed);
  dev->copy_to_host(dst.data(), d.as<void>(), dst.size() * 4, StreamRole::d2h);
  dev->synchronize(StreamRole::d2h);
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), src.size() * 4), 0);
  dev->unregister_host(src.data());
  dev->unregister_host(dst.data());
  EXPECT_GE(dev->peak(), src.size() * 4);
}

TEST(CudaDevice, BudgetAndHostJobErrors) {
  std::string why;
  auto dev = gpu_or_skip(8 << 20, &why);
  if (!dev) GTEST_SKIP() << "no GPU: " << why;
  DeviceBuffer a(*dev, 6 << 20, "a");
  EXPECT_THROW(DeviceBuffer(*dev, 6 << 20, "b"), DeviceMemoryError);
  dev->launch(StreamRole::compute, [] { throw Error("host job failed"); });
  EXPECT_THROW(dev->synchronize(StreamRole::compute), Error);
}

TEST(CudaDevice, WithoutAGpuMakingOneIsAClearError) {
  const cuda::GpuQuery q = cuda::query_gpus();
  if (!q.gpus.empty()) GTEST_SKIP() << "a GPU is visible";
  EXPECT_THROW(cuda::make_cuda_device(0, 0), Error);
}

// The NCCL communicator with one rank (all a single-GPU machine can run): every collective on
// device memory, enqueued on a device stream, moves the data where zinf/comm.h says.
TEST(Nccl, OneRankCollectivesOnDeviceMemory) {
  std::string why;
  auto dev = gpu_or_skip(64 << 20, &why);
  if (!dev) GTEST_SKIP() << "no GPU: " << why;
  auto host = make_solo_comm();
  auto nccl = cuda::make_nccl_comm(*host, 0);
  EXPECT_EQ(nccl->backend(), "nccl");
  EXPECT_TRUE(nccl->stream_ordered());
  const std::size_t n = 1 << 16;
  std::vector<float> src(n), back(n, 0.0f);
  for (std::size_t i = 0; i < n; ++i) src[i] = static_cast<float>(i) * 0.25f;
  DeviceBuffer a(*dev, n * 4, "nccl a"), b(*dev, n * 4, "nccl b");
  void* st = dev->native_stream(StreamRole::d2h);
  dev->copy_to_device(a.as<void>(), src.data(), n * 4, StreamRole::d2h);
  nccl->alltoallv(a.as<void>(), {n}, b.as<void>(), {n}, 4, st);  // to itself
  nccl->allgatherv(b.as<void>(), a.as<void>(), {n}, 4, st);      // from a separate part
  nccl->allgatherv(a.as<void>(), {n}, 4, st);                    // in place
  nccl->broadcast(a.as<void>(), n * 4, 0, st);
  dev->copy_to_host(back.data(), a.as<void>(), n * 4, StreamRole::d2h);
  dev->synchronize(StreamRole::d2h);
  EXPECT_EQ(std::memcmp(src.data(), back.data(), n * 4), 0);
  auto twin = nccl->dup();
  EXPECT_EQ(twin->size(), 1);
}

}  // namespace
}  // namespace zinf
