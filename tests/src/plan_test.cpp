// plan_test.cpp — `zinf plan` joined to a machine: activation estimates, capacities, largest fits.
#include <gtest/gtest.h>

#include "zinf/config.h"
#include "plan/plan.h"

namespace zinf {
namespace {

MachineInfo fake_machine(std::uint64_t host, std::uint64_t gpu_free) {
  MachineInfo m;
  m.mem_total = m.mem_available = host;
  m.memlock_soft = m.memlock_hard = ~0ull;
  if (gpu_free) {
    GpuInfo g;
    g.free_bytes = g.total_bytes = gpu_free;
    m.gpus.push_back(g);
  }
  return m;
}

TEST(Plan, ActivationCheckpointingShrinksActivations) {
  ModelShape s = find_model_preset("gpt2-124m").shape;
  auto plain = estimate_activation_bytes(s, 8, 2, false);
  auto ckpt = estimate_activation_bytes(s, 8, 2, true);
  EXPECT_LT(ckpt, plain);
  // Korthikanti et al.: 34·T·B·C + 5·H·T²·B per block in 2-byte units.
  const double per_block = 1024.0 * 8 * 768 * (34 + 5.0 * 12 * 1024 / 768);
  const double logits = 8.0 * 1024 * 50257 * (2 + 4), embed = 8.0 * 1024 * 768 * 2;
  EXPECT_EQ(plain, static_cast<std::uint64_t>(12 * per_block + logits + embed));
  EXPECT_EQ(estimate_activation_bytes(s, 8, 4, false) > plain, true);
}

TEST(Plan, CpuDeviceBudgetComesOutOfHostMemory) {
  Config c = parse_config(R"({"train_batch_size": 4, "device": {"type": "cpu", "memory_budget": "1GiB"}})");
  auto cap = machine_capacity(c, fake_machine(8ull << 30, 0));
  EXPECT_EQ(cap.device, 1ull << 30);
  EXPECT_EQ(cap.host, 7ull << 30);
  auto gpu = machine_capacity(parse_config(R"({"train_batch_size": 4})"), fake_machine(8ull << 30, 80ull << 30));
  EXPECT_EQ(gpu.device, 80ull << 30);
  EXPECT_EQ(gpu.host, 8ull << 30);
}

TEST(Plan, OffloadLetsLargerModelsFitAndTheVerdictIsConsistent) {
  Config c = parse_config(R"({"train_batch_size": 1, "model": {"preset": "gpt2-350m"},
                              "zero_optimization": {"stage": 3}, "bf16": {"enabled": true},
                              "device": {"type": "cuda", "memory_budget": "4GiB"}})");
  RunPlan r = plan_run(c, fake_machine(64ull << 30, 4ull << 30));
  ASSERT_EQ(r.largest.size(), 5u);
  // No offload fits fewer layers than optimizer offload, which fits fewer than optimizer + params.
  EXPECT_LT(r.largest[0].n_layer, r.largest[1].n_layer);
  EXPECT_LE(r.largest[1].n_layer, r.largest[2].n_layer);
  // The verdict agrees with the search: this model fits iff its n_layer is within the no-offload bound.
  EXPECT_EQ(r.verdict.fits, c.model.n_layer <= r.largest[0].n_layer);
  for (const auto& f : r.largest) EXPECT_EQ(f.params, f.n_layer ? f.params : 0);
}

// Per placement, the largest real model (a llama-family preset) that fits: offloading more never
// shrinks it, and on an 80 GB GPU with 256 GB of host memory, optimizer and parameters in host memory
// fit an 8B model's fine-tune but not a 70B one's.
TEST(Plan, TheLargestRealModelThatFitsGrowsWithOffload) {
  Config c = parse_config(R"({"train_batch_size": 1, "model": {"preset": "llama-3.2-1b", "seq_len": 1024,
                              "activation_checkpointing": true}, "zero_optimization": {"stage": 3}, "bf16": {"enabled": true},
                              "device": {"type": "cuda", "memory_budget": "80GiB"}})");
  RunPlan r = plan_run(c, fake_machine(256ull << 30, 80ull << 30));
  std::vector<std::int64_t> params;
  for (const auto& f : r.largest)
    params.push_back(f.largest_preset.empty() ? 0 : count_params(find_model_preset(f.largest_preset).shape));
  EXPECT_LE(params[0], params[1]);
  EXPECT_LE(params[1], params[2]);
  EXPECT_GE(params[2], count_params(find_model_preset("llama-3.1-8b").shape));
  EXPECT_LT(params[2], count_params(find_model_preset("llama-3.1-70b").shape));
}

}  // namespace
}  // namespace zinf
