// device_cpu_test.cpp — the CPU device's streams: order within a stream and event handoffs between
// streams hold under jitter, the jitter really changes how streams interleave, busy time counts only
// a stream's own work inside marks, and the environment switches async mode and jitter.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "zinf/backends/cpu.h"
#include "zinf/device.h"
#include "zinf/error.h"

namespace zinf {
namespace {

CpuDeviceOptions jitter(std::uint64_t seed, int us = 50) {
  CpuDeviceOptions o;
  o.jitter = JitterSpec{seed, us};
  return o;
}

TEST(CpuDevice, JobsOnOneStreamRunInOrderUnderJitter) {
  auto dev = make_cpu_device(1 << 20, jitter(7));
  std::vector<int> seen;
  for (int i = 0; i < 200; ++i) dev->launch(StreamRole::h2d, [&seen, i] { seen.push_back(i); });
  dev->synchronize(StreamRole::h2d);
  ASSERT_EQ(seen.size(), 200u);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(seen[static_cast<std::size_t>(i)], i);
}

TEST(CpuDevice, AnEventHandsABufferFromOneStreamToAnotherUnderJitter) {
  for (std::uint64_t seed = 1; seed <= 5; ++seed) {
    auto dev = make_cpu_device(1 << 20, jitter(seed));
    std::vector<int> buf(64, 0), got(64, -1);
    for (int round = 1; round <= 20; ++round) {
      dev->launch(StreamRole::h2d, [&buf, round] {
        for (auto& x : buf) x = round;
      });
      dev->wait_event(StreamRole::compute, dev->record(StreamRole::h2d));  // the writer's event
      dev->launch(StreamRole::compute, [&buf, &got] { got = buf; });
      dev->wait_event(StreamRole::h2d, dev->record(StreamRole::compute));  // the reader's, before reuse
      dev->synchronize();
      for (int x : got) ASSERT_EQ(x, round) << "seed " << seed;
    }
  }
}

// The order in which two unsynchronised streams' jobs land depends on the seed: the jitter makes
// the interleavings that a missing event would be exposed to.
TEST(CpuDevice, JitterChangesHowStreamsInterleave) {
  std::set<std::vector<int>> orders;
  for (std::uint64_t seed = 1; seed <= 6; ++seed) {
    auto dev = make_cpu_device(1 << 20, jitter(seed, 300));
    std::mutex mu;
    std::vector<int> log;
    for (int i = 0; i < 30; ++i)
      for (StreamRole r : {StreamRole::h2d, StreamRole::d2h})
        dev->launch(r, [&mu, &log, r] {
          std::lock_guard<std::mutex> lk(mu);
          log.push_back(static_cast<int>(r));
        });
    dev->synchronize();
    orders.insert(log);
  }
  EXPECT_GE(orders.size(), 2u);
}

TEST(CpuDevice, BusyTimeIsTheStreamsOwnWorkInsideMarks) {
  auto dev = make_cpu_device(1 << 20);
  auto nap = [] { std::this_thread::sleep_for(std::chrono::milliseconds(20)); };
  dev->launch(StreamRole::d2h, nap);  // outside marks: not counted
  dev->synchronize();
  EXPECT_EQ(dev->take_busy(StreamRole::d2h), 0.0);

  dev->busy_begin(StreamRole::d2h);
  dev->launch(StreamRole::d2h, nap);
  dev->busy_end(StreamRole::d2h);
  dev->synchronize();
  EXPECT_GE(dev->take_busy(StreamRole::d2h), 0.020);
  EXPECT_EQ(dev->take_busy(StreamRole::d2h), 0.0);  // taken: reset

  // A wait for another stream's event inside marks is not the stream's work.
  dev->launch(StreamRole::h2d, nap);
  EventHandle e = dev->record(StreamRole::h2d);
  dev->busy_begin(StreamRole::d2h);
  dev->wait_event(StreamRole::d2h, e);
  dev->busy_end(StreamRole::d2h);
  dev->synchronize();
  EXPECT_EQ(dev->take_busy(StreamRole::d2h), 0.0);
  EXPECT_EQ(dev->take_busy(StreamRole::compute), 0.0);
}

// Marks from two host threads on one stream (the trainer's Fetch and the Update's Upload share h2d)
// nest: the stream is busy while either is open.
TEST(CpuDevice, BusyMarksNest) {
  auto dev = make_cpu_device(1 << 20);
  auto nap = [] { std::this_thread::sleep_for(std::chrono::milliseconds(20)); };
  dev->busy_begin(StreamRole::h2d);
  dev->busy_begin(StreamRole::h2d);
  dev->busy_end(StreamRole::h2d);
  dev->launch(StreamRole::h2d, nap);  // one mark still open: counted
  dev->busy_end(StreamRole::h2d);
  dev->synchronize();
  EXPECT_GE(dev->take_busy(StreamRole::h2d), 0.020);
  dev->launch(StreamRole::h2d, nap);  // every mark closed: not counted
  dev->synchronize();
  EXPECT_EQ(dev->take_busy(StreamRole::h2d), 0.0);
}

TEST(CpuDevice, TheEnvironmentSwitchesAsyncModeAndJitter) {
  ::setenv("ZINF_DEVICE_ASYNC", "1", 1);
  ::setenv("ZINF_JITTER_SEED", "42", 1);
  ::setenv("ZINF_JITTER_US", "30", 1);
  CpuDeviceOptions o = cpu_device_options_from_env({});
  EXPECT_TRUE(o.async);
  EXPECT_EQ(o.jitter.seed, 42u);
  EXPECT_EQ(o.jitter.max_us, 30);
  auto dev = make_cpu_device(1 << 20, o);
  EXPECT_TRUE(dev->ops_stream_ordered());
  EXPECT_NE(dev->name().find("jitter seed 42"), std::string::npos) << dev->name();
  ::setenv("ZINF_JITTER_SEED", "forty", 1);
  EXPECT_THROW(cpu_device_options_from_env({}), Error);
  ::unsetenv("ZINF_DEVICE_ASYNC");
  ::unsetenv("ZINF_JITTER_SEED");
  ::unsetenv("ZINF_JITTER_US");
  o = cpu_device_options_from_env({});
  EXPECT_FALSE(o.async);
  EXPECT_FALSE(o.jitter.enabled());
}

}  // namespace
}  // namespace zinf
