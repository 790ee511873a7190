// engine_dp_test.cpp — the offload engine across data-parallel ranks (run under mpirun): the
// communicator's collectives; every ZeRO stage × placement × overlap mode giving one result; N ranks
// × GA g against one rank × GA g·N; the plan's per-rank bytes against what a rank allocates; and
// checkpoint states moving between world sizes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>

#include "../offload/checked_kernels.h"
#include "../offload/engine_harness.h"
#include "dp_world.h"
#include "stream_comm.h"
#include "zinf/error.h"
#include "zinf/offload/placement.h"

namespace zinf::offload::test {
namespace {

using zinf::test::within;
using zinf::test::world;

// Units large enough to be split across ranks (shards are 64 Ki-aligned), with one that leaves the
// last rank empty, and buckets / sub-groups that cross shard boundaries.
EngineConfig dp_config(int stage, OffloadDevice opt, OffloadDevice param, Precision prec, std::int64_t ga, Overlap ov,
                       const std::string& dir) {
  EngineConfig c = config(opt, param, prec, ga, ov, dir);
  c.plan.unit_params = {5000, 200000, 90000, 140000, 300};
  c.plan.persistent = {true, false, false, false, true};
  c.plan.sub_group_size = 32768;
  c.plan.reduce_bucket_size = 40960;
  c.plan.stage = stage;
  use_comm(c, &world());
  return c;
}

std::vector<std::vector<float>> run_dp(const EngineConfig& c, int steps, const CpuDeviceOptions& o = {}) {
  auto dev = make_cpu_device(256 << 20, o);
  return run_on(*dev, c, steps, world().rank(), world().size());
}

// Whether every rank got the same result as its own `want` (and all ranks agree).
std::uint64_t digest(const std::vector<std::vector<float>>& m) {
  std::uint64_t h = 1469598103934665603ull;
  for (const auto& v : m)
    for (float x : v) {
      std::uint32_t b;
      std::memcpy(&b, &x, 4);
      h = (h ^ b) * 1099511628211ull;
    }
  return h;
}

TEST(Comm, CollectivesMoveEveryPartToItsPlace) {
  ZINF_NEED_RANKS();
  Comm& c = world();
  const int W = c.size(), R = c.rank();
  // alltoallv: rank r sends (r+1)·(k+1) elements to rank k, each valued 1000·r + k.
  std::vector<std::size_t> sc, rc;
  std::vector<float> send;
  for (int k = 0; k < W; ++k) {
    sc.push_back(static_cast<std::size_t>((R + 1) * (k + 1)));
    rc.push_back(static_cast<std::size_t>((k + 1) * (R + 1)));
    for (int i = 0; i < (R + 1) * (k + 1); ++i) send.push_back(static_cast<float>(1000 * R + k));
  }
  std::vector<float> recv(std::accumulate(rc.begin(), rc.end(), std::size_t{0}), -1.0f);
  c.alltoallv(send.data(), sc, recv.data(), rc, 4);
  std::size_t at = 0;
  for (int k = 0; k < W; ++k)
    for (std::size_t i = 0; i < rc[static_cast<std::size_t>(k)]; ++i)
      EXPECT_EQ(recv[at++], static_cast<float>(1000 * k + R));
  // allgatherv in place, with an empty part.
  std::vector<std::size_t> counts;
  for (int k = 0; k < W; ++k) counts.push_back(k == 1 ? 0 : static_cast<std::size_t>(3 + k));
  std::vector<std::uint16_t> all(std::accumulate(counts.begin(), counts.end(), std::size_t{0}), 0);
  std::size_t off = 0;
  for (int k = 0; k < R; ++k) off += counts[static_cast<std::size_t>(k)];
  for (std::size_t i = 0; i < counts[static_cast<std::size_t>(R)]; ++i)
    all[off + i] = static_cast<std::uint16_t>(100 * R + i);
  c.allgatherv(all.data(), counts, 2);
  off = 0;
  for (int k = 0; k < W; ++k)
    for (std::size_t i = 0; i < counts[static_cast<std::size_t>(k)]; ++i) EXPECT_EQ(all[off++], 100 * k + i);
  // broadcast, the rank-ordered sum, any, same.
  double x = R == 0 ? 42.5 : 0.0;
  c.broadcast(&x, sizeof x, 0);
  EXPECT_EQ(x, 42.5);
  EXPECT_EQ(c.sum(R + 0.25), W * (W - 1) / 2.0 + 0.25 * W);
  EXPECT_TRUE(c.any(R == W - 1));
  EXPECT_FALSE(c.any(false));
  EXPECT_TRUE(c.same(0x123456789abcdef0ull));
  EXPECT_FALSE(c.same(R == 0 ? 1u : 2u));
  auto d = c.dup();  // a second communicator: independent order
  EXPECT_EQ(d->rank(), R);
  EXPECT_EQ(d->sum(1.0), static_cast<double>(W));
}

TEST(Shards, AreContiguousAlignedAndCoverTheUnit) {
  for (int W : {1, 2, 3, 5, 8})
    for (std::uint64_t n : {0ull, 1ull, 65535ull, 65536ull, 200000ull, 1000003ull}) {
      std::uint64_t next = 0;
      for (int r = 0; r < W; ++r) {
        const Shard s = shard_of(n, W, r);
        EXPECT_EQ(s.lo, next) << n << " " << W << " " << r;
        EXPECT_LE(s.lo, s.hi);
        if (s.hi < n) {
          EXPECT_EQ(s.hi % kShardAlign, 0u);
        }
        next = s.hi;
      }
      EXPECT_EQ(next, n);
    }
}

struct Case {
  int stage;
  OffloadDevice opt, param;
};
// The placements DeepSpeed allows per stage: optimizer offload from stage 1, parameter offload at 3.
std::vector<Case> cases() {
  std::vector<Case> v{{0, OffloadDevice::none, OffloadDevice::none}};
  for (int st : {1, 2})
    for (auto o : {OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme})
      v.push_back({st, o, OffloadDevice::none});
  for (auto o : {OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme})
    for (auto p : {OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme}) v.push_back({3, o, p});
  return v;
}

std::string name(const Case& k, Overlap ov) {
  return "stage " + std::to_string(k.stage) + " optimizer " + std::string(to_string(k.opt)) + " param " +
         std::string(to_string(k.param)) + (ov == Overlap::exact ? " exact" : " none");
}

TEST(EngineDp, EveryStagePlacementAndOverlapGivesOneResult) {
  ZINF_NEED_RANKS();
  Dir dir("zinf-dp-test");
  for (Precision prec : {Precision::fp32, Precision::bf16, Precision::fp16})
    for (std::int64_t ga : {1, 2}) {
      const auto ref =
          run_dp(dp_config(0, OffloadDevice::none, OffloadDevice::none, prec, ga, Overlap::none, dir.p), 3);
      EXPECT_TRUE(world().same(digest(ref))) << "ranks disagree";
      for (const Case& k : cases())
        for (Overlap ov : {Overlap::exact, Overlap::none}) {
          const auto got = run_dp(dp_config(k.stage, k.opt, k.param, prec, ga, ov, dir.p), 3);
          EXPECT_EQ(digest(got), digest(ref)) << name(k, ov) << " " << to_string(prec) << " GA " << ga;
        }
    }
}

TEST(EngineDp, RanksMatchOneRankWithTheirAccumulation) {
  ZINF_NEED_RANKS();
  Dir dir("zinf-dp-test");
  const int W = world().size();
  for (Precision prec : {Precision::fp32, Precision::bf16})
    for (std::int64_t ga : {1, 2}) {
      const auto dp = run_dp(dp_config(2, OffloadDevice::cpu, OffloadDevice::none, prec, ga, Overlap::exact, dir.p), 3);
      EngineConfig one = dp_config(0, OffloadDevice::cpu, OffloadDevice::none, prec, ga * W, Overlap::exact, dir.p);
      use_comm(one, nullptr);  // this rank alone
      const auto solo = run(one, 3);
      if (ga == 1) {  // contributions summed in rank order = one rank's micro batches in order: exact
        EXPECT_EQ(digest(dp), digest(solo)) << to_string(prec);
      } else {  // (a+b)+(c+d) against ((a+b)+c)+d: within rounding
        double worst = 0;
        for (std::size_t u = 0; u < dp.size(); ++u)
          for (std::size_t i = 0; i < dp[u].size(); ++i)
            worst = std::max(worst, std::fabs(double(dp[u][i]) - double(solo[u][i])));
        EXPECT_LT(worst, prec == Precision::fp32 ? 1e-5 : 1e-2) << to_string(prec) << " GA " << ga;
        EXPECT_GT(worst, 0.0) << "different summation orders should differ somewhere (or the test is not testing)";
      }
    }
}

// One rank abandons a speculative Update (synchronize() between the last backward and step(), as
// a teardown after an error does) while the other never speculated: the abandon issues no
// collective — re-landing every unit, as a skipped step once did, gathered each unit's new compute
// copy with a collective the other rank never joined, a hang — and every rank's states and compute
// copies are as before the step.
TEST(EngineDp, AnAbandonedSpeculationOnOneRankIssuesNoCollective) {
  ZINF_NEED_RANKS();
  Dir dir("zinf-dp-test");
  const int R = world().rank(), W = world().size();
  for (OffloadDevice opt : {OffloadDevice::cpu, OffloadDevice::nvme}) {
    EngineConfig c = dp_config(2, opt, OffloadDevice::none, Precision::fp32, 1, Overlap::exact, dir.p);
    c.plan.speculative = true;
    auto dev = make_cpu_device(256 << 20);
    within(120, std::string("an abandoned speculation, optimizer ") + std::string(to_string(opt)), [&] {
      Engine e(c, *dev, [&](std::size_t u, float* p) { init(u, p, c.plan.unit_params[u]); });
      e.expect_step(options(1, 0));
      forward_backward(e, c, 1, R, W);
      EXPECT_TRUE(e.step(options(1, 0)).finite);
      const States before = read_all(e, c);
      const auto weights = weights_of(e, c);
      const SpeculationCounts c0 = e.speculation_counts();
      if (R == 0) e.expect_step(options(2, 0));  // rank 0 alone speculates
      forward_backward(e, c, 2, R, W);
      if (R == 0) wait_for_speculation(e, c0.updated);
      e.synchronize();
      const SpeculationCounts c1 = e.speculation_counts();
      EXPECT_EQ(c1.landed, c0.landed);
      EXPECT_EQ(c1.rollbacks, c0.rollbacks);
      if (R == 0) {
        EXPECT_GT(c1.restored, c0.restored);
      }
      const States after = read_all(e, c);
      EXPECT_TRUE(same_bits(after.master, before.master)) << to_string(opt);
      EXPECT_TRUE(same_bits(after.m, before.m)) << to_string(opt);
      EXPECT_TRUE(same_bits(after.v, before.v)) << to_string(opt);
      EXPECT_TRUE(same_bits(weights_of(e, c), weights)) << to_string(opt);
    });
  }
}

TEST(EngineDp, AsynchronousJitteredDeviceGivesTheSameResult) {
  ZINF_NEED_RANKS();
  Dir dir("zinf-dp-test");
  const auto ref =
      run_dp(dp_config(0, OffloadDevice::none, OffloadDevice::none, Precision::bf16, 2, Overlap::none, dir.p), 3);
  for (const Case& k :
       {Case{2, OffloadDevice::cpu, OffloadDevice::none}, Case{3, OffloadDevice::none, OffloadDevice::none},
        Case{3, OffloadDevice::cpu, OffloadDevice::cpu}, Case{3, OffloadDevice::nvme, OffloadDevice::nvme}})
    for (std::uint64_t seed : {1, 2}) {
      CpuDeviceOptions o;
      o.async = true;
      o.jitter = JitterSpec{seed * 7 + static_cast<std::uint64_t>(world().rank()), 100};
      const auto got = run_dp(dp_config(k.stage, k.opt, k.param, Precision::bf16, 2, Overlap::exact, dir.p), 3, o);
      EXPECT_EQ(digest(got), digest(ref)) << name(k, Overlap::exact) << " seed " << seed;
    }
}

// NCCL's convention on the CPU device (stream_comm.h): collectives on device memory are jobs on a
// stream, each blocking its stream until every rank joins, one at a time per process. Collectives
// issued by several host threads (the Reduce worker's at grads_done, the Update worker's gathers at
// landing, the trainer's at Fetch) would run in a timing-dependent order, and two ranks with
// different orders wait for each other for ever, as two GPUs would. With a stream-ordered transport
// the engine issues them all from the trainer's thread through one CollectiveOrder: every stage and
// placement must finish under jitter, with the one result.
TEST(EngineDp, StreamOrderedCollectivesReachEveryRanksStreamsInOneOrder) {
  ZINF_NEED_RANKS();
  Dir dir("zinf-dp-test");
  const auto ref =
      run_dp(dp_config(0, OffloadDevice::none, OffloadDevice::none, Precision::bf16, 2, Overlap::none, dir.p), 3);
  for (const Case& k : cases())
    for (std::uint64_t seed : {3, 4}) {
      CpuDeviceOptions o;
      o.async = true;
      o.jitter = JitterSpec{seed * 11 + static_cast<std::uint64_t>(world().rank()), 200};
      auto dev = make_cpu_device(256 << 20, o);
      zinf::test::StreamOrderedComm dc(world().dup(), *dev);
      EngineConfig c = dp_config(k.stage, k.opt, k.param, Precision::bf16, 2, Overlap::exact, dir.p);
      c.device_comm = &dc;
      std::vector<std::vector<float>> got;
      within(120, name(k, Overlap::exact) + " seed " + std::to_string(seed),
             [&] { got = run_on(*dev, c, 3, world().rank(), world().size()); });
      EXPECT_EQ(digest(got), digest(ref)) << name(k, Overlap::exact) << " seed " << seed;
    }
}

// Small units leave some ranks empty shards, and most ranks own nothing of some buckets: with the
// optimizer on the device, partitioned gradients and accumulation, none of that may reach the
// device's kernels as a zero-sized call (a GPU refuses a launch of zero blocks). Every stage, on
// both devices, with the one result.
TEST(EngineDp, EmptyShardsMakeNoEmptyKernelCalls) {
  ZINF_NEED_RANKS();
  Dir dir("zinf-dp-test");
  auto small = [&](int stage, Precision prec, Overlap ov) {
    EngineConfig c = dp_config(stage, OffloadDevice::none, OffloadDevice::none, prec, 2, ov, dir.p);
    c.plan.unit_params = {5000, 8, 200000, 9, 90000, 300};
    c.plan.persistent = {true, false, false, false, false, true};
    return c;
  };
  for (Precision prec : {Precision::fp32, Precision::bf16}) {
    const auto ref = run_dp(small(0, prec, Overlap::none), 2);
    for (int stage : {0, 1, 2, 3})
      for (bool async : {false, true}) {
        auto empty = std::make_shared<std::atomic<int>>(0);
        EngineConfig c = small(stage, prec, Overlap::exact);
        c.kernels = non_empty_kernels(empty);
        CpuDeviceOptions o;
        o.async = async;
        o.jitter = async ? JitterSpec{5 + static_cast<std::uint64_t>(world().rank()), 100} : JitterSpec{};
        const auto got = run_dp(c, 2, o);
        EXPECT_EQ(empty->load(), 0) << "stage " << stage << " " << to_string(prec) << (async ? " async" : "");
        EXPECT_EQ(digest(got), digest(ref)) << "stage " << stage << " " << to_string(prec) << (async ? " async" : "");
      }
  }
}

TEST(EngineDp, EachRankAllocatesWhatItsPlanSays) {
  ZINF_NEED_RANKS();
  Dir dir("zinf-dp-test");
  for (const Case& k : cases())
    for (Precision prec : {Precision::fp32, Precision::fp16})
      for (std::int64_t ga : {1, 2}) {
        const EngineConfig c = dp_config(k.stage, k.opt, k.param, prec, ga, Overlap::exact, dir.p);
        auto dev = make_cpu_device(256 << 20);
        Engine e(c, *dev, [&](std::size_t u, float* p) { init(u, p, c.plan.unit_params[u]); });
        EXPECT_EQ(dev->in_use(), Engine::device_bytes(c)) << name(k, Overlap::exact) << " GA " << ga;
        EXPECT_EQ(e.pinned_capacity(), Engine::pinned_bytes(c)) << name(k, Overlap::exact) << " GA " << ga;
      }
  // And partitioning shrinks a rank's share: stage 3 holds less on the device than stage 0.
  PlanInput in = dp_config(0, OffloadDevice::none, OffloadDevice::none, Precision::fp16, 1, Overlap::exact, dir.p).plan;
  const auto s0 = make_plan(in).totals[0];
  in.stage = 3;
  EXPECT_LT(make_plan(in).totals[0], s0);
}

// ---- gradient streaming (offload_optimizer.gradient_streaming) across ranks ----


EngineConfig streaming_dp(int stage, OffloadDevice param, Precision prec, const std::string& dir, bool on = true) {
  EngineConfig c = dp_config(stage, OffloadDevice::nvme, param, prec, 1, Overlap::exact, dir);
  c.plan.gradient_streaming = on;
  return c;
}

// Each rank's plan with streaming: no host gradient; on NVMe the fp32 reduced gradient of the part it
// keeps (its shard under stage ≥ 2, with 3 ranks an empty one for the 300-parameter unit, else every
// unit whole), each unit's tensor padded to 4 KiB; in pinned memory two ring slots of the largest of
// those parts. The engine holds exactly the plan's bytes on every tier, its swap files included, and
// claims every handoff of its step graph.
TEST(EngineDp, StreamingRanksHoldTheirKeptGradientOnNvmeAndTheirPlansBytes) {
  ZINF_NEED_RANKS();
  Dir dir("zinf-dp-test");
  constexpr int D = 0, P = 1, H = 2, NV = 3;
  const int W = world().size(), R = world().rank();
  for (int stage : {1, 2, 3})
    for (auto param : {OffloadDevice::none, OffloadDevice::nvme})
      for (bool speculative : {false, true}) {
        if (param != OffloadDevice::none && stage < 3) continue;
        SCOPED_TRACE("stage " + std::to_string(stage) + " param " + std::string(to_string(param)) +
                     (speculative ? " speculative" : ""));
        EngineConfig c = streaming_dp(stage, param, Precision::bf16, dir.p.string());
        c.plan.speculative = speculative;
        EngineConfig off = c;
        off.plan.gradient_streaming = false;
        const Plan on_plan = make_plan(c.plan), off_plan = make_plan(off.plan);
        std::uint64_t nvme = 0, largest = 0, whole = 0;
        for (std::int64_t n : c.plan.unit_params) {
          const std::uint64_t N = static_cast<std::uint64_t>(n);
          const std::uint64_t kept = stage >= 2 ? shard_of(N, W, R).len() : N;
          nvme += (kept * 4 + 4095) / 4096 * 4096;
          largest = std::max(largest, kept);
          whole += kept * 4;
        }
        EXPECT_EQ(plan_row(off_plan.states, "grad32", H), whole) << "without streaming: the kept fp32 sum on the host";
        EXPECT_EQ(plan_row(on_plan.states, "grad32", H), 0u);
        EXPECT_EQ(plan_row(on_plan.states, "grad32", NV), nvme);
        const std::uint64_t ring = (speculative ? 2 : 1) * ((largest * 4 + 4095) / 4096 * 4096);  // one: no speculation
        EXPECT_EQ(plan_row(on_plan.buffers, "grad ring", P), ring);
        EXPECT_EQ(on_plan.totals[H], off_plan.totals[H] - whole);
        EXPECT_EQ(on_plan.totals[P], off_plan.totals[P] + ring);
        EXPECT_EQ(on_plan.totals[NV], off_plan.totals[NV] + nvme);
        EXPECT_EQ(on_plan.totals[D], off_plan.totals[D]);
        auto dev = make_cpu_device(256 << 20);
        {
          Engine e(c, *dev, [&](std::size_t u, float* p) { init(u, p, c.plan.unit_params[u]); });
          const TierBytes held = e.held_bytes();
          for (int t = 0; t < kTiers; ++t) EXPECT_EQ(held[t], on_plan.totals[t]) << tier_name(static_cast<Tier>(t));
          EXPECT_EQ(e.pinned_capacity(), held[P]);
          EXPECT_EQ(swap_file_bytes(dir.p), held[NV]);
          const auto unclaimed = e.unclaimed_handoffs();
          EXPECT_TRUE(unclaimed.empty()) << unclaimed.front();
        }
        EXPECT_EQ(dev->in_use(), 0u);
      }
}

// Streamed gradients across ranks give the masters of the same ranks without streaming, bit for bit:
// ZeRO stages 1, 2 and 3 (parameters on the device and on NVMe), fp32 and fp16, on the synchronous
// and the jittered asynchronous device; the Update reads every unit's kept gradient back from NVMe
// (run_on expects no step, so nothing speculates: train_dp_test covers the speculation).
TEST(EngineDp, StreamingGivesTheMastersOfTheRanksWithoutIt) {
  ZINF_NEED_RANKS();
  Dir dir("zinf-dp-test");
  for (Precision prec : {Precision::fp32, Precision::fp16}) {
    const auto ref = run_dp(streaming_dp(2, OffloadDevice::none, prec, dir.p.string(), false), 3);
    for (int stage : {1, 2, 3})
      for (auto param : {OffloadDevice::none, OffloadDevice::nvme})
        for (bool async : {false, true}) {
          if (param != OffloadDevice::none && stage < 3) continue;
          const std::string what = "stage " + std::to_string(stage) + " param " + std::string(to_string(param)) + " " +
                                   std::string(to_string(prec)) + (async ? " async" : "");
          CpuDeviceOptions o;
          o.async = async;
          o.jitter = async ? JitterSpec{9 + static_cast<std::uint64_t>(world().rank()), 100} : JitterSpec{};
          std::vector<std::vector<float>> got;
          within(120, what, [&] { got = run_dp(streaming_dp(stage, param, prec, dir.p.string()), 3, o); });
          EXPECT_EQ(digest(got), digest(ref)) << what;
        }
  }
}

// The speculative Update across ranks takes each unit's kept gradient from its ring slot: with no
// clipping its sub-groups are updated speculatively and kept (nothing read back); with every step
// clipped they are redone with the gradients read back from NVMe. The masters equal the ranks'
// speculative Update without streaming bit for bit, and the ranks agree; three steps, stages 1, 2, 3.
TEST(EngineDp, StreamedSpeculationTakesTheKeptGradientFromTheRing) {
  ZINF_NEED_RANKS();
  Dir dir("zinf-dp-test");
  const int R = world().rank(), W = world().size();
  for (int stage : {1, 2, 3})
    for (double clip : {0.0, 1.0}) {
      const std::string what = "stage " + std::to_string(stage) + " clip " + std::to_string(clip);
      std::vector<std::uint64_t> digests;
      std::int64_t updated = 0, rollbacks = 0;
      for (bool on : {true, false}) {
        EngineConfig c = streaming_dp(stage, OffloadDevice::none, Precision::bf16, dir.p.string(), on);
        c.plan.speculative = true;
        auto dev = make_cpu_device(256 << 20);
        std::vector<std::vector<float>> masters;
        within(120, what, [&] {
          Engine e(c, *dev, [&](std::size_t u, float* p) { init(u, p, c.plan.unit_params[u]); });
          for (int s = 1; s <= 3; ++s) {
            e.expect_step(options(s, clip));
            forward_backward(e, c, s, R, W);
            EXPECT_TRUE(e.step(options(s, clip)).finite);
          }
          e.synchronize();
          for (std::size_t u = 0; u < c.plan.unit_params.size(); ++u) {
            masters.emplace_back(c.plan.unit_params[u]);
            e.read_master(u, masters.back().data());
          }
          if (on) updated = e.speculation_counts().updated, rollbacks = e.speculation_counts().rollbacks;
        });
        digests.push_back(digest(masters));
      }
      EXPECT_EQ(digests[0], digests[1]) << what;
      EXPECT_TRUE(world().same(digests[0])) << what;
      // Every rank keeps sub-groups of the large units (stage ≥ 1 shards the states): unclipped, each
      // speculates from its ring and keeps it all. Clipped (the norm is about 6), the speculation stops
      // once a rank's norm so far passes the clip — on a rank whose first unit is large, before it
      // updates anything —, and some rank's is redone.
      const double rolled = world().sum(static_cast<double>(rollbacks));
      if (clip == 0.0) {
        EXPECT_GT(updated, 0) << what << ": nothing updated speculatively from the ring";
        EXPECT_EQ(rollbacks, 0) << what;
      } else {
        EXPECT_GT(rolled, 0.0) << what << ": every step clips";
      }
    }
}

// What stays refused with several ranks: gradient accumulation in the micro-batch order (each rank
// sums its micro batches' reduced gradients in host memory, which the ring keeps only for a unit whose
// micro batches come one after another: layer_major). One line, before the engine allocates anything
// and before any collective.
TEST(EngineDp, StreamingWithGradientAccumulationIsRefusedBeforeAllocating) {
  ZINF_NEED_RANKS();
  Dir dir("zinf-dp-test");
  EngineConfig c = dp_config(2, OffloadDevice::nvme, OffloadDevice::none, Precision::bf16, 2, Overlap::exact, dir.p);
  c.plan.gradient_streaming = true;
  auto dev = make_cpu_device(256 << 20);
  try {
    Engine e(c, *dev, [&](std::size_t u, float* p) { init(u, p, c.plan.unit_params[u]); });
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("offload engine: gradient_streaming with several ranks (this job has " +
                     std::to_string(world().size()) +
                     ") and gradient_accumulation_steps 2 needs offload_optimizer.layer_major true"),
              std::string::npos)
        << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  EXPECT_EQ(dev->peak(), 0u);
  EXPECT_TRUE(fs::is_empty(dir.p));
}

TEST(EngineDp, CheckpointStatesMoveBetweenStagesAndWorldSizes) {
  ZINF_NEED_RANKS();
  Dir dir("zinf-dp-test");
  const int W = world().size(), R = world().rank();
  auto make = [&](int stage, OffloadDevice opt, OffloadDevice param, bool solo) {
    EngineConfig c = dp_config(stage, opt, param, Precision::bf16, solo ? W : 1, Overlap::exact, dir.p);
    if (solo) use_comm(c, nullptr);
    return c;
  };
  // Three steps straight through (stage 2, optimizer on NVMe) against two steps whose states are read
  // out as whole tensors, then a third after loading them into other stages, tiers and world sizes.
  auto dev = make_cpu_device(256 << 20);
  const auto straight = run_on(*dev, make(2, OffloadDevice::nvme, OffloadDevice::none, false), 3, R, W);
  States half;
  run_on(*dev, make(2, OffloadDevice::nvme, OffloadDevice::none, false), 2, R, W, 1, nullptr, &half);
  EXPECT_TRUE(world().same(digest(half.m)) && world().same(digest(half.v)))
      << "every rank reads the same whole tensors";
  EXPECT_NE(digest(half.m), digest(std::vector<std::vector<float>>(half.m.size())));
  for (const Case& k :
       {Case{0, OffloadDevice::none, OffloadDevice::none}, Case{1, OffloadDevice::cpu, OffloadDevice::none},
        Case{3, OffloadDevice::cpu, OffloadDevice::nvme}, Case{3, OffloadDevice::none, OffloadDevice::none}}) {
    const auto resumed = run_on(*dev, make(k.stage, k.opt, k.param, false), 1, R, W, 3, &half);
    EXPECT_EQ(digest(resumed), digest(straight)) << "resumed into " << name(k, Overlap::exact);
  }
  // One rank with W × the accumulation continues them exactly (GA 1 per rank), and the reverse.
  EngineConfig one = make(0, OffloadDevice::cpu, OffloadDevice::none, true);
  EXPECT_EQ(digest(run_on(*dev, one, 1, 0, 1, 3, &half)), digest(straight)) << "resumed on one rank";
  States solo_half;
  run_on(*dev, one, 2, 0, 1, 1, nullptr, &solo_half);
  EXPECT_EQ(digest(run_on(*dev, make(3, OffloadDevice::nvme, OffloadDevice::cpu, false), 1, R, W, 3, &solo_half)),
            digest(straight))
      << "one rank's states resumed on " << W;
}

}  // namespace
}  // namespace zinf::offload::test
