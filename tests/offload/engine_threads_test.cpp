// engine_threads_test.cpp — every engine worker thread binds itself to the device (Device::bind_thread)
// before its first device call. On a node with several GPUs the CUDA runtime's current device is per
// thread: a worker that never selects its rank's GPU enqueues on GPU 0. The forwarding device counts
// the calls made by threads that have not bound.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace zinf::offload::test
