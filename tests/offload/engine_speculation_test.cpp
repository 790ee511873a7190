// engine_speculation_test.cpp — what a discarded speculative Update leaves behind, at the engine
// level: a skipped step (an overflow seen after the last units were updated speculatively) and an
// abandoned one (synchronize() between the last backward and step(), or the engine torn down there)
// restore the states and compute copies exactly, rebuild only the units speculation rewrote, land
// none, count an overflow's rollback in its own step and an abandoned speculation not at all — and the
// run then continues exactly as one that never speculated. The optimizer in host memory (a backup of
// half the sub-groups, so speculation stops part way) and on NVMe (every sub-group). And without
// speculation, a skipped step's NVMe walk writes nothing back.
#include <gtest/gtest.h>

#include "engine_harness.h"

namespace zinf::offload::test {
namespace {

// A step of run_on's model with speculation expected.
StepOutcome full_step(Engine& e, const EngineConfig& c, int s, double clip, bool poison = false) {
  e.expect_step(options(s, clip));
  forward_backward(e, c, s, 0, 1, poison);
  return e.step(options(s, clip));
}

EngineConfig speculating(OffloadDevice opt, OffloadDevice param, const std::string& dir) {
  EngineConfig c = config(opt, param, Precision::fp32, 1, Overlap::exact, dir);
  c.plan.speculative = true;
  return c;
}

const std::pair<OffloadDevice, OffloadDevice> kPlacements[] = {{OffloadDevice::cpu, OffloadDevice::none},
                                                               {OffloadDevice::nvme, OffloadDevice::cpu}};

// An overflow seen after units 4, 3, … were updated speculatively: the step is skipped, the states
// and compute copies are the step-1 ones, only the touched units were rebuilt and none landed, the
// rollback is counted at once; step 3 then equals that of a run that never speculated.
TEST(EngineSpeculation, ASkippedStepRebuildsOnlyWhatSpeculationRewroteAndLandsNothing) {
  for (auto [opt, param] : kPlacements) {
    SCOPED_TRACE(std::string("optimizer ") + std::string(to_string(opt)) + " param " + std::string(to_string(param)));
    Dir dir;
    std::vector<std::vector<float>> plain;
    {
      EngineConfig c = speculating(opt, param, dir.p.string());
      c.plan.speculative = false;
      auto dev = make_cpu_device(64 << 20);
      Engine e(c, *dev, [&](std::size_t u, float* p) { init(u, p, c.plan.unit_params[u]); });
      for (int s = 1; s <= 3; ++s) EXPECT_EQ(full_step(e, c, s, 0, s == 2).finite, s != 2);
      plain = read_all(e, c).master;
    }
    const EngineConfig c = speculating(opt, param, dir.p.string());
    auto dev = make_cpu_device(64 << 20);
    Engine e(c, *dev, [&](std::size_t u, float* p) { init(u, p, c.plan.unit_params[u]); });
    ASSERT_TRUE(full_step(e, c, 1, 0).finite);
    const States before = read_all(e, c);
    const auto weights = weights_of(e, c);
    const SpeculationCounts c0 = e.speculation_counts();
    EXPECT_EQ(c0.landed, 5);  // step 1 landed each unit once
    e.expect_step(options(2, 0));
    forward_backward(e, c, 2, 0, 1, /*poison=*/true);
    wait_for_speculation(e, c0.updated);
    EXPECT_FALSE(e.step(options(2, 0)).finite);
    const SpeculationCounts c1 = e.speculation_counts();
    EXPECT_EQ(c1.rollbacks, c0.rollbacks + 1) << "counted by step() itself";
    const States after = read_all(e, c);  // (synchronizes: every restore is done)
    const SpeculationCounts c2 = e.speculation_counts();
    EXPECT_EQ(c2.landed, c0.landed) << "a skipped step lands nothing";
    EXPECT_GT(c2.restored, c0.restored);
    EXPECT_LT(c2.restored - c0.restored, 5) << "unit 0 (infinite) was never updated: it is not rebuilt";
    EXPECT_TRUE(same_bits(after.master, before.master));
    EXPECT_TRUE(same_bits(after.m, before.m));
    EXPECT_TRUE(same_bits(after.v, before.v));
    EXPECT_TRUE(same_bits(weights_of(e, c), weights));
    EXPECT_TRUE(full_step(e, c, 3, 0).finite);
    EXPECT_TRUE(same_bits(read_all(e, c).master, plain));
  }
}

// synchronize() between the last backward and step(): the speculation is abandoned — states and
// compute copies as before the step, nothing landed, no rollback counted — and the step run again
// gives what a run without the abandoned attempt gives. An engine torn down there ends cleanly.
TEST(EngineSpeculation, AnAbandonedSpeculationRestoresEverythingAndLandsNothing) {
  for (auto [opt, param] : kPlacements) {
    SCOPED_TRACE(std::string("optimizer ") + std::string(to_string(opt)) + " param " + std::string(to_string(param)));
    Dir dir;
    const EngineConfig c = speculating(opt, param, dir.p.string());
    std::vector<std::vector<float>> plain;
    {
      auto dev = make_cpu_device(64 << 20);
      Engine e(c, *dev, [&](std::size_t u, float* p) { init(u, p, c.plan.unit_params[u]); });
      for (int s = 1; s <= 3; ++s) EXPECT_TRUE(full_step(e, c, s, 0).finite);
      plain = read_all(e, c).master;
    }
    auto dev = make_cpu_device(64 << 20);
    {
      Engine e(c, *dev, [&](std::size_t u, float* p) { init(u, p, c.plan.unit_params[u]); });
      ASSERT_TRUE(full_step(e, c, 1, 0).finite);
      const States before = read_all(e, c);
      const auto weights = weights_of(e, c);
      const SpeculationCounts c0 = e.speculation_counts();
      e.expect_step(options(2, 0));
      forward_backward(e, c, 2);
      wait_for_speculation(e, c0.updated);
      e.synchronize();
      const SpeculationCounts c1 = e.speculation_counts();
      EXPECT_EQ(c1.rollbacks, c0.rollbacks) << "an abandoned speculation is not a rollback";
      EXPECT_EQ(c1.landed, c0.landed);
      EXPECT_GT(c1.restored, c0.restored);
      const States after = read_all(e, c);
      EXPECT_TRUE(same_bits(after.master, before.master));
      EXPECT_TRUE(same_bits(after.m, before.m));
      EXPECT_TRUE(same_bits(after.v, before.v));
      EXPECT_TRUE(same_bits(weights_of(e, c), weights));
      for (int s = 2; s <= 3; ++s) EXPECT_TRUE(full_step(e, c, s, 0).finite);
      EXPECT_TRUE(same_bits(read_all(e, c).master, plain));
    }
    {  // torn down with a speculation in flight
      Engine e(c, *dev, [&](std::size_t u, float* p) { init(u, p, c.plan.unit_params[u]); });
      ASSERT_TRUE(full_step(e, c, 1, 0).finite);
      const std::int64_t updated = e.speculation_counts().updated;
      e.expect_step(options(2, 0));
      forward_backward(e, c, 2);
      wait_for_speculation(e, updated);
    }
    EXPECT_EQ(dev->in_use(), 0u);
  }
}

// Without speculation, a skipped step's Update walk over NVMe states (started early, reading its
// first sub-groups during the backward) stops at the verdict: nothing is written back, at most what
// was read ahead is read, the states are unchanged, and the next step updates as usual.
TEST(EngineSpeculation, ASkippedStepWithoutSpeculationWritesNoStatesBack) {
  Dir dir;
  EngineConfig c = config(OffloadDevice::nvme, OffloadDevice::none, Precision::fp32, 1, Overlap::exact, dir.p.string());
  auto dev = make_cpu_device(64 << 20);
  Engine e(c, *dev, [&](std::size_t u, float* p) { init(u, p, c.plan.unit_params[u]); });
  // One step's NVMe traffic: the step, then its Update walk to the end (it overlaps what follows).
  auto step_io = [&](int s, bool poison) {
    (void)e.take_times();
    const bool finite = full_step(e, c, s, 0, poison).finite;
    e.synchronize();
    EXPECT_EQ(finite, !poison);
    return e.take_times();
  };
  const BusyTimes first = step_io(1, false);
  ASSERT_GT(first.nvme_read_bytes(), 0);
  ASSERT_GT(first.nvme_write_bytes(), 0);
  const States before = read_all(e, c);
  const BusyTimes skipped = step_io(2, true);
  EXPECT_EQ(skipped.nvme_write_bytes(), 0) << "a skipped step writes no state back";
  EXPECT_LT(skipped.nvme_read_bytes(), first.nvme_read_bytes()) << "it stops reading at the verdict";
  const States after = read_all(e, c);
  EXPECT_TRUE(same_bits(after.master, before.master));
  EXPECT_TRUE(same_bits(after.m, before.m));
  EXPECT_TRUE(same_bits(after.v, before.v));
  const BusyTimes next = step_io(3, false);
  EXPECT_EQ(next.nvme_write_bytes(), first.nvme_write_bytes());
  EXPECT_FALSE(same_bits(read_all(e, c).master, after.master));
}

}  // namespace
}  // namespace zinf::offload::test
