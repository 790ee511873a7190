// engine_test.cpp — the offload engine without a model: the same gradients through every placement
// and both overlap modes give bit-identical masters; windows hold the right weights; budgets hold;
// an NVMe read failure during the Update fails cleanly.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "zinf/cpu_adam/convert.h"
#include "zinf/device.h"
#include "zinf/backends/cpu.h"
#include "zinf/error.h"
#include "zinf/offload/engine.h"
#include "engine_harness.h"

namespace zinf::offload {
namespace {

using namespace test;

TEST(OffloadEngine, EveryPlacementAndOverlapModeIsBitIdentical) {
  Dir dir;
  for (Precision prec : {Precision::fp32, Precision::fp16, Precision::bf16}) {
    for (std::int64_t ga : {1, 2}) {
      const auto ref = run(config(OffloadDevice::none, OffloadDevice::none, prec, ga, Overlap::none, dir.p), 3);
      for (auto opt : {OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme})
        for (auto param : {OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme})
          for (auto ov : {Overlap::exact, Overlap::none}) {
            SCOPED_TRACE(::testing::Message() << "prec " << static_cast<int>(prec) << " ga " << ga << " opt "
                                              << static_cast<int>(opt) << " param " << static_cast<int>(param) << " overlap "
                                              << static_cast<int>(ov));
            const auto got = run(config(opt, param, prec, ga, ov, dir.p), 3);
            for (std::size_t u = 0; u < ref.size(); ++u)
              ASSERT_EQ(std::memcmp(got[u].data(), ref[u].data(), ref[u].size() * 4), 0) << "unit " << u;
          }
    }
  }
  EXPECT_TRUE(fs::is_empty(dir.p));  // every swap directory was removed
}

TEST(OffloadEngine, WindowsKeepDeviceMemoryBounded) {
  Dir dir;
  std::size_t peak_off = 0, peak_none = 0;
  run(config(OffloadDevice::nvme, OffloadDevice::nvme, Precision::fp16, 1, Overlap::exact, dir.p), 2, &peak_off);
  run(config(OffloadDevice::none, OffloadDevice::none, Precision::fp16, 1, Overlap::exact, dir.p), 2, &peak_none);
  EXPECT_LT(peak_off * 2, peak_none);  // the device holds the persistent units and two windows only
  const EngineConfig c = config(OffloadDevice::nvme, OffloadDevice::nvme, Precision::fp16, 1, Overlap::exact, dir.p);
  EXPECT_EQ(peak_off, Engine::device_bytes(c));  // and exactly what the engine planned
}

TEST(OffloadEngine, AllocatesExactlyWhatThePlanSays) {
  Dir dir;
  for (auto opt : {OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme})
    for (auto param : {OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme})
      for (Precision prec : {Precision::fp32, Precision::bf16}) {
        SCOPED_TRACE(::testing::Message() << "opt " << static_cast<int>(opt) << " param " << static_cast<int>(param));
        const EngineConfig c = config(opt, param, prec, 2, Overlap::exact, dir.p);
        auto dev = make_cpu_device(64 << 20);
        Engine e(c, *dev, [&](std::size_t u, float* p) { init(u, p, c.units[u]); });
        EXPECT_EQ(dev->in_use(), Engine::device_bytes(c));
        EXPECT_EQ(e.pinned_capacity(), Engine::pinned_bytes(c));
      }
}

TEST(OffloadEngine, RefusesAPlanOverTheBudgetBeforeAllocating) {
  Dir dir;
  auto dev = make_cpu_device(100000);
  const EngineConfig c = config(OffloadDevice::none, OffloadDevice::none, Precision::fp32, 1, Overlap::exact, dir.p);
  try {
    Engine e(c, *dev, [&](std::size_t u, float* p) { init(u, p, c.units[u]); });
    FAIL();
  } catch (const DeviceMemoryError& err) {
    EXPECT_NE(std::string(err.what()).find("the offload plan needs"), std::string::npos) << err.what();
  }
  EXPECT_EQ(dev->peak(), 0u);
}

TEST(OffloadEngine, NvmeReadFailureDuringTheUpdateFailsCleanly) {
  Dir dir;
  for (auto ov : {Overlap::exact, Overlap::none}) {
    nvme::FaultPlan faults;
    faults.fail_errno = EIO;
    EngineConfig c = config(OffloadDevice::nvme, OffloadDevice::cpu, Precision::bf16, 1, ov, dir.p);
    c.optimizer_faults = &faults;
    auto dev = make_cpu_device(64 << 20);
    bool failed = false;
    {
      Engine e(c, *dev, [&](std::size_t u, float* p) { init(u, p, c.units[u]); });
      faults.fail_at = faults.seen.load() + 3;  // a read of the first Update's sub-groups
      try {
        for (int s = 1; s <= 2; ++s) {
          e.begin_micro_batch(0);
          e.begin_forward();
          for (std::size_t u = 0; u < c.units.size(); ++u) {
            e.weights(u);
            e.done_with(u);
          }
          e.begin_backward();
          for (std::size_t u = c.units.size(); u-- > 0;) {
            float* g = e.grads(u);
            for (std::size_t i = 0; i < c.units[u]; ++i) g[i] = 1e-3f;
            e.grads_done(u);
          }
          StepOptions o;
          o.hyper.lr = 1e-3f;
          o.step = s;
          e.step(o);
        }
        e.synchronize();
      } catch (const IoError& err) {
        failed = true;
        EXPECT_EQ(err.error_number(), EIO);
        EXPECT_NE(std::string(err.what()).find(dir.p.string()), std::string::npos) << err.what();
      }
    }
    EXPECT_TRUE(failed) << "overlap " << static_cast<int>(ov);
    EXPECT_TRUE(fs::is_empty(dir.p));  // the swap directory is gone
    EXPECT_EQ(dev->in_use(), 0u);
  }
}

}  // namespace
}  // namespace zinf::offload
