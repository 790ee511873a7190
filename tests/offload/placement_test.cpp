// placement_test.cpp — the byte model behind `zinf plan` (which the engine allocates by), and its
// agreement with DeepSpeed's published ZeRO-3 estimator (estimate_zero3_model_states_mem_needs).
#include <gtest/gtest.h>

#include <cmath>

#include "zinf/device_memory.h"
#include "zinf/error.h"
#include "zinf/offload/buffer_specs.h"
#include "zinf/offload/placement.h"

namespace zinf::offload {
namespace {

constexpr int D = 0, P = 1, H = 2, NV = 3;

// Units are multiples of 2048 elements so 16-bit copies need no 4 KiB padding: N = 22528, largest 8192.
PlanInput input(OffloadDevice opt, OffloadDevice param, std::int64_t ga, int cb = 2) {
  return PlanInput{.unit_params = {4096, 8192, 8192, 2048},
                   .persistent = {true, false, false, true},
                   .precision = cb == 4 ? Precision::fp32 : Precision::fp16,
                   .optimizer = opt,
                   .param = param,
                   .grad_accum = ga,
                   .sub_group_size = 4096,
                   .reduce_bucket_size = 4096,
                   .optimizer_buffer_count = 3,
                   .prefetch_depth = 1,
                   .fp32_work = false};  // a 16-bit device, for the DeepSpeed comparison
}
constexpr std::uint64_t N = 22528;

std::uint64_t row(const std::vector<Row>& rows, const std::string& name, int tier) {
  for (const auto& r : rows)
    if (r.name == name) return r.bytes[tier];
  return 0;
}

double gib(std::uint64_t b) { return std::round(static_cast<double>(b) / (1ull << 30) * 100.0) / 100.0; }

TEST(DeepSpeedEstimator, ReproducesThePublishedT5SmallTable) {
  // DeepSpeed's estimate_zero3_model_states_mem_needs_all_live(t5-small, 1 GPU, 1 node) prints, in GiB
  // with two decimals: 1.52|0.06, 1.35|0.17, 0.09|1.08 (zero_init=1), 0.34|1.08 (zero_init=0).
  const std::int64_t total = 60'506'624, largest = 16'449'536;
  auto e = deepspeed_zero3_estimate(total, largest, true, true, true);
  EXPECT_DOUBLE_EQ(gib(e.cpu), 1.52);
  EXPECT_DOUBLE_EQ(gib(e.gpu), 0.06);
  e = deepspeed_zero3_estimate(total, largest, true, false, true);
  EXPECT_DOUBLE_EQ(gib(e.cpu), 1.35);
  EXPECT_DOUBLE_EQ(gib(e.gpu), 0.17);
  e = deepspeed_zero3_estimate(total, largest, false, false, true);
  EXPECT_DOUBLE_EQ(gib(e.cpu), 0.09);
  EXPECT_DOUBLE_EQ(gib(e.gpu), 1.08);
  e = deepspeed_zero3_estimate(total, largest, false, false, false);
  EXPECT_DOUBLE_EQ(gib(e.cpu), 0.34);
}

TEST(DeepSpeedEstimator, Stage3HostTotalsAgreeWithZinfsPlan) {
  // DeepSpeed's stage-3 formulas assume fp32 gradients on the host; zinf keeps exactly that (grad32)
  // when gradients are accumulated (GA > 1), so the host-side model states match (÷ 1.5): 18 B/param
  // with params offloaded (2 pinned + 16 host), 16 B/param without.
  Plan both = make_plan(input(OffloadDevice::cpu, OffloadDevice::cpu, 4));
  auto ds = deepspeed_zero3_estimate(static_cast<std::int64_t>(N), 8192, true, true, true, 1.0);
  EXPECT_EQ(row(both.states, "param16", P) + both.model_states[H],
            ds.cpu - 2 * (4096 + 2048));  // persistent units stay on the device
  Plan opt = make_plan(input(OffloadDevice::cpu, OffloadDevice::none, 4));
  ds = deepspeed_zero3_estimate(static_cast<std::int64_t>(N), 8192, true, false, true, 1.0);
  EXPECT_EQ(opt.model_states[H], ds.cpu);
}

TEST(Placement, NoOffloadKeepsEverythingOnTheDevice) {
  Plan p = make_plan(input(OffloadDevice::none, OffloadDevice::none, 1));
  EXPECT_EQ(p.n_params, static_cast<std::int64_t>(N));
  EXPECT_EQ(p.largest_unit, 8192);
  // param16 2 + grad 4 + grad16 2 + master 4 + m 4 + v 4
  EXPECT_EQ(p.model_states[D], 20 * N);
  EXPECT_EQ(p.model_states[P] + p.model_states[H] + p.model_states[NV], 0u);
  EXPECT_EQ(p.pinned_pool, 0u);
  PlanInput work = input(OffloadDevice::none, OffloadDevice::none, 1);
  work.fp32_work = true;  // the CPU device adds its fp32 working weights
  EXPECT_EQ(make_plan(work).model_states[D], 24 * N);
}

TEST(Placement, Fp32OnTheDeviceAliasesTheMaster) {
  Plan p = make_plan(input(OffloadDevice::none, OffloadDevice::none, 1, 4));
  EXPECT_EQ(row(p.states, "master", D), 0u);
  EXPECT_EQ(p.model_states[D], (4 + 4 + 4 + 4) * N);
}

TEST(Placement, CpuOffloadStreamsGradientsThroughWindows) {
  Plan p = make_plan(input(OffloadDevice::cpu, OffloadDevice::none, 1));
  EXPECT_EQ(row(p.states, "param16", D), 2 * N);
  EXPECT_EQ(row(p.states, "grad16", H), 2 * N);             // held until the norm barrier
  EXPECT_EQ(row(p.states, "grad", D), 4 * (4096 + 2048u));  // persistent units only
  EXPECT_EQ(row(p.buffers, "grad window", D), 2 * 8192 * 4u);
  EXPECT_EQ(row(p.states, "master", H) + row(p.states, "adam.m", H) + row(p.states, "adam.v", H), 12 * N);
  EXPECT_EQ(row(p.buffers, "grad landing", P), 2 * 4096 * 2u);
  EXPECT_EQ(row(p.buffers, "param upload", P), 2 * 4096 * 2u);
  EXPECT_EQ(p.pinned_pool, p.totals[P]);
}

TEST(Placement, NvmeOffloadBoundsPinnedSwapBuffers) {
  Plan p = make_plan(input(OffloadDevice::nvme, OffloadDevice::nvme, 2));
  EXPECT_EQ(p.model_states[NV], 12 * N + 2 * (8192 + 8192u));  // master|m|v of every unit + windowed param16
  EXPECT_EQ(row(p.states, "grad32", H), 4 * N);
  EXPECT_EQ(row(p.buffers, "optimizer swap", P), 3 * 12 * 4096u);
  EXPECT_EQ(p.window_slots, 2);
  EXPECT_EQ(row(p.buffers, "param window", D), 2 * 8192 * 2u);
  EXPECT_EQ(row(p.buffers, "param staging", P), 2 * 8192 * 2u);
  EXPECT_EQ(row(p.states, "param16", D), 2 * (4096 + 2048u));  // the persistent units
}

// The speculative Update: NVMe keeps two slots per sub-group (the state rows double there); host
// memory keeps a backup of whole sub-groups (N = 22528 elements in 6 sub-groups of 4096: half is 3,
// or as many as speculative_backup covers); nothing of it without the optimizer offloaded.
TEST(Placement, SpeculationDoublesNvmeStatesAndBoundsTheHostBackup) {
  PlanInput in = input(OffloadDevice::nvme, OffloadDevice::nvme, 2);
  in.speculative = true;
  Plan p = make_plan(in);
  EXPECT_EQ(row(p.states, "master", NV), 2 * 4 * N);
  EXPECT_EQ(row(p.states, "adam.v", NV), 2 * 4 * N);
  EXPECT_EQ(row(p.buffers, "speculation backup", H), 0u);
  in = input(OffloadDevice::cpu, OffloadDevice::none, 2);
  in.speculative = true;
  p = make_plan(in);
  EXPECT_EQ(row(p.states, "master", H), 4 * N);
  EXPECT_EQ(row(p.buffers, "speculation backup", H), 3 * 12 * 4096u);
  in.speculative_backup = 4097;  // rounded up to whole sub-groups
  EXPECT_EQ(row(make_plan(in).buffers, "speculation backup", H), 2 * 12 * 4096u);
  in.speculative_backup = 1 << 30;  // at most every sub-group
  EXPECT_EQ(row(make_plan(in).buffers, "speculation backup", H), 6 * 12 * 4096u);
  in = input(OffloadDevice::none, OffloadDevice::none, 2);
  in.speculative = true;
  EXPECT_EQ(make_plan(in).totals, make_plan(input(OffloadDevice::none, OffloadDevice::none, 2)).totals);
}

// zero_optimization.optimizer_states shrinks m and v on whichever tier holds them, by its element size
// (q8 adds one fp32 scale per 256 elements), and the plan's state rows say so; the master stays fp32.
// Sub-groups of 2^18 elements (each NVMe part padded to 4 KiB: the q8 scales take one 4 KiB page each).
TEST(Placement, CompressedOptimizerStatesShrinkTheStateRowsOnEveryTier) {
  using cpu_adam::StateFormat;
  constexpr std::uint64_t M = 1 << 20, SG = 1 << 18, n = 4 * M;
  for (auto [opt, t] : {std::pair{OffloadDevice::none, D}, std::pair{OffloadDevice::cpu, H},
                        std::pair{OffloadDevice::nvme, NV}}) {
    SCOPED_TRACE(to_string(opt));
    std::uint64_t states[3] = {}, swap[3] = {};
    for (auto f : {StateFormat::fp32, StateFormat::bf16, StateFormat::q8}) {
      PlanInput in = input(opt, OffloadDevice::none, 2);
      in.unit_params = {M, M, M, M};
      in.persistent = {true, false, false, true};
      in.sub_group_size = SG;
      in.optimizer_states = f;
      const Plan p = make_plan(in);
      const int k = static_cast<int>(f);
      states[k] = row(p.states, "master", t) + row(p.states, "adam.m", t) + row(p.states, "adam.v", t);
      swap[k] = row(p.buffers, "optimizer swap", P);
      EXPECT_EQ(row(p.states, "master", t), 4 * n);
      for (const auto& r : p.states) {
        if (r.name == "adam.m" || r.name == "adam.v") {
          EXPECT_EQ(r.dtype, cpu_adam::state_format_name(f));
        }
      }
      // The engine allocates what the plan sums.
      const BufferSpecs specs(in);
      TierBytes sum{};
      for (const auto& b : specs.all()) sum[static_cast<int>(b.tier)] += footprint(b.tier, b.bytes) * b.count;
      EXPECT_EQ(sum, p.totals);
    }
    const double fp32 = static_cast<double>(states[0]);
    EXPECT_EQ(states[0], 12 * n);
    EXPECT_EQ(states[1], 8 * n);  // bf16: 2 bytes each
    EXPECT_LE(states[1], 0.70 * fp32);
    EXPECT_LE(states[2], 0.55 * fp32);
    if (opt == OffloadDevice::nvme) {
      // A sub-group: master | m | v | m scales | v scales, each 4 KiB-padded (1024 scales: 4 KiB).
      EXPECT_EQ(states[2], n / SG * (4 * SG + 2 * SG + 2 * 4096));
      EXPECT_EQ(swap[0], 3 * 12 * SG);
      EXPECT_LE(swap[2], 0.55 * static_cast<double>(swap[0]));
      EXPECT_LE(swap[1], 0.70 * static_cast<double>(swap[0]));
    } else {
      EXPECT_EQ(states[2], 4 * n + 2 * (n + 4 * n / 256));  // q8: a byte each and their scales
    }
  }
}

// The list the engine allocates from is the plan: every spec, as its tier takes it, summed per tier,
// gives the plan's totals; each unit's specs are found under its number.
TEST(BufferSpecs, SumToThePlanAndAreFoundPerUnit) {
  for (auto opt : {OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme})
    for (auto param : {OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme})
      for (int world : {1, 3}) {
        PlanInput in = input(opt, param, 2);
        in.world = world, in.rank = world - 1, in.stage = 3;
        in.activation_bytes = 1000;
        const BufferSpecs specs(in);
        TierBytes sum{};
        for (const auto& b : specs.all()) sum[static_cast<int>(b.tier)] += footprint(b.tier, b.bytes) * b.count;
        const Plan p = make_plan(in);
        EXPECT_EQ(sum, p.totals);
        EXPECT_EQ(make_plan(specs).totals, p.totals);
        for (std::size_t u = 0; u < in.unit_params.size(); ++u) {
          const BufferSpec* param16 = specs.find(Buffer::param, u);
          ASSERT_NE(param16, nullptr);
          EXPECT_EQ(param16->unit, u);
          for (const auto& b : specs.of_unit(u)) EXPECT_EQ(b.unit, u);
        }
        EXPECT_EQ(specs.find(Buffer::activations)->bytes, 1000u);
        EXPECT_EQ(specs.find(Buffer::param, kShared), nullptr);
      }
}

// On a device whose allocator takes whole blocks (CUDA), every device buffer counts as its block and
// each ops scratch block as its own; pinned, host and NVMe bytes are those of the exact plan.
TEST(BufferSpecs, DeviceBlocksCountEachDeviceBufferAsItsBlock) {
  for (auto opt : {OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme})
    for (auto param : {OffloadDevice::none, OffloadDevice::cpu}) {
      PlanInput in = input(opt, param, 2);
      in.activation_bytes = 3'000'000;
      const Plan exact = make_plan(in);
      in.device_blocks = true;
      in.ops_scratch = {8u << 20, 1000, (3u << 20) + 1};
      const BufferSpecs specs(in);
      std::uint64_t device = 0, scratch_specs = 0;
      for (const auto& b : specs.all()) {
        if (b.tier == Tier::device) device += cuda_block_bytes(b.bytes) * b.count;
        if (b.what == Buffer::ops_scratch) ++scratch_specs;
      }
      const Plan p = make_plan(in);
      EXPECT_EQ(scratch_specs, 3u);
      EXPECT_EQ(p.totals[D], device);
      EXPECT_EQ(make_plan(specs).totals, p.totals);
      // Units of 2048..8192 elements: every device buffer is under 1 MiB and rounds to 512 bytes, which
      // these sizes already are; the activations (3 MB -> 4 MiB) and the scratch add their blocks.
      EXPECT_EQ(row(p.buffers, "ops scratch", D), (8u << 20) + 1024 + (4u << 20));
      EXPECT_EQ(row(p.buffers, "activations", D), 4u << 20);
      EXPECT_EQ(p.totals[D], exact.totals[D] - 3'000'000 + (4u << 20) + (8u << 20) + 1024 + (4u << 20));
      for (int t : {P, H, NV}) EXPECT_EQ(p.totals[t], exact.totals[t]);
    }
  // A device buffer of an odd size rounds up: 1000 fp32 elements per unit.
  PlanInput odd = input(OffloadDevice::none, OffloadDevice::none, 1, 4);
  odd.unit_params = {1000, 300000};
  odd.persistent = {true, true};
  const Plan exact = make_plan(odd);
  odd.device_blocks = true;
  const Plan blocks = make_plan(odd);
  EXPECT_EQ(row(blocks.states, "param16", D), 4096u + (2u << 20));  // 4000 B -> 4096; 1.2 MB -> 2 MiB
  EXPECT_EQ(row(exact.states, "param16", D), 4000u + 1'200'000u);
  EXPECT_EQ(row(exact.buffers, "ops scratch", D), 0u);  // listed only when the caller estimates some
}

TEST(Verdict, NamesTheFirstResourceToRunOut) {
  Plan p = make_plan(input(OffloadDevice::cpu, OffloadDevice::none, 1));
  Capacity cap{.device = 1 << 20, .host = 1 << 30, .pinnable = 1 << 30, .nvme = 0, .nvme_known = false};
  Verdict v = judge(p, cap);
  EXPECT_TRUE(v.fits);
  EXPECT_EQ(v.limiting, "device");
  cap.device = 100;
  v = judge(p, cap);
  EXPECT_FALSE(v.fits);
  EXPECT_EQ(v.limiting, "device");
  ASSERT_EQ(v.problems.size(), 1u);
  cap.device = 1 << 30;
  cap.pinnable = 10;
  v = judge(p, cap);
  EXPECT_FALSE(v.fits);
  EXPECT_EQ(v.limiting, "pinned");
}

}  // namespace
}  // namespace zinf::offload
