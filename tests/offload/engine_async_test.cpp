// engine_async_test.cpp — the offload engine's ordering contract on the asynchronous CPU device: the
// synthetic model's reads and writes run on the compute stream, every stream and host worker waits a
// seeded random time before each job, and every placement × overlap × precision × GA must still give
// the synchronous device's masters bit for bit. A missing event between two streams shows up here as
// a different master on some seed. Seeds: ZINF_ASYNC_SEEDS (default 3) per configuration.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <vector>

#include "common/forwarding_device.h"
#include "engine_harness.h"
#include "zinf/backends/cpu.h"
#include "zinf/device.h"
#include "zinf/offload/buffer_specs.h"
#include "zinf/offload/engine.h"

namespace zinf::offload {
namespace {

using namespace test;

int seeds() {
  const char* v = std::getenv("ZINF_ASYNC_SEEDS");
  return v && *v ? std::max(1, std::atoi(v)) : 3;
}

CpuDeviceOptions jittered(std::uint64_t seed) {
  CpuDeviceOptions o;
  o.async = true;
  o.jitter = JitterSpec{seed, 100};
  return o;
}

TEST(OffloadEngineAsync, TheDeviceSaysItsOpsAreStreamOrdered) {
  EXPECT_FALSE(make_cpu_device(1 << 20)->ops_stream_ordered());
  EXPECT_TRUE(make_cpu_device(1 << 20, jittered(1))->ops_stream_ordered());
}

// Every placement of the optimizer (`opts`) × the parameters (none, cpu, nvme) × overlap mode, in
// precision `prec` at GA `ga`, each config changed by `adjust` and run `repeats` times by `run_one`
// (config, jitter seed) on the jittered device: each run equals the synchronous run without offload.
template <class Adjust, class RunOne>
void expect_placements_equal(const fs::path& dir, std::initializer_list<OffloadDevice> opts, Precision prec,
                             std::int64_t ga, int repeats, std::uint64_t& seed, Adjust adjust, RunOne run_one) {
  const auto ref = run(config(OffloadDevice::none, OffloadDevice::none, prec, ga, Overlap::none, dir), 3);
  for (auto opt : opts)
    for (auto param : {OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme})
      for (auto ov : {Overlap::exact, Overlap::none})
        for (int k = 0; k < repeats; ++k) {
          ++seed;
          SCOPED_TRACE(::testing::Message() << "prec " << static_cast<int>(prec) << " ga " << ga << " opt "
                                            << static_cast<int>(opt) << " param " << static_cast<int>(param)
                                            << " overlap " << static_cast<int>(ov) << " jitter seed " << seed);
          EngineConfig c = config(opt, param, prec, ga, ov, dir);
          adjust(c);
          const auto got = run_one(c, seed);
          for (std::size_t u = 0; u < ref.size(); ++u)
            ASSERT_EQ(std::memcmp(got[u].data(), ref[u].data(), ref[u].size() * 4), 0) << "unit " << u;
        }
}

std::vector<std::vector<float>> run_jittered(const EngineConfig& c, std::uint64_t seed) {
  return run(c, 3, nullptr, 64 << 20, jittered(seed));
}

TEST(OffloadEngineAsync, EveryPlacementOverlapPrecisionAndGaEqualsTheSynchronousRunUnderJitter) {
  Dir dir("zinf-engine-async-test");
  std::uint64_t seed = 0;
  for (Precision prec : {Precision::fp32, Precision::fp16, Precision::bf16})
    for (std::int64_t ga : {1, 2})
      expect_placements_equal(dir.p, {OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme}, prec, ga, seeds(),
                              seed, [](EngineConfig&) {}, run_jittered);
  EXPECT_TRUE(fs::is_empty(dir.p));
}

// The micro batches' gradients summed on the device (device_grad_accum) with the optimizer off it:
// every precision, placement and overlap mode equals the synchronous run without offload, under
// jitter — the sum leaves the device once per step, after its last add.
TEST(OffloadEngineAsync, GradientsSummedOnTheDeviceEqualTheSynchronousRunUnderJitter) {
  Dir dir("zinf-engine-async-test");
  std::uint64_t seed = 200;
  for (Precision prec : {Precision::fp32, Precision::fp16, Precision::bf16})
    expect_placements_equal(
        dir.p, {OffloadDevice::cpu, OffloadDevice::nvme}, prec, 3, 1, seed,
        [](EngineConfig& c) {
          c.plan.device_grad_accum = true;
          ASSERT_TRUE(BufferSpecs(c.plan).layout().device_accum);
        },
        run_jittered);
  EXPECT_TRUE(fs::is_empty(dir.p));
}

// pin_memory false: the staging pool is pageable and unregistered, and every copy through it is
// made as CUDA makes pageable copies (a copy to the device reads its source when called, a copy to
// the host returns once done) on the jittered device — every placement still equals the pinned run.
TEST(OffloadEngineAsync, PageableStagingEqualsPinnedStagingUnderJitter) {
  Dir dir("zinf-engine-async-test");
  std::uint64_t seed = 100;
  for (Precision prec : {Precision::fp32, Precision::bf16})
    expect_placements_equal(
        dir.p, {OffloadDevice::cpu, OffloadDevice::nvme}, prec, 2, 1, seed, [](EngineConfig& c) { c.plan.pin_memory = false; },
        [](const EngineConfig& c, std::uint64_t s) {
          ::zinf::test::ForwardingDevice dev(make_cpu_device(64 << 20, jittered(s)));
          dev.pageable_copies(true);
          auto got = run_on(dev, c, 3);
          EXPECT_GT(dev.unregistered_copies().size(), 0u) << "the staging is pageable";
          return got;
        });
  EXPECT_TRUE(fs::is_empty(dir.p));
}

// The compressed state formats under jitter: every placement and overlap mode equals the synchronous
// run of the same format (the tiers' encoded m, v and scales are handed over in order too).
TEST(OffloadEngineAsync, EachStateFormatEqualsTheSynchronousRunUnderJitter) {
  Dir dir("zinf-engine-async-test");
  std::uint64_t seed = 1000;
  for (auto f : {cpu_adam::StateFormat::bf16, cpu_adam::StateFormat::q8}) {
    auto cfg = [&](OffloadDevice opt, OffloadDevice param, Overlap ov) {
      EngineConfig c = config(opt, param, Precision::bf16, 2, ov, dir.p);
      c.plan.optimizer_states = f;
      return c;
    };
    const auto ref = run(cfg(OffloadDevice::none, OffloadDevice::none, Overlap::none), 3);
    for (auto opt : {OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme})
      for (auto param : {OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme})
        for (auto ov : {Overlap::exact, Overlap::none}) {
          SCOPED_TRACE(::testing::Message() << cpu_adam::state_format_name(f) << " opt " << static_cast<int>(opt)
                                            << " param " << static_cast<int>(param) << " overlap "
                                            << static_cast<int>(ov) << " jitter seed " << seed);
          const auto got = run(cfg(opt, param, ov), 3, nullptr, 64 << 20, jittered(seed++));
          for (std::size_t u = 0; u < ref.size(); ++u)
            ASSERT_EQ(std::memcmp(got[u].data(), ref[u].data(), ref[u].size() * 4), 0) << "unit " << u;
        }
  }
  EXPECT_TRUE(fs::is_empty(dir.p));
}

// With as many windowed units as gradient slots, the next micro batch asks for a unit's gradient
// buffer while the previous micro batch's Reduce of that unit may still read it.
TEST(OffloadEngineAsync, GradientSlotsAreReusedOnlyAfterTheirReduceUnderJitter) {
  Dir dir("zinf-engine-async-test");
  for (auto opt : {OffloadDevice::cpu, OffloadDevice::nvme})
    for (Precision prec : {Precision::fp32, Precision::bf16}) {
      EngineConfig c = config(opt, OffloadDevice::cpu, prec, 3, Overlap::exact, dir.p);
      c.plan.unit_params = {5000, 20000, 20000, 300};
      c.plan.persistent = {true, false, false, true};
      EngineConfig sync_c = c;
      sync_c.plan.overlap = Overlap::none;
      const auto ref = run(sync_c, 2);
      for (std::uint64_t seed = 1; seed <= static_cast<std::uint64_t>(4 * seeds()); ++seed) {
        SCOPED_TRACE(::testing::Message() << "opt " << static_cast<int>(opt) << " prec " << static_cast<int>(prec)
                                          << " jitter seed " << seed);
        const auto got = run(c, 2, nullptr, 64 << 20, jittered(seed));
        for (std::size_t u = 0; u < ref.size(); ++u)
          ASSERT_EQ(std::memcmp(got[u].data(), ref[u].data(), ref[u].size() * 4), 0) << "unit " << u;
      }
    }
}

}  // namespace
}  // namespace zinf::offload
