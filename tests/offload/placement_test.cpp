// placement_test.cpp — the byte model behind `zinf plan`, and agreement with DeepSpeed's published
// ZeRO-3 estimator (estimate_zero3_model_states_mem_needs).
#include <gtest/gtest.h>

#include <cmath>

#include "zinf/error.h"
#include "zinf/offload/placement.h"

namespace zinf::offload {
namespace {

constexpr int D = 0, P = 1, H = 2, NV = 3;

PlanInput input(OffloadDevice opt, OffloadDevice param, std::int64_t ga, int cb = 2) {
  PlanInput in;
  in.unit_params = {4000, 1000, 1000, 1000, 10};  // N = 7010, L = 4000
  in.compute_bytes = cb;
  in.optimizer = opt;
  in.param = param;
  in.grad_accum = ga;
  in.sub_group_size = 2000;
  in.reduce_bucket_size = 500;
  in.prefetch_bucket_size = 4000;
  in.param_buffer_size = 5000;
  return in;
}

std::uint64_t state(const Plan& p, const std::string& name, int tier) {
  for (const auto& r : p.states)
    if (r.name == name) return r.bytes[tier];
  ADD_FAILURE() << "no state " << name;
  return 0;
}
std::uint64_t buffer(const Plan& p, const std::string& name, int tier) {
  for (const auto& r : p.buffers)
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
  // DeepSpeed's stage-3 formulas assume fp32 gradients on the host. zinf keeps exactly that (grad32)
  // when gradients are accumulated (GA > 1), so host model states must match bit for bit (÷ 1.5).
  for (auto param : {OffloadDevice::cpu, OffloadDevice::none}) {
    SCOPED_TRACE(param == OffloadDevice::cpu ? "offload_param=cpu" : "offload_param=none");
    Plan p = make_plan(input(OffloadDevice::cpu, param, 4));
    auto ds = deepspeed_zero3_estimate(p.n_params, p.largest_unit, true, param == OffloadDevice::cpu, true, 1.0);
    EXPECT_EQ(p.model_states[P] + p.model_states[H], ds.cpu);
    if (param == OffloadDevice::none) {  // device: all param16 + the 16-bit grad window of the largest unit (4·L)
      EXPECT_EQ(p.model_states[D] + buffer(p, "grad window", D), ds.gpu);
    }
  }
}

TEST(Placement, NoOffloadKeepsEverythingOnTheDevice) {
  Plan p = make_plan(input(OffloadDevice::none, OffloadDevice::none, 1));
  const std::uint64_t N = 7010;
  EXPECT_EQ(p.n_params, 7010);
  EXPECT_EQ(p.largest_unit, 4000);
  EXPECT_EQ(p.model_states[D], (2 + 2 + 4 + 4 + 4) * N);
  EXPECT_EQ(p.model_states[P] + p.model_states[H] + p.model_states[NV], 0u);
  EXPECT_EQ(p.pinned_pool, 0u);
}

TEST(Placement, Fp32OnTheDeviceAliasesTheMaster) {
  Plan p = make_plan(input(OffloadDevice::none, OffloadDevice::none, 1, 4));
  EXPECT_EQ(state(p, "master", D), 0u);
  EXPECT_EQ(p.model_states[D], (4 + 4 + 4 + 4) * 7010u);
  p = make_plan(input(OffloadDevice::cpu, OffloadDevice::none, 1, 4));
  EXPECT_EQ(state(p, "master", H), 4 * 7010u);
}

TEST(Placement, CpuOffloadMovesOptimizerAndLandsGradients) {
  Plan p = make_plan(input(OffloadDevice::cpu, OffloadDevice::none, 1));
  EXPECT_EQ(state(p, "param16", D), 2 * 7010u);
  EXPECT_EQ(state(p, "grad16", H), 2 * 7010u);  // held until the norm barrier
  EXPECT_EQ(state(p, "master", H) + state(p, "adam.m", H) + state(p, "adam.v", H), 12 * 7010u);
  EXPECT_EQ(buffer(p, "grad landing", P), 2 * 500 * 2u);
  EXPECT_EQ(buffer(p, "param upload", P), 2 * 2000 * 2u);
  EXPECT_EQ(p.pinned_pool, 2 * 500 * 2u + 2 * 2000 * 2u);
}

TEST(Placement, NvmeOffloadBoundsPinnedSwapBuffers) {
  Plan p = make_plan(input(OffloadDevice::nvme, OffloadDevice::nvme, 2));
  EXPECT_EQ(state(p, "master", NV) + state(p, "adam.m", NV) + state(p, "adam.v", NV), 12 * 7010u);
  EXPECT_EQ(state(p, "param16", NV), 2 * 7010u);
  EXPECT_EQ(state(p, "grad32", H), 4 * 7010u);
  EXPECT_EQ(buffer(p, "optimizer swap", P), 4 * 2000 * 4u);  // buffer_count x sub_group x 4 B
  EXPECT_EQ(buffer(p, "param swap", P), 5 * 4000 * 2u);
  EXPECT_EQ(p.prefetch_depth, 1);
  EXPECT_EQ(buffer(p, "param window", D), 2 * 4000 * 2u);
  std::uint64_t pinned = 0;
  for (const auto& r : p.buffers) pinned += r.bytes[P];
  EXPECT_EQ(p.pinned_pool, pinned);
  EXPECT_EQ(p.totals[P], p.pinned_pool + p.model_states[P]);
}

TEST(Placement, ParamBufferSmallerThanALayerIsRefused) {
  PlanInput in = input(OffloadDevice::nvme, OffloadDevice::nvme, 1);
  in.param_buffer_size = 3999;
  EXPECT_THROW(make_plan(in), ConfigError);
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
