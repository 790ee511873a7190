// engine_threads_test.cpp — how the engine's threads use the device, seen through a forwarding device:
// every engine worker thread binds itself to the device (Device::bind_thread) before its first device
// call — on a node with several GPUs the CUDA runtime's current device is per thread, and a worker
// that never selects its rank's GPU enqueues on GPU 0 —; the device's own Update does not wait for the
// device after every sub-group; and fp32 gradients leave the device without a device copy first.
#include <gtest/gtest.h>

#include "checked_kernels.h"
#include "common/forwarding_device.h"
#include "engine_harness.h"

namespace zinf::offload::test {
namespace {

std::string listed(const std::map<std::string, int>& m) {
  std::string s;
  for (const auto& [what, n] : m) s += what + ": " + std::to_string(n) + "; ";
  return s;
}

TEST(OffloadEngineThreads, EveryWorkerBindsBeforeItsFirstDeviceCall) {
  Dir dir("zinf-engine-threads-test");
  for (OffloadDevice opt : {OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme})
    for (OffloadDevice param : {OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme})
      for (bool async : {false, true}) {
        SCOPED_TRACE(std::string("optimizer ") + std::string(to_string(opt)) + " param " +
                     std::string(to_string(param)) + (async ? " async" : ""));
        CpuDeviceOptions o;
        o.async = async;
        zinf::test::ForwardingDevice dev(make_cpu_device(64 << 20, o));
        run_on(dev, config(opt, param, Precision::bf16, 2, Overlap::exact, dir.p), 2);
        EXPECT_TRUE(dev.unbound_calls().empty()) << listed(dev.unbound_calls());
        EXPECT_GE(dev.bound_threads(), 2u);  // the Reduce and the Update workers
      }
}

// With the optimizer states on the device, the Update is d2h stream work: splitting the units into
// eight times as many sub-groups must not add a single host wait for the stream (the units land on
// events), and gives the same masters.
TEST(OffloadEngineThreads, TheDevicesUpdateDoesNotWaitForEverySubGroup) {
  Dir dir("zinf-engine-threads-test");
  for (OffloadDevice param : {OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme})
    for (Precision prec : {Precision::fp32, Precision::bf16}) {
      SCOPED_TRACE(std::string("param ") + std::string(to_string(param)) + " " + std::string(to_string(prec)));
      int syncs[2] = {};
      std::vector<std::vector<float>> masters[2];
      for (int i = 0; i < 2; ++i) {
        EngineConfig c = config(OffloadDevice::none, param, prec, 1, Overlap::exact, dir.p);
        c.plan.sub_group_size = i == 0 ? 8192 : 1024;
        zinf::test::ForwardingDevice dev(make_cpu_device(64 << 20));
        masters[i] = run_on(dev, c, 2);
        syncs[i] = dev.syncs(StreamRole::d2h);
      }
      EXPECT_EQ(syncs[1], syncs[0]) << "host waits for d2h with 8× the sub-groups";
      EXPECT_EQ(masters[1], masters[0]);
    }
}

// The optimizer off the device in an fp32 run: GradOut copies each bucket from the gradient buffer
// straight to its pinned landing buffer — no device-to-device copy into a staging buffer on the way
// (a 16-bit run rounds into the staging buffer instead, one to_half per bucket).
TEST(OffloadEngineThreads, Fp32GradientsLeaveTheDeviceWithoutADeviceCopy) {
  Dir dir("zinf-engine-threads-test");
  for (OffloadDevice opt : {OffloadDevice::cpu, OffloadDevice::nvme})
    for (bool async : {false, true}) {
      SCOPED_TRACE(std::string("optimizer ") + std::string(to_string(opt)) + (async ? " async" : ""));
      auto empty = std::make_shared<std::atomic<int>>(0);
      auto calls = std::make_shared<KernelCalls>();
      EngineConfig c = config(opt, OffloadDevice::none, Precision::fp32, 2, Overlap::exact, dir.p);
      const auto ref = run(c, 2);
      c.kernels = non_empty_kernels(empty, calls);
      CpuDeviceOptions o;
      o.async = async;
      o.jitter = async ? JitterSpec{9, 100} : JitterSpec{};
      EXPECT_EQ(run(c, 2, nullptr, 64 << 20, o), ref);
      EXPECT_EQ(calls->of("copy"), 0);
      EXPECT_EQ(empty->load(), 0);
    }
}

}  // namespace
}  // namespace zinf::offload::test
