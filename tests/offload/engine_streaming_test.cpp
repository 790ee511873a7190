// engine_streaming_test.cpp — gradient streaming at the engine level: `zinf plan`'s rows (no host
// gradient; the ring in pinned memory; each unit's gradient on NVMe), the engine holding exactly
// those bytes with every handoff of its step graph claimed, and the engine refusing a placement
// streaming cannot serve before it allocates anything. (The parameters' bitwise equality with the run
// without streaming is train_streaming_test's.)
#include <gtest/gtest.h>

#include <algorithm>

#include "engine_harness.h"
#include "zinf/error.h"
#include "zinf/nvme/async_io.h"
#include "zinf/offload/placement.h"

namespace zinf::offload::test {
namespace {

constexpr int D = 0, P = 1, H = 2, NV = 3;

std::uint64_t row(const std::vector<Row>& rows, const std::string& name, int tier) { return plan_row(rows, name, tier); }

EngineConfig streaming(OffloadDevice param, Precision prec, std::int64_t ga, const std::string& dir) {
  EngineConfig c = config(OffloadDevice::nvme, param, prec, ga, Overlap::exact, dir);
  c.plan.device_grad_accum = ga > 1;
  c.plan.gradient_streaming = true;
  return c;
}

// The host gradient row is gone; the gradient's bytes (2 a parameter at GA 1 in 16-bit runs, 4 for
// the fp32 sum at GA > 1 or fp32 training) are on NVMe instead, and the ring is two slots of the
// largest unit's gradient in pinned memory (one without speculation). Streaming implies the speculative Update (the states'
// NVMe rows double, as they do with speculation alone); without it they keep one slot. Nothing else moves.
TEST(EngineStreaming, ThePlanHasTheRingAndTheNvmeGradientAndNoHostGradient) {
  Dir dir;
  for (Precision prec : {Precision::bf16, Precision::fp32})
    for (std::int64_t ga : {1, 4}) {
      SCOPED_TRACE(std::string(to_string(prec)) + " GA " + std::to_string(ga));
      EngineConfig off = streaming(OffloadDevice::nvme, prec, ga, dir.p.string());
      off.plan.gradient_streaming = false;
      off.plan.speculative = true;
      EngineConfig on = streaming(OffloadDevice::nvme, prec, ga, dir.p.string());
      on.plan.speculative = true;
      const Plan a = make_plan(off.plan), b = make_plan(on.plan);
      const std::uint64_t N = 5000 + 20000 + 9000 + 20000 + 300, largest = 20000;
      const std::uint64_t gb = prec == Precision::fp32 || ga > 1 ? 4 : 2;
      const std::string grad_row = gb == 4 ? "grad32" : "grad16";
      EXPECT_EQ(row(a.states, grad_row, H), gb * N);  // without streaming: the whole gradient on the host
      EXPECT_EQ(row(b.states, grad_row, H), 0u);
      EXPECT_EQ(b.totals[H], 0u) << "no host buffer at all in this placement";
      // Each unit's gradient tensor, padded to 4 KiB.
      std::uint64_t nvme = 0;
      for (std::uint64_t n : {5000u, 20000u, 9000u, 20000u, 300u}) nvme += (n * gb + 4095) / 4096 * 4096;
      EXPECT_EQ(row(b.states, grad_row, NV), nvme);
      EXPECT_EQ(row(b.buffers, "grad ring", P), 2 * ((largest * gb + 4095) / 4096 * 4096));
      EXPECT_EQ(row(a.buffers, "grad ring", P), 0u);
      EXPECT_EQ(b.totals[P], a.totals[P] + row(b.buffers, "grad ring", P));
      EXPECT_EQ(b.totals[D], a.totals[D]);
      EXPECT_EQ(b.totals[NV], a.totals[NV] + nvme);
      // Without the speculative Update: the states' NVMe rows keep one slot each, and the ring one slot
      // (freed by its NVMe write before the serial Reduce worker takes the next unit).
      off.plan.speculative = on.plan.speculative = false;
      const Plan c = make_plan(off.plan), d = make_plan(on.plan);
      EXPECT_EQ(d.totals[NV], c.totals[NV] + nvme);
      EXPECT_LT(d.totals[NV], b.totals[NV]);
      EXPECT_EQ(row(d.buffers, "grad ring", P), (largest * gb + 4095) / 4096 * 4096);
      EXPECT_EQ(d.totals[P], c.totals[P] + row(d.buffers, "grad ring", P));
      EXPECT_EQ(d.totals[H], 0u);
    }
}

// The layer-major order (PlanInput::layer_major): the unit the tied head shares (unit 0 here) has GA
// device gradient buffers, the other unit with buffers of its own (unit 4) two, the blocks the two
// shared gradient slots as before; without streaming the host gradient is the fp32 sum, with it the
// ring of fp32 slots. The engine holds exactly those bytes on every tier, and claims every handoff.
TEST(EngineStreaming, LayerMajorPlansTheHeadsBuffersPerMicroBatchAndTheEngineHoldsThem) {
  Dir dir;
  for (OffloadDevice opt : {OffloadDevice::cpu, OffloadDevice::nvme})
    for (bool stream : {false, true})
      for (std::int64_t ga : {2, 4})
        for (int head : {0, -1}) {
          if (stream && opt != OffloadDevice::nvme) continue;
          SCOPED_TRACE(std::string(to_string(opt)) + (stream ? " streaming" : "") + " GA " + std::to_string(ga) +
                       " head " + std::to_string(head));
          EngineConfig c = config(opt, OffloadDevice::nvme, Precision::bf16, ga, Overlap::exact, dir.p.string());
          c.plan.gradient_streaming = stream;
          c.plan.layer_major = true;
          c.plan.head_unit = head;
          EngineConfig micro = c;
          micro.plan.layer_major = false;
          micro.plan.gradient_streaming = false;
          const Plan plan = make_plan(c.plan), usual = make_plan(micro.plan);
          const std::uint64_t heads = head == 0 ? static_cast<std::uint64_t>(ga) : 2;
          EXPECT_EQ(row(plan.states, "grad", D), (heads * 5000 + 2 * 300) * 4);
          EXPECT_EQ(row(usual.states, "grad", D), (5000 + 300) * 4u);
          EXPECT_EQ(row(plan.buffers, "grad window", D), row(usual.buffers, "grad window", D));
          if (stream) {
            EXPECT_EQ(row(plan.states, "grad32", H), 0u);
            EXPECT_EQ(row(plan.buffers, "grad ring", P), (20000 * 4 + 4095) / 4096 * 4096);  // one: no speculation
          } else {
            EXPECT_EQ(row(plan.states, "grad32", H), row(usual.states, "grad32", H));
          }
          auto dev = make_cpu_device(64 << 20);
          Engine e(c, *dev, [&](std::size_t u, float* p) { std::fill(p, p + c.plan.unit_params[u], 0.01f); });
          expect_holds_the_plan(e, plan);
        }
}

// The engine holds exactly the plan's bytes on every tier (its gradient store's files included), and
// its stages claim every handoff of the streaming step graph.
TEST(EngineStreaming, HoldsThePlansBytesAndClaimsEveryHandoff) {
  Dir dir;
  for (auto param : {OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme})
    for (Precision prec : {Precision::fp32, Precision::bf16})
      for (std::int64_t ga : {1, 2})
        for (bool speculative : {false, true}) {
        SCOPED_TRACE("param " + std::string(to_string(param)) + " " + std::string(to_string(prec)) + " GA " +
                     std::to_string(ga) + (speculative ? " speculative" : ""));
        EngineConfig c = streaming(param, prec, ga, dir.p.string());
        c.plan.speculative = speculative;
        const Plan plan = make_plan(c.plan);
        auto dev = make_cpu_device(64 << 20);
        Engine e(c, *dev, [&](std::size_t u, float* p) { std::fill(p, p + c.plan.unit_params[u], 0.01f); });
        expect_holds_the_plan(e, plan);
        const TierBytes held = e.held_bytes();
        EXPECT_EQ(held[H], 0u);
        EXPECT_EQ(e.pinned_capacity(), held[P]);
        EXPECT_EQ(swap_file_bytes(dir.p), held[NV]);
        EXPECT_NE(e.dataflow().find("GradWrite(u)"), -1);
        EXPECT_NE(e.dataflow().find("GradRead(u)"), -1);
        }
}

// The Reduce finishing units out of the speculation's order (4, 2, 1, 3, 0 against 4, 3, 2, 1, 0): both
// ring slots end up holding units the speculation is not waiting for, so it closes the ring and stops
// there instead of waiting forever, and the rest is read back from NVMe. The masters equal the run
// without streaming (and the one without speculation) bit for bit, over three steps.
TEST(EngineStreaming, AReduceOutOfTheSpeculationsOrderClosesTheRingAndStaysExact) {
  Dir dir;
  std::vector<std::vector<std::vector<float>>> results;
  std::int64_t streamed_speculation = 0;
  for (int mode = 0; mode < 3; ++mode) {  // streaming + speculation, speculation alone, neither
    SCOPED_TRACE("mode " + std::to_string(mode));
    EngineConfig c = streaming(OffloadDevice::none, Precision::bf16, 1, dir.p.string());
    c.plan.gradient_streaming = mode == 0;
    c.plan.speculative = mode < 2;
    auto dev = make_cpu_device(64 << 20);
    std::vector<std::vector<float>> out;
    {
      Engine e(c, *dev, [&](std::size_t u, float* p) { init(u, p, c.plan.unit_params[u]); });
      for (int s = 1; s <= 3; ++s) {
        e.expect_step(options(s, 0));
        e.begin_micro_batch(0);
        e.begin_forward();
        std::vector<float> wsum(c.plan.unit_params.size());
        for (std::size_t u = 0; u < c.plan.unit_params.size(); ++u) {
          const float* w = static_cast<const float*>(e.weights(u));
          wsum[u] = w[7] + w[c.plan.unit_params[u] - 1];
          e.done_with(u);
        }
        e.begin_backward();
        for (std::size_t u : {4u, 2u, 1u, 3u, 0u}) {
          float* g = e.grads(u);
          for (std::size_t i = 0; i < static_cast<std::size_t>(c.plan.unit_params[u]); ++i)
            g[i] += 0.01f * std::sin(static_cast<float>(i * (u + 1) + 31 * static_cast<std::size_t>(s))) + 0.1f * wsum[u];
          e.grads_done(u);
        }
        const StepOutcome r = e.step(options(s, 0));
        EXPECT_TRUE(r.finite);
      }
      for (std::size_t u = 0; u < c.plan.unit_params.size(); ++u) {
        out.emplace_back(c.plan.unit_params[u]);
        e.read_master(u, out.back().data());
      }
      if (mode == 0) streamed_speculation = e.speculation_counts().updated;
    }
    results.push_back(std::move(out));
  }
  EXPECT_TRUE(same_bits(results[0], results[1]));
  EXPECT_TRUE(same_bits(results[0], results[2]));
  EXPECT_GT(streamed_speculation, 0) << "the streamed speculation took unit 4 from the ring";
}

// A placement streaming cannot serve: one line, and nothing allocated (the device's memory untouched,
// no swap folder made).
TEST(EngineStreaming, RefusesEachUnsupportedPlacementBeforeAllocating) {
  Dir dir;
  struct Case {
    EngineConfig c;
    std::string why;
  };
  std::vector<Case> cases;
  for (auto opt : {OffloadDevice::none, OffloadDevice::cpu}) {
    EngineConfig c = streaming(OffloadDevice::none, Precision::bf16, 1, dir.p.string());
    c.plan.optimizer = opt;
    cases.push_back({c, "needs offload_optimizer.device nvme"});
  }
  {
    EngineConfig c = streaming(OffloadDevice::none, Precision::bf16, 1, dir.p.string());
    c.plan.overlap = Overlap::none;
    cases.push_back({c, "needs train.overlap \"exact\""});
  }
  {
    EngineConfig c = streaming(OffloadDevice::none, Precision::bf16, 2, dir.p.string());
    c.plan.device_grad_accum = false;
    cases.push_back({c, "needs offload_optimizer.layer_major true (each unit's micro batches one after another) or "
                        "device_grad_accumulation true"});
  }
  for (auto& [c, why] : cases) {
    SCOPED_TRACE(why);
    auto dev = make_cpu_device(64 << 20);
    try {
      Engine e(c, *dev, [&](std::size_t u, float* p) { std::fill(p, p + c.plan.unit_params[u], 0.01f); });
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("offload engine: gradient_streaming "), std::string::npos) << m;
      EXPECT_NE(m.find(why), std::string::npos) << m;
      EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    }
    EXPECT_EQ(dev->peak(), 0u);
    EXPECT_TRUE(fs::is_empty(dir.p));
  }
}

// A streamed gradient's NVMe write fails (the disk full, an I/O error) while the speculation waits for
// that unit: the failed Reduce frees its ring slot and closes the ring, so the later Reduces find a slot
// and step() ends with the write's error instead of waiting forever (five units, two slots: without
// that, the third Reduce waits for a slot nobody frees, and step() waits for it).
TEST(EngineStreaming, AFailedGradientWriteEndsTheStepWithItsError) {
  Dir dir;
  for (bool speculative : {true, false}) {
    SCOPED_TRACE(speculative ? "speculative" : "no speculation");
    nvme::FaultPlan faults;
    faults.fail_errno = ENOSPC;
    EngineConfig c = streaming(OffloadDevice::none, Precision::bf16, 1, dir.p.string());
    c.plan.speculative = speculative;
    c.gradient_faults = &faults;
    auto dev = make_cpu_device(64 << 20);
    bool failed = false;
    {
      Engine e(c, *dev, [&](std::size_t u, float* p) { init(u, p, c.plan.unit_params[u]); });
      faults.fail_at = faults.seen.load() + 1;  // the first gradient written: the last unit's
      try {
        e.expect_step(options(1, 0));
        constant_gradient_pass(e, c, 1e-3f);
        e.step(options(1, 0));
        e.synchronize();
      } catch (const IoError& err) {
        failed = true;
        EXPECT_EQ(err.error_number(), ENOSPC) << err.what();
      }
    }
    EXPECT_TRUE(failed);
    EXPECT_EQ(dev->in_use(), 0u);
  }
}

}  // namespace
}  // namespace zinf::offload::test
