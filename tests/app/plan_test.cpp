// plan_test.cpp — `zinf plan` joined to a machine: activation estimates, capacities, largest fits.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "app/config/config.h"
#include "app/plan/plan.h"
#include "common/temp_dir.h"
#include "zinf/backends/backend.h"
#include "zinf/device_memory.h"
#include "zinf/error.h"
#include "zinf/offload/buffer_specs.h"

namespace zinf {
namespace {

MachineInfo fake_machine(std::uint64_t host, std::uint64_t gpu_free) {
  MachineInfo m;
  m.mem_total = m.mem_available = host;
  m.memlock_soft = m.memlock_hard = ~0ull;
  if (gpu_free) {  // GPU 0, this process's: its free memory read
    GpuInfo g;
    g.free_bytes = g.total_bytes = gpu_free;
    g.free_known = true;
    m.gpus.push_back(g);
    m.own_gpu = 0;
  }
  return m;
}

TEST(Plan, ActivationCheckpointingShrinksActivations) {
  ModelShape s = find_model_preset("gpt2-124m").shape;
  auto plain = estimate_activation_bytes(s, 8, 2, false);
  auto ckpt = estimate_activation_bytes(s, 8, 2, true);
  EXPECT_LT(ckpt, plain);
  // Korthikanti et al.: 34·T·B·C + 5·H·T²·B per block in 2-byte units; the reference kernels store
  // every activation in fp32 (twice that), whatever the run's precision.
  const double per_block = 1024.0 * 8 * 768 * (34 + 5.0 * 12 * 1024 / 768) * 2;
  const double logits = 8.0 * 1024 * 50257 * (4 + 4), embed = 8.0 * 1024 * 768 * 4;
  EXPECT_EQ(plain, static_cast<std::uint64_t>(12 * per_block + logits + embed));
  EXPECT_EQ(estimate_activation_bytes(s, 8, 4, false), plain);
  // The fast kernels store them in the run's precision: less in a 16-bit run than the reference's.
  EXPECT_LT(estimate_activation_bytes(s, 8, 2, false, Kernels::fast), plain);
}

TEST(Plan, CpuDeviceBudgetComesOutOfHostMemory) {
  Config c = parse_config(R"({"train_batch_size": 4, "device": {"type": "cpu", "memory_budget": "1GiB"}})");
  auto cap = machine_capacity(c, fake_machine(8ull << 30, 0));
  EXPECT_EQ(cap.device, 1ull << 30);
  EXPECT_EQ(cap.host, 7ull << 30);
  // A GPU's automatic budget: its free memory less the reserve for cuBLAS, NCCL and module images
  // (3% of 80 GiB: more than the 1 GiB floor).
  const Config cuda = parse_config(R"({"train_batch_size": 4, "device": {"type": "cuda"}})");
  auto gpu = machine_capacity(cuda, fake_machine(8ull << 30, 80ull << 30));
  EXPECT_EQ(gpu.device, (80ull << 30) - (80ull << 30) / 100 * 3);
  EXPECT_EQ(gpu.host, 8ull << 30);
  // device.type auto is the CPU device, GPU or not (app/config/device_choice.h): half the host's memory.
  auto automatic = machine_capacity(parse_config(R"({"train_batch_size": 4})"), fake_machine(8ull << 30, 80ull << 30));
  EXPECT_EQ(automatic.device, 4ull << 30);
  EXPECT_EQ(automatic.host, 4ull << 30);
  // The CUDA device where this process has no GPU, or its free memory could not be read: nothing.
  EXPECT_EQ(machine_capacity(cuda, fake_machine(8ull << 30, 0)).device, 0u);
  MachineInfo unread = fake_machine(8ull << 30, 80ull << 30);
  unread.gpus[0].free_known = false;
  unread.gpus[0].free_bytes = 0;
  EXPECT_EQ(machine_capacity(cuda, unread).device, 0u);
  EXPECT_FALSE(plan_run(cuda, unread).notes.empty());
}

TEST(Plan, OffloadLetsLargerModelsFitAndTheVerdictIsConsistent) {
  Config c = parse_config(R"({"train_batch_size": 1, "model": {"preset": "gpt2-350m"},
                              "zero_optimization": {"stage": 3}, "bf16": {"enabled": true},
                              "device": {"type": "cuda", "memory_budget": "4GiB"}})");
  RunPlan r = plan_run(c, fake_machine(64ull << 30, 4ull << 30));
  ASSERT_EQ(r.largest.size(), 6u);
  // No offload fits fewer layers than optimizer offload, which fits fewer than optimizer + params.
  EXPECT_LT(r.largest[0].n_layer, r.largest[1].n_layer);
  EXPECT_LE(r.largest[1].n_layer, r.largest[2].n_layer);
  // The verdict agrees with the search: this model fits iff its n_layer is within the no-offload bound.
  EXPECT_EQ(r.verdict.fits, c.model.n_layer <= r.largest[0].n_layer);
  for (const auto& f : r.largest) EXPECT_EQ(f.params, f.n_layer ? f.params : 0);
}

// The streaming row: everything on NVMe with no model-sized gradient on the host. Where host memory
// is what runs out first it fits a deeper model of the same width than the same placement without
// streaming; its plan under that setting has no host gradient, and a config that streams already has
// the other rows counted without streaming (a cpu optimizer cannot stream).
TEST(Plan, TheStreamingRowFitsMoreWhereHostMemoryIsTheLimit) {
  for (const char* ga : {"1", "4"}) {
    SCOPED_TRACE(std::string("GA ") + ga);
    const std::string json = std::string(R"({"train_batch_size": )") + ga + R"(, "gradient_accumulation_steps": )" + ga +
                             R"(, "model": {"preset": "gpt2-350m", "activation_checkpointing": true},
                              "zero_optimization": {"stage": 3, "sub_group_size": 20000000,
                                "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"},
                                "offload_param": {"device": "nvme", "nvme_path": "/tmp"}},
                              "bf16": {"enabled": true}, "device": {"type": "cuda", "memory_budget": "8GiB"}})";
    // 3 GiB of host memory, 8 GiB of device memory, 1 TiB of NVMe.
    offload::Capacity cap;
    cap.device = 8ull << 30;
    cap.host = cap.pinnable = 3ull << 30;
    cap.nvme = 1ull << 40;
    cap.nvme_known = true;
    for (const bool streams : {false, true}) {
      Config c = parse_config(json, {std::string("zero_optimization.offload_optimizer.gradient_streaming=") +
                                         (streams ? "true" : "false"),
                                     std::string("zero_optimization.offload_optimizer.layer_major=") +
                                         (streams ? "true" : "false")});
      const std::vector<LargestFit> largest = largest_fits(c, model_shape(c.model), cap);
      ASSERT_EQ(largest.size(), 6u);
      const LargestFit &plain = largest[4], &streaming = largest[5];
      EXPECT_FALSE(plain.streaming);
      EXPECT_TRUE(streaming.streaming);
      EXPECT_EQ(streaming.setting, "optimizer=nvme param=nvme streaming");
      EXPECT_GT(plain.n_layer, 0);
      EXPECT_GT(streaming.n_layer, plain.n_layer);
      EXPECT_GT(largest[1].n_layer, 0) << "optimizer=cpu is counted without streaming";
    }
  }
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

// The automatic budget's reserve: max(1 GiB, 3% of the GPU's memory), nothing when the reserve is not free.
TEST(Plan, AutoBudgetKeepsAReserveOnTheGpu) {
  EXPECT_EQ(cuda_budget_reserve(8ull << 30), 1ull << 30);
  EXPECT_EQ(cuda_budget_reserve(141ull << 30), (141ull << 30) / 100 * 3);
  EXPECT_EQ(cuda_auto_budget(6ull << 30, 8ull << 30), 5ull << 30);
  EXPECT_EQ(cuda_auto_budget(1ull << 29, 8ull << 30), 0u);
  const Config set = parse_config(R"({"train_batch_size": 4, "device": {"type": "cuda", "memory_budget": "10GiB"}})");
  EXPECT_EQ(machine_capacity(set, fake_machine(8ull << 30, 80ull << 30)).device, 10ull << 30);  // as given
}

// On the CUDA device the plan counts what the caching allocator takes: every device buffer as its
// block, plus the blocks the reference ops allocate for themselves (cuBLASLt's workspace and GPT's
// attention backward scratch, B·H·T·T floats). The same config on the CPU device plans exact bytes
// and no ops scratch; pinned and host bytes are the same on both.
TEST(Plan, TheCudaDevicePlansAllocatorBlocksAndOpsScratch) {
  const std::string body = R"("train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
      "model": {"n_layer": 2, "n_head": 4, "d_model": 96, "vocab_size": 1000, "seq_len": 64},
      "bf16": {"enabled": true}, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}})";
  const Config cuda = parse_config(R"({"device": {"type": "cuda", "memory_budget": "1GiB"}, )" + body + "}");
  const Config cpu = parse_config(R"({"device": {"type": "cpu", "memory_budget": "1GiB"}, )" + body + "}");
  const MachineInfo m = fake_machine(8ull << 30, 0);
  const RunPlan g = plan_run(cuda, m), c = plan_run(cpu, m);
  auto row = [](const offload::Plan& p, const std::string& name) {
    for (const auto& r : p.buffers)
      if (r.name == name) return r.bytes[0];
    for (const auto& r : p.states)
      if (r.name == name) return r.bytes[0];
    return std::uint64_t{0};
  };
  EXPECT_EQ(row(c.plan, "ops scratch"), 0u);
  const std::uint64_t att = 2ull * 4 * 64 * 64 * 4;  // B·H·T·T floats
  EXPECT_EQ(estimate_ops_scratch(cuda, g.shape), (std::vector<std::uint64_t>{kGemmWorkspaceBytesReference, att}));
  EXPECT_EQ(row(g.plan, "ops scratch"), cuda_block_bytes(kGemmWorkspaceBytesReference) + cuda_block_bytes(att));
  // Every device row is the CPU plan's, each buffer rounded to its block: the same rows, none smaller.
  std::uint64_t rounded_states = 0;
  const offload::PlanInput in = make_plan_input(cuda, g.shape);
  EXPECT_TRUE(in.device_blocks);
  EXPECT_FALSE(make_plan_input(cpu, c.shape).device_blocks);
  const offload::BufferSpecs specs(in);
  for (const auto& b : specs.all())
    if (b.tier == offload::Tier::device && offload::is_state_row(b.row))
      rounded_states += cuda_block_bytes(b.bytes) * b.count;
  EXPECT_EQ(g.plan.model_states[0], rounded_states);
  EXPECT_GT(g.plan.model_states[0], c.plan.model_states[0]);  // the blocks are larger than the exact bytes
  EXPECT_GT(g.plan.totals[0], c.plan.totals[0] + kGemmWorkspaceBytesReference + att);
  for (int t = 1; t < offload::kTiers; ++t) EXPECT_EQ(g.plan.totals[t], c.plan.totals[t]);
}

// The fast kernels' scratch: the workspace, 4·B·H·T floats for the flash backward (not B·H·T·T),
// 2·C·min(B·T, 1024) floats of column partials and (2·B·T + 65536) ints for the token sort.
TEST(Plan, OpsScratchOfBothKernelSets) {
  OpsScratchShape s{.llama = false, .batch = 4, .seq = 1024, .heads = 25, .width = 1600, .fast = false};
  EXPECT_EQ(ops_scratch_blocks(s),
            (std::vector<std::uint64_t>{kGemmWorkspaceBytesReference, 4ull * 25 * 1024 * 1024 * 4}));
  s.llama = true;
  EXPECT_EQ(ops_scratch_blocks(s), (std::vector<std::uint64_t>{kGemmWorkspaceBytesReference, 4ull * 25 * 1024 * 4}));
  s.fast = true;
  const std::vector<std::uint64_t> fast{kGemmWorkspaceBytesFast, 4ull * 4 * 25 * 1024 * 4, 2ull * 1600 * 1024 * 4,
                                        (2ull * 4 * 1024 + 65536) * 4};
  EXPECT_EQ(ops_scratch_blocks(s), fast);
  s.llama = false;
  EXPECT_EQ(ops_scratch_blocks(s), fast);  // one flash kernel for both families
  s.batch = 1, s.seq = 64;                 // fewer rows than the partials' cap
  EXPECT_EQ(ops_scratch_blocks(s)[2], 2ull * 1600 * 64 * 4);
  // cuDNN's attention: its workspace — 64 MiB, two fp32 copies of the query rows (B·T·C) and the
  // deterministic backward's 16-bit B·H·T'·T' scores, T' the sequence padded to 64 — and the
  // backward's softmax sums, B·H·T floats; grouped key/value heads add nothing (the graph sums them).
  s.cudnn = true;
  EXPECT_EQ(ops_scratch_blocks(s).size(), 6u);
  EXPECT_EQ(ops_scratch_blocks(s)[4], (64ull << 20) + 2ull * 64 * 1600 * 4 + 25ull * 64 * 64 * 2);
  EXPECT_EQ(ops_scratch_blocks(s)[5], 25ull * 64 * 4);
  s.seq = 65;  // padded to 128 for the scores
  EXPECT_EQ(ops_scratch_blocks(s)[4], (64ull << 20) + 2ull * 65 * 1600 * 4 + 25ull * 128 * 128 * 2);
  const auto mha = ops_scratch_blocks(s);
  s.llama = true, s.kv_heads = 5;
  EXPECT_EQ(ops_scratch_blocks(s), mha);
}

// device.kernels: fast in a bf16 run on the CUDA device: the plan is the reference plan less, row by
// row, what the fast kernels do not keep — the fp32 working weights, the attention probabilities
// (B·H·T·T floats become one fp32 log-sum-exp per row, B·H·T), the 4-byte activations of the
// Korthikanti estimate's fp32 terms — and with the fast kernels' own scratch (a 32 MiB cuBLASLt
// workspace, the flash backward's 4·B·H·T floats, the column partials, the token sort) instead of
// the reference's (an 8 MiB workspace and GPT's B·H·T·T floats of score gradients).
TEST(Plan, FastKernelsPlanTheirOwnStorageAndScratch) {
  const std::string body = R"("train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
      "model": {"n_layer": 2, "n_head": 4, "d_model": 96, "vocab_size": 1000, "seq_len": 2048},
      "bf16": {"enabled": true}, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}})";
  const Config ref =
      parse_config(R"({"device": {"type": "cuda", "memory_budget": "1GiB", "kernels": "reference"}, )" + body + "}");
  const Config fast =
      parse_config(R"({"device": {"type": "cuda", "memory_budget": "1GiB", "kernels": "fast"}, )" + body + "}");
  const MachineInfo m = fake_machine(8ull << 30, 0);
  const RunPlan r = plan_run(ref, m), f = plan_run(fast, m);
  auto row = [](const offload::Plan& p, const std::string& name) {
    for (const auto& x : p.buffers)
      if (x.name == name) return x.bytes[0];
    for (const auto& x : p.states)
      if (x.name == name) return x.bytes[0];
    return std::uint64_t{0};
  };
  const std::uint64_t B = 2, T = 2048, C = 96, H = 4, V = 1000, L = 2;
  // Activations: 17 stored bf16 elements per row and channel, fp32 statistics (4 per row) and
  // log-sum-exp (one per row and head) per block; probs and dlogits in bf16 with their rows padded
  // to a multiple of 64 classes (1000 → 1024), fp32 losses; the embedding's output in bf16.
  const std::uint64_t Vp = 1024;
  const std::uint64_t fast_acts =
      L * (B * T * C * 17 * 2 + 4 * (4 * B * T + B * H * T)) + (B * T * Vp * 2 * 2 + 4 * B * T) + B * T * C * 2;
  EXPECT_EQ(estimate_activation_bytes(f.shape, 2, 2, false, Kernels::fast, DeviceType::cuda), fast_acts);
  // The CPU device's twin keeps the rows V apart: the difference is the pad of probs and dlogits.
  EXPECT_EQ(fast_acts - estimate_activation_bytes(f.shape, 2, 2, false, Kernels::fast, DeviceType::cpu),
            B * T * (Vp - V) * 2 * 2);
  EXPECT_EQ(row(f.plan, "activations"), cuda_block_bytes(fast_acts));
  const std::uint64_t ref_acts = estimate_activation_bytes(r.shape, 2, 2, false);
  EXPECT_EQ(row(r.plan, "activations"), cuda_block_bytes(ref_acts));
  EXPECT_EQ(f.activations_plain, fast_acts);
  EXPECT_LT(f.activations_checkpointed, r.activations_checkpointed);
  // The attention state alone: B·H·T·T floats under the reference estimate (5 two-byte units),
  // B·H·T floats under fast.
  EXPECT_GT(ref_acts - fast_acts, L * (5 * B * H * T * T - 4 * B * H * T) - L * 16 * B * T);
  // Ops scratch: each kernel set's own blocks.
  const std::vector<std::uint64_t> ref_scratch{kGemmWorkspaceBytesReference, B * H * T * T * 4};
  std::vector<std::uint64_t> fast_scratch{kGemmWorkspaceBytesFast, 4 * B * H * T * 4,
                                          2 * C * std::min<std::uint64_t>(B * T, 1024) * 4, (2 * B * T + 65536) * 4};
  // device.attention auto under fast is cuDNN's where this build has it: its workspace too.
  if (backends::cudnn_built()) {
    fast_scratch.push_back(cudnn_workspace_bytes(B * H, T, B * T * C));
    fast_scratch.push_back(B * H * T * 4);  // the backward's softmax sums
  }
  EXPECT_EQ(estimate_ops_scratch(ref, r.shape), ref_scratch);
  EXPECT_EQ(estimate_ops_scratch(fast, f.shape), fast_scratch);
  std::uint64_t ref_blocks = 0, fast_blocks = 0;
  for (auto b : ref_scratch) ref_blocks += cuda_block_bytes(b);
  for (auto b : fast_scratch) fast_blocks += cuda_block_bytes(b);
  EXPECT_EQ(row(r.plan, "ops scratch"), ref_blocks);
  EXPECT_EQ(row(f.plan, "ops scratch"), fast_blocks);
  // fp32 working weights: the reference kernels' only.
  EXPECT_GT(row(r.plan, "fp32 work"), 0u);
  EXPECT_EQ(row(f.plan, "fp32 work"), 0u);
  // Nothing else differs: the device total is the reference's less exactly those rows.
  EXPECT_EQ(f.plan.totals[0] + row(r.plan, "fp32 work") + cuda_block_bytes(ref_acts) + ref_blocks,
            r.plan.totals[0] + cuda_block_bytes(fast_acts) + fast_blocks);
  EXPECT_LT(f.plan.totals[0], r.plan.totals[0]);
  for (int t = 1; t < offload::kTiers; ++t) EXPECT_EQ(f.plan.totals[t], r.plan.totals[t]);
}

// The training loop's token batches (two slots of tokens and targets, int32): four pinned arrays,
// each on pages of its own, and four device buffers. They are planned in a row of their own, outside
// the engine's bounded pinned pool (they have a pool of their own).
TEST(Plan, TokenBatchesArePlannedPinnedAndOnTheDevice) {
  const std::string body = R"("train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 1,
      "model": {"n_layer": 2, "n_head": 4, "d_model": 96, "vocab_size": 1000, "seq_len": 1000},
      "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}})";
  const MachineInfo m = fake_machine(8ull << 30, 0);
  for (const char* type : {"cpu", "cuda"}) {
    SCOPED_TRACE(type);
    const Config c =
        parse_config(R"({"device": {"type": ")" + std::string(type) + R"(", "memory_budget": "1GiB"}, )" + body + "}");
    const RunPlan r = plan_run(c, m);
    const std::uint64_t bytes = 3 * 1000 * 4;  // 12000 B: three 4 KiB pages each
    const bool cuda = std::string(type) == "cuda";
    const offload::Row* tokens = nullptr;
    for (const auto& x : r.plan.buffers)
      if (x.name == "token batches") tokens = &x;
    ASSERT_NE(tokens, nullptr);
    constexpr int D = static_cast<int>(offload::Tier::device), P = static_cast<int>(offload::Tier::pinned);
    EXPECT_EQ(tokens->bytes[P], 4u * 3 * 4096);
    EXPECT_EQ(tokens->bytes[D], 4u * (cuda ? cuda_block_bytes(bytes) : bytes));
    EXPECT_EQ(r.plan.pinned_pool, r.plan.totals[P] - tokens->bytes[P]);
    // The engine's own plan has no token batches: its pinned pool is the run plan's.
    const offload::PlanInput in = make_plan_input(c, r.shape);
    EXPECT_EQ(in.batch_tokens, 3000u);
    offload::PlanInput engine_only = in;
    engine_only.batch_tokens = 0;
    const offload::Plan e = offload::make_plan(engine_only);
    EXPECT_EQ(e.pinned_pool, r.plan.pinned_pool);
    EXPECT_EQ(e.totals[P] + tokens->bytes[P], r.plan.totals[P]);
  }
}

// pin_memory false: every staging row moves to the host column but the token batches' pages, which
// the trainer registers with the device whatever the setting; the pool keeps its size.
TEST(Plan, PinMemoryFalseCountsTheStagingAsHostMemoryButTheTokenBatches) {
  const std::string body = R"("train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 2,
      "model": {"n_layer": 2, "n_head": 4, "d_model": 96, "vocab_size": 1000, "seq_len": 1000},
      "device": {"type": "cuda", "memory_budget": "1GiB"},
      "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": PIN},
                            "offload_param": {"device": "cpu"}}})";
  auto plan = [&](const char* pin) {
    std::string b = body;
    b.replace(b.find("PIN"), 3, pin);
    return plan_run(parse_config("{" + b), fake_machine(8ull << 30, 0));
  };
  const RunPlan pinned = plan("true"), pageable = plan("false");
  constexpr int P = static_cast<int>(offload::Tier::pinned), H = static_cast<int>(offload::Tier::host);
  std::uint64_t tokens = 0;
  for (const auto& x : pageable.plan.buffers)
    if (x.name == "token batches") tokens = x.bytes[P];
  EXPECT_EQ(tokens, 4u * 3 * 4096);
  EXPECT_EQ(pageable.plan.totals[P], tokens);
  EXPECT_GT(pinned.plan.totals[P], tokens);
  EXPECT_EQ(pageable.plan.totals[H] + pageable.plan.totals[P], pinned.plan.totals[H] + pinned.plan.totals[P]);
  EXPECT_EQ(pageable.plan.pinned_pool, pinned.plan.pinned_pool);
  EXPECT_FALSE(pageable.plan.pinned);
  std::uint64_t states_pinned = 0;
  for (const auto& x : pageable.plan.states) states_pinned += x.bytes[P];
  EXPECT_EQ(states_pinned, 0u) << "the parameters' host home is pageable too";
  EXPECT_EQ(pageable.plan.model_states[P], 0u);
}

TEST(Plan, ZeroPaperFormulasPerStage) {
  // The ZeRO paper's worked example: 7.5B parameters on 64 GPUs — 120 GB, 31.4 GB, 16.6 GB, 1.88 GB.
  const std::int64_t psi = 7'500'000'000;
  EXPECT_EQ(zero_paper_bytes(psi, 0, 64), 120'000'000'000ull);
  EXPECT_NEAR(static_cast<double>(zero_paper_bytes(psi, 1, 64)), 31.4e9, 0.05e9);
  EXPECT_NEAR(static_cast<double>(zero_paper_bytes(psi, 2, 64)), 16.6e9, 0.05e9);
  EXPECT_NEAR(static_cast<double>(zero_paper_bytes(psi, 3, 64)), 1.875e9, 0.001e9);
  EXPECT_EQ(zero_paper_bytes(psi, 3, 1), zero_paper_bytes(psi, 0, 1));
}

TEST(Plan, PerRankBytesFallWithTheStageAndTheWorld) {
  auto plan_for = [](int world) {
    Config c = parse_config(
        R"({"model": {"preset": "gpt2-350m"}, "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true},
                               "zero_optimization": {"stage": 2}})",
        {}, "<test>", world);
    return plan_run(c, fake_machine(64ull << 30, 80ull << 30));
  };
  const RunPlan one = plan_for(1), four = plan_for(4);
  ASSERT_EQ(four.stages.size(), 4u);
  EXPECT_EQ(four.world, 4);
  auto states = [](const StagePlan& s) {
    return s.model_states[0] + s.model_states[1] + s.model_states[2] + s.model_states[3];
  };
  for (int st = 1; st <= 3; ++st) {
    EXPECT_LT(states(four.stages[st]), states(four.stages[st - 1])) << "stage " << st;
    EXPECT_LT(four.stages[st].zero_paper, four.stages[st - 1].zero_paper);
    EXPECT_LT(states(four.stages[st]), states(one.stages[st])) << "stage " << st << ": 4 ranks hold less each than 1";
  }
  // With one rank the stages partition nothing.
  EXPECT_EQ(states(one.stages[1]), states(one.stages[3]));
  for (const auto& st : four.stages) EXPECT_TRUE(st.valid) << "no offload: every stage allows it";
  Config off = parse_config(
      R"({"train_batch_size": 4, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}})", {},
      "<test>", 4);
  const RunPlan r = plan_run(off, fake_machine(64ull << 30, 80ull << 30));
  EXPECT_FALSE(r.stages[0].valid);  // offloading the optimizer needs stage 1 or more
  EXPECT_TRUE(r.stages[1].valid);
}

// ZeRO-2 and ZeRO-3 with the optimizer in host memory (one rank, a GPU, bf16, gradient accumulation:
// the host gradient is the fp32 sum): master + m + v, the host gradient, the pinned parameter home
// with offload_param cpu, and the staging, per parameter.
TEST(Plan, HostBytesPerParameterWithTheOptimizerInHostMemory) {
  struct Case {
    const char* preset;
    int stage;
    const char* param;
  };
  for (const Case& k : {Case{"gpt2-124m", 2, "none"}, Case{"gpt2-124m", 3, "cpu"}, Case{"llama-3.1-8b", 2, "none"},
                        Case{"llama-3.1-8b", 3, "cpu"}}) {
    SCOPED_TRACE(std::string(k.preset) + " stage " + std::to_string(k.stage) + " offload_param " + k.param);
    const Config c = parse_config(std::string(R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4,
        "bf16": {"enabled": true}, "device": {"type": "cuda"}, "model": {"preset": ")") +
                                  k.preset + R"("}, "zero_optimization": {"stage": )" + std::to_string(k.stage) +
                                  R"(, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": ")" +
                                  k.param + R"("}}})");
    const ModelShape shape = model_shape(c.model);
    const offload::PlanInput in = make_plan_input(c, shape);
    const offload::Plan fp32 = offload::make_plan(in);
    const PerParam p = per_param(fp32, cpu_adam::StateFormat::fp32);
    const double n = static_cast<double>(fp32.n_params);
    EXPECT_DOUBLE_EQ(p.tier[2], static_cast<double>(fp32.totals[2]) / n);
    EXPECT_DOUBLE_EQ(p.host_pinned, static_cast<double>(fp32.totals[1] + fp32.totals[2]) / n);
    EXPECT_GE(p.host_pinned, 16.0);  // 12 of states and 4 of the fp32 gradient sum, at least
    EXPECT_LE(p.host_pinned, 18.0);
    const offload::Plan q8_plan = plan_with_states(in, cpu_adam::StateFormat::q8);
    const PerParam q8 = per_param(q8_plan, cpu_adam::StateFormat::q8);
    EXPECT_LE(q8.host_pinned, 12.0);
    // m and v: 4 + 4 bytes in fp32, 2 + 2 in bf16, 1 + 1 and a scale per 256 in 8-bit; nothing else moves.
    const PerParam bf16 = per_param(plan_with_states(in, cpu_adam::StateFormat::bf16), cpu_adam::StateFormat::bf16);
    EXPECT_NEAR(p.host_pinned - bf16.host_pinned, 4.0, 1e-3);
    EXPECT_NEAR(p.host_pinned - q8.host_pinned, 8.0 - 2 * (1 + 4.0 / 256), 1e-3);
    EXPECT_DOUBLE_EQ(q8.tier[0], p.tier[0]);
    // The staging is a few 4M-element pieces, not the largest unit's size.
    EXPECT_LE(fp32.sub_group, std::int64_t{1} << 22);
    EXPECT_LE(fp32.bucket, std::int64_t{1} << 22);
  }
}

// `zinf plan` shows one bytes-per-parameter line for each state format unless the config names one.
TEST(Plan, BytesPerParameterLinesForEachStateFormatUnlessTheConfigNamesOne) {
  const std::string base = R"({"train_batch_size": 1, "model": {"preset": "gpt2-124m", "seq_len": 128},
      "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"})";
  const RunPlan open = plan_run(parse_config(base + "}}"), fake_machine(64ull << 30, 0));
  ASSERT_EQ(open.per_states.size(), 3u);
  EXPECT_EQ(open.per_states[0].states, cpu_adam::StateFormat::fp32);
  EXPECT_DOUBLE_EQ(open.per_states[0].host_pinned, open.per_param.host_pinned);
  EXPECT_GT(open.per_states[1].host_pinned, open.per_states[2].host_pinned);
  const RunPlan fixed =
      plan_run(parse_config(base + R"(, "optimizer_states": "8bit"}})"), fake_machine(64ull << 30, 0));
  EXPECT_TRUE(fixed.per_states.empty());
  EXPECT_EQ(fixed.per_param.states, cpu_adam::StateFormat::q8);
  EXPECT_DOUBLE_EQ(fixed.per_param.host_pinned, open.per_states[2].host_pinned);
}

// The host memory of a run: the engine's host and pinned buffers, every device byte on the CPU device
// (none on a GPU), the largest short-lived buffer, the data set and the program's constant.
TEST(Plan, HostFootprintCountsTheCpuDevicesMemoryAndTheTransients) {
  const std::string base = R"({"train_batch_size": 1, "bf16": {"enabled": true}, "model": {"preset": "gpt2-124m"},
      "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}})";
  for (const char* dev : {"cpu", "cuda"}) {
    const Config c = parse_config(base + R"(, "device": {"type": ")" + dev + R"("}})");
    const ModelShape shape = model_shape(c.model);
    const offload::Plan p = offload::make_plan(make_plan_input(c, shape));
    const HostFootprint f = host_footprint(c, p, shape);
    EXPECT_EQ(f.host, p.totals[2]);
    EXPECT_EQ(f.pinned, p.totals[1]);
    EXPECT_EQ(f.device, std::string(dev) == "cpu" ? p.totals[0] : 0u);
    EXPECT_EQ(f.runtime, kLoadedBytes + kRuntimeExtraBytes);  // no start-up figure recorded in this test
    EXPECT_GT(f.data, 0u);  // the default text
    // On a GPU one unit's fp32 master (the embedding); the CPU ops pack the LM head's weights (as large).
    EXPECT_GE(f.transient, 4u * static_cast<std::uint64_t>(p.largest_unit) - 4u * 1024 * 768);
    EXPECT_EQ(f.total(), f.host + f.pinned + f.device + f.transient + f.data + f.runtime);
  }
  Config ck = parse_config(base + R"(, "device": {"type": "cuda"}, "train": {"checkpoint_dir": "/tmp/x"}})");
  const offload::Plan p = offload::make_plan(make_plan_input(ck, model_shape(ck.model)));
  EXPECT_EQ(host_footprint(ck, p, model_shape(ck.model)).transient, 12u * static_cast<std::uint64_t>(p.largest_unit));
}

// The NVMe need of a run per filesystem: the parameters' store (param16) in offload_param.nvme_path,
// every other NVMe byte in offload_optimizer.nvme_path, two paths on one filesystem summed, measured
// where a missing path will be created, which it does not create.
TEST(Plan, NvmeSpaceSumsThePlansNvmeBytesPerFilesystem) {
  test::TempDir dir("plan-nvme-space");
  const std::string opt = dir / "states", par = dir / "params/new";
  Config c = parse_config(R"({"train_batch_size": 1, "model": {"preset": "gpt2-124m"}, "bf16": {"enabled": true},
      "zero_optimization": {"stage": 3,
          "offload_optimizer": {"device": "nvme", "gradient_streaming": true, "nvme_path": ")" + opt + R"("},
          "offload_param": {"device": "nvme", "nvme_path": ")" + par + R"("}}})");
  const offload::Plan p = offload::make_plan(make_plan_input(c, model_shape(c.model)));
  constexpr int kNvme = static_cast<int>(offload::Tier::nvme);
  std::uint64_t param16 = 0, grad = 0;
  for (const auto& r : p.states) {
    if (r.name == "param16") param16 = r.bytes[kNvme];
    if (r.name == "grad16") grad = r.bytes[kNvme];
  }
  ASSERT_GT(param16, 0u);
  ASSERT_GT(grad, 0u);  // the streamed gradient's store: the optimizer's folder
  const auto spaces = nvme_space(c, p);
  ASSERT_EQ(spaces.size(), 1u);  // both under one temporary folder
  EXPECT_EQ(spaces[0].needed, p.totals[kNvme]);
  ASSERT_EQ(spaces[0].keys.size(), 2u);
  EXPECT_EQ(spaces[0].keys[0], "zero_optimization.offload_optimizer.nvme_path");
  EXPECT_EQ(spaces[0].probed, dir.path.string());  // neither exists yet: their parent is measured
  EXPECT_FALSE(std::filesystem::exists(opt));
  EXPECT_FALSE(std::filesystem::exists(par));
  struct statvfs v {};
  ASSERT_EQ(::statvfs(dir.path.c_str(), &v), 0);
  const std::uint64_t free_now = static_cast<std::uint64_t>(v.f_bavail) * v.f_frsize;
  EXPECT_LT(spaces[0].free, free_now + (std::uint64_t{256} << 20));  // the same filesystem, moments apart
  EXPECT_GT(spaces[0].free + (std::uint64_t{256} << 20), free_now);
  // A swap folder a killed run left in nvme_path (its process gone, its marker naming it): the stores
  // remove it at start, so its blocks count as reclaimable; nothing is removed by measuring.
  {
    const pid_t dead = ::fork();
    if (dead == 0) ::_exit(0);
    ::waitpid(dead, nullptr, 0);
    std::string boot;
    std::getline(std::ifstream("/proc/sys/kernel/random/boot_id"), boot);
    const std::string left = opt + "/zinf-" + std::to_string(dead) + "-0000beef";
    std::filesystem::create_directories(left);
    std::ofstream(left + "/.zinf-swap") << "zinf swap directory\npid " << dead << "\nboot " << boot << "\n";
    std::ofstream(left + "/store.0") << std::string(4 << 20, 'x');
    const auto with_stale = nvme_space(c, p);
    ASSERT_EQ(with_stale.size(), 1u);
    EXPECT_GE(with_stale[0].reclaimable, std::uint64_t{4} << 20);
    EXPECT_LT(with_stale[0].reclaimable, std::uint64_t{5} << 20);
    EXPECT_TRUE(std::filesystem::exists(left + "/store.0"));
    std::filesystem::remove_all(opt);
  }
  // On two filesystems (where /dev/shm is one of its own) each path gets its own part.
  struct stat a {};
  struct stat b {};
  if (::stat("/dev/shm", &b) == 0 && ::access("/dev/shm", W_OK) == 0 && ::stat(dir.path.c_str(), &a) == 0 &&
      a.st_dev != b.st_dev) {
    c.zero.offload_param.nvme_path = "/dev/shm/zinf-plan-nvme-space-never-created";
    const auto two = nvme_space(c, p);
    ASSERT_EQ(two.size(), 2u);
    EXPECT_EQ(two[0].needed, p.totals[kNvme] - param16);
    EXPECT_EQ(two[1].needed, param16);
    EXPECT_EQ(two[1].probed, "/dev/shm");
    EXPECT_FALSE(std::filesystem::exists(c.zero.offload_param.nvme_path));
  }
  // Nothing on NVMe: nothing to measure.
  c.zero.offload_optimizer.device = c.zero.offload_param.device = OffloadDevice::cpu;
  EXPECT_TRUE(nvme_space(c, offload::make_plan(make_plan_input(c, model_shape(c.model)))).empty());
}

// The refusal names the path(s), the bytes needed and free in GiB; space a sweep of a gone run's
// swap folders gives back counts as free.
TEST(Plan, NvmeSpaceProblemNamesThePathAndTheBytes) {
  NvmeSpace s;
  s.keys = {"zero_optimization.offload_optimizer.nvme_path"};
  s.paths = {"/mnt/nvme/swap"};
  s.probed = "/mnt/nvme/swap";
  s.needed = std::uint64_t{3} << 30;
  s.free = std::uint64_t{2} << 30;
  std::string line = nvme_space_problem({s});
  EXPECT_EQ(line,
            "zero_optimization.offload_optimizer.nvme_path /mnt/nvme/swap: the NVMe stores need 3.00 GiB there, "
            "2.00 GiB is free");
  s.reclaimable = (std::uint64_t{1} << 30) - 1;  // one byte short
  EXPECT_NE(nvme_space_problem({s}).find("(+ 1.00 GiB in swap folders of runs that are gone)"), std::string::npos);
  s.reclaimable += 1;
  EXPECT_EQ(nvme_space_problem({s}), "");
  s.reclaimable = 0;
  s.free = s.needed;  // exactly enough
  EXPECT_EQ(nvme_space_problem({s}), "");
  // Two paths on one filesystem, the first missing: both named, and where it was measured.
  NvmeSpace t = s;
  t.keys.push_back("zero_optimization.offload_param.nvme_path");
  t.paths.push_back("/mnt/nvme/params");
  t.probed = "/mnt/nvme";
  t.missing = true;
  t.needed = t.free + 1;
  line = nvme_space_problem({s, t});
  EXPECT_NE(line.find("offload_optimizer.nvme_path /mnt/nvme/swap and zero_optimization.offload_param.nvme_path "
                      "/mnt/nvme/params: "),
            std::string::npos)
      << line;
  EXPECT_NE(line.find("one filesystem (measured at /mnt/nvme, where it will be created)"), std::string::npos) << line;
}

}  // namespace
}  // namespace zinf
