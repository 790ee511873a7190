// train_speculative_test.cpp — the speculative Update (offload_optimizer.speculative) through
// `train()` on the asynchronous, jittered CPU device: every step's loss, loss scale and norm and the
// trained parameters must equal the non-speculative synchronous run's bit for bit — with steps that
// clip, steps that do not, overflowing fp16 steps (the loss scale lowered the same way), the optimizer
// in host memory (a backup bound that fills up) and on NVMe, parameters on the device, in pinned
// memory and on NVMe, gradient accumulation 1 and 2 — and the rollbacks are counted where clipping
// applies, in the step that has them. Seeds per configuration: ZINF_ASYNC_SEEDS (default 3).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "app/config/config.h"
#include "app/train/train.h"
#include "nlohmann/json.hpp"
#include "small_train.h"

namespace zinf {
namespace {

namespace fs = std::filesystem;

const fs::path kDir = fs::temp_directory_path() / ("zinf-train-spec-" + std::to_string(::getpid()));

int seeds() {
  const char* v = std::getenv("ZINF_ASYNC_SEEDS");
  return v && *v ? std::max(1, std::atoi(v)) : 3;
}

struct Run {
  std::string digest;
  std::vector<std::string> steps;  // each step's loss, loss scale, norm and skip, as the metrics file has them
  std::int64_t rollbacks = 0, skipped = 0;
  // Per step, from the metrics file: the run's rollbacks so far, and whether the step could roll back
  // (skipped, or clipped: its norm over `clip`).
  std::vector<std::int64_t> rollbacks_so_far;
  std::vector<bool> may_roll_back;
};

Run run(std::vector<std::string> overrides, double clip = 0) {
  const fs::path swap = kDir / "swap", metrics = kDir / "metrics.jsonl";
  fs::create_directories(swap);
  fs::remove(metrics);
  overrides.push_back("train.metrics_file=" + metrics.string());
  overrides.push_back("train.steps=5");
  const TrainResult r = train(parse_config(test::small_train_config(swap.string()), overrides), TrainHooks{});
  Run out{r.params_digest, {}, r.rollbacks, r.skipped, {}, {}};
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("loss")) continue;
    if (j.contains("rollbacks")) out.rollbacks_so_far.push_back(j["rollbacks"].get<std::int64_t>());
    const double norm = j["grad_norm"].get<double>();
    out.may_roll_back.push_back(j["skipped"].get<bool>() || (clip > 0 && norm + 1e-6 > clip));
    out.steps.push_back(nlohmann::json{{"loss", j["loss"]},
                                       {"loss_scale", j["loss_scale"]},
                                       {"grad_norm", j["grad_norm"]},
                                       {"skipped", j["skipped"]}}
                            .dump());
  }
  EXPECT_TRUE(fs::is_empty(swap));
  return out;
}

// `overrides` with speculation on, on the jittered async device (seeds first, first+1, …), against
// the same config without speculation on the synchronous device. Returns the rollbacks of the
// speculative runs, summed.
std::int64_t expect_speculation_exact(const std::vector<std::string>& overrides, std::uint64_t first) {
  double clip = 0;
  for (const auto& o : overrides)
    if (o.rfind("gradient_clipping=", 0) == 0) clip = std::stod(o.substr(18));
  auto base = overrides;
  base.push_back("zero_optimization.offload_optimizer.speculative=false");
  const Run ref = run(base);
  EXPECT_EQ(ref.rollbacks, 0);
  std::int64_t rollbacks = 0;
  for (int k = 0; k < seeds(); ++k) {
    const std::uint64_t seed = first + static_cast<std::uint64_t>(k);
    auto o = overrides;
    o.push_back("zero_optimization.offload_optimizer.speculative=true");
    o.push_back("device.async=true");
    o.push_back("device.jitter_seed=" + std::to_string(seed));
    o.push_back("device.jitter_us=100");
    const Run got = run(o, clip);
    EXPECT_EQ(got.digest, ref.digest) << "jitter seed " << seed;
    // A rollback is counted in the step that has it: the progress line's and the metrics' count
    // rises only on a skipped or clipped step, and the last step's count is the run's.
    EXPECT_EQ(got.rollbacks_so_far.size(), got.may_roll_back.size()) << "every step line carries rollbacks";
    std::int64_t before = 0;
    for (std::size_t i = 0; i < std::min(got.rollbacks_so_far.size(), got.may_roll_back.size()); ++i) {
      EXPECT_LE(got.rollbacks_so_far[i] - before, got.may_roll_back[i] ? 1 : 0)
          << "step " << i + 1 << ", seed " << seed;
      before = got.rollbacks_so_far[i];
    }
    EXPECT_EQ(before, got.rollbacks) << "seed " << seed;
    EXPECT_EQ(got.steps, ref.steps) << "jitter seed " << seed;
    EXPECT_EQ(got.skipped, ref.skipped);
    rollbacks += got.rollbacks;
  }
  return rollbacks;
}

class TrainSpeculative : public ::testing::Test {
 protected:
  void SetUp() override { fs::create_directories(kDir); }
  void TearDown() override { fs::remove_all(kDir); }
};

// The small model's global norm is between 0.3 and 3 over its first steps (fp16 scale 2^12): a clip
// of 0.05 clips every step, 1e9 none; 0.6 clips some steps, and on those the last units' part of the
// norm stays under it, so the Update of those units ran speculatively first and is rolled back.
TEST_F(TrainSpeculative, ClippedAndUnclippedStepsEqualTheNonSpeculativeRun) {
  std::uint64_t seed = 501;
  for (auto [opt, param] : {std::pair{"cpu", "none"}, std::pair{"nvme", "cpu"}}) {
    std::int64_t rollbacks = 0;
    for (const char* clip : {"1e9", "0.6", "0.05"}) {
      SCOPED_TRACE(std::string("optimizer ") + opt + " param " + param + " clip " + clip);
      rollbacks += expect_speculation_exact({std::string("zero_optimization.offload_optimizer.device=") + opt,
                                             std::string("zero_optimization.offload_param.device=") + param,
                                             std::string("gradient_clipping=") + clip},
                                            seed);
      seed += 10;
    }
    EXPECT_GT(rollbacks, 0) << "optimizer " << opt << " param " << param;
  }
}

// Overflowing fp16 steps (a loss scale of 2^20 overflows until it is lowered to 2^17): skipped, the
// scale halved, exactly as without speculation. The last units' gradients stay finite, so they were
// updated speculatively before the overflow was seen: their states and compute copies are restored.
TEST_F(TrainSpeculative, OverflowingStepsEqualTheNonSpeculativeRun) {
  std::uint64_t seed = 601;
  for (const char* opt : {"cpu", "nvme"}) {
    SCOPED_TRACE(std::string("optimizer ") + opt);
    const std::vector<std::string> o = {std::string("zero_optimization.offload_optimizer.device=") + opt,
                                        "fp16.initial_scale_power=20", "fp16.hysteresis=1", "gradient_clipping=0"};
    EXPECT_GT(expect_speculation_exact(o, seed), 0);
    auto base = o;
    base.push_back("zero_optimization.offload_optimizer.speculative=false");
    EXPECT_GT(run(base).skipped, 0);  // the config does overflow
    seed += 10;
  }
}

// Gradient accumulation 1 (the default config has 2), bf16, a host backup of one sub-group
// (speculation stops when it is full), and 8-bit optimizer states (the backup keeps their scales).
TEST_F(TrainSpeculative, AccumulationPrecisionAndBackupBoundEqualTheNonSpeculativeRun) {
  std::uint64_t seed = 701;
  for (const char* extra : {"gradient_accumulation_steps=1", "bf16.enabled=true",
                            "zero_optimization.offload_optimizer.speculative_backup_size=6000",
                            "zero_optimization.optimizer_states=8bit"}) {
    SCOPED_TRACE(extra);
    std::vector<std::string> o = {"zero_optimization.offload_optimizer.device=cpu",
                                  "zero_optimization.offload_param.device=nvme", "gradient_clipping=0.6", extra};
    if (std::string(extra) == "bf16.enabled=true") o.push_back("fp16.enabled=false");
    expect_speculation_exact(o, seed);
    seed += 10;
  }
}

}  // namespace
}  // namespace zinf
