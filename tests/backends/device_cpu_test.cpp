// device_cpu_test.cpp — the CPU device's streams: order within a stream and event handoffs between
// streams hold under jitter, the jitter really changes how streams interleave, busy time counts only
// a stream's own work inside marks, and the environment switches async mode and jitter; the device's
// engine kernels run the Update in every optimizer-state format like cpu_adam's reference.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "zinf/backends/cpu.h"
#include "zinf/cpu_adam/adam.h"
#include "zinf/cpu_adam/host_threads.h"
#include "zinf/offload/engine_kernels.h"
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

// The CPU device's Update (split across the host pool, on a stream's worker) in every optimizer-state
// format equals cpu_adam's reference: the chunk's format, stored m/v and block scales pass through.
TEST(CpuDevice, EngineKernelsRunTheUpdateInEveryStateFormat) {
  using cpu_adam::StateFormat;
  auto dev = make_cpu_device(1 << 20);
  cpu_adam::HostThreads pool(2);
  auto k = make_cpu_engine_kernels(*dev, pool);
  const std::size_t n = (std::size_t{1} << 17) + 37;  // several pool chunks, a partial 8-bit block
  const cpu_adam::AdamStep st = cpu_adam::make_adam_step(cpu_adam::AdamHyper{.weight_decay = 0.01f}, 3, 0.5f);
  for (StateFormat f : {StateFormat::fp32, StateFormat::bf16, StateFormat::q8}) {
    SCOPED_TRACE(cpu_adam::state_format_name(f));
    std::vector<float> grad(n), m32(n), v32(n), master(n);
    for (std::size_t i = 0; i < n; ++i) {
      const float r = static_cast<float>((i * 2654435761u) % 1000003) / 1000003.0f - 0.5f;
      grad[i] = r * 0.1f, master[i] = r, m32[i] = r * 1e-3f, v32[i] = r * r * 1e-6f;
    }
    const std::size_t eb = cpu_adam::state_elem_bytes(f), ns = cpu_adam::state_scales(f, n);
    std::vector<std::uint8_t> m(n * eb), v(n * eb);
    std::vector<float> ms(ns), vs(ns);
    cpu_adam::encode_states(f, cpu_adam::StateKind::m, m32.data(), m.data(), ms.data(), n);
    cpu_adam::encode_states(f, cpu_adam::StateKind::v, v32.data(), v.data(), vs.data(), n);
    std::vector<float> master2 = master, ms2 = ms, vs2 = vs;
    std::vector<std::uint8_t> m2 = m, v2 = v;
    cpu_adam::UpdateChunk c;
    c.n = n, c.grad = grad.data(), c.grad_type = cpu_adam::GradType::fp32, c.master = master.data();
    c.m = m.data(), c.v = v.data(), c.m_scale = ms.data(), c.v_scale = vs.data(), c.states = f;
    cpu_adam::UpdateChunk c2 = c;
    c2.master = master2.data(), c2.m = m2.data(), c2.v = v2.data(), c2.m_scale = ms2.data(), c2.v_scale = vs2.data();
    k->adam_update(st, c, StreamRole::d2h);
    dev->synchronize(StreamRole::d2h);
    cpu_adam::adam_update_reference(st, c2);
    EXPECT_EQ(master, master2);
    EXPECT_EQ(m, m2);
    EXPECT_EQ(v, v2);
    EXPECT_EQ(ms, ms2);
    EXPECT_EQ(vs, vs2);
    EXPECT_NE(m, std::vector<std::uint8_t>(n * eb, 0));
  }
}

}  // namespace
}  // namespace zinf
