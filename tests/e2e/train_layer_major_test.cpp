// train_layer_major_test.cpp — the layer-major order of gradient accumulation
// (offload_optimizer.layer_major) through `train()`: every micro batch goes through a unit before the
// next unit, so a unit's gradient is complete after its micro batches, one after another, and is
// summed on the host (or in a streaming ring slot) without a model-sized accumulator anywhere but the
// Update's own input. Every step's loss, loss scale and norm and the trained parameters must equal the
// micro-batch-major run of the same config (synchronous device) bit for bit, on the jittered
// asynchronous CPU device: GA 2, 3 and 4, GPT-2 (the LM head tied to the embedding: that unit's
// micro batches stay open together) and an untied Llama, the optimizer in host memory and on NVMe,
// parameters on the device and on NVMe, checkpoints on the device and in host memory, steps that
// clip, overflowing fp16 steps, the 8-bit states, and with gradient streaming (with and without the
// speculative Update). With the parameters on NVMe it reads each unit's parameters once per pass
// instead of once per micro batch. Each placement it cannot serve is refused with one line.
// Seeds per configuration: ZINF_ASYNC_SEEDS (default 2).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "app/config/config.h"
#include "app/train/train.h"
#include "nlohmann/json.hpp"
#include "metrics_steps.h"
#include "small_train.h"
#include "zinf/error.h"

namespace zinf {
namespace {

namespace fs = std::filesystem;

const fs::path kDir = fs::temp_directory_path() / ("zinf-train-layers-" + std::to_string(::getpid()));

int seeds() {
  const char* v = std::getenv("ZINF_ASYNC_SEEDS");
  return v && *v ? std::max(1, std::atoi(v)) : 2;
}

struct RunResult {
  std::string digest;
  std::vector<std::string> steps;  // each step's loss, loss scale, norm and skip, from the metrics file
  double nvme_read = 0;            // bytes read from NVMe over the steps after the first
  std::int64_t skipped = 0;
};

RunResult run(std::vector<std::string> overrides) {
  const fs::path swap = kDir / "swap", metrics = kDir / "metrics.jsonl";
  fs::create_directories(swap);
  fs::remove(metrics);
  overrides.push_back("train.metrics_file=" + metrics.string());
  overrides.push_back("train.steps=4");
  overrides.push_back("model.activation_checkpointing=true");
  const TrainResult r = train(parse_config(test::small_train_config(swap.string()), overrides), TrainHooks{});
  const test::MetricsSteps m = test::metrics_steps(metrics.string());
  return RunResult{r.params_digest, m.steps, m.nvme_read_after_first, r.skipped};
}

// `overrides` in the layer-major order on the jittered async device (seeds first, first+1, …) against
// the same config in the micro-batch-major order on the synchronous device. Returns the reference.
RunResult expect_layer_major_exact(const std::vector<std::string>& overrides, std::uint64_t first,
                             const std::vector<std::string>& only_layer_major = {}) {
  auto base = overrides;
  base.push_back("zero_optimization.offload_optimizer.layer_major=false");
  const RunResult ref = run(base);
  EXPECT_FALSE(ref.steps.empty());
  for (int k = 0; k < seeds(); ++k) {
    const std::uint64_t seed = first + static_cast<std::uint64_t>(k);
    auto o = overrides;
    o.insert(o.end(), only_layer_major.begin(), only_layer_major.end());
    o.push_back("zero_optimization.offload_optimizer.layer_major=true");
    o.push_back("device.async=true");
    o.push_back("device.jitter_seed=" + std::to_string(seed));
    o.push_back("device.jitter_us=100");
    const RunResult got = run(o);
    EXPECT_EQ(got.digest, ref.digest) << "jitter seed " << seed;
    EXPECT_EQ(got.steps, ref.steps) << "jitter seed " << seed;
    EXPECT_EQ(got.skipped, ref.skipped) << "jitter seed " << seed;
  }
  return ref;
}

class TrainLayerMajor : public ::testing::Test {
 protected:
  void SetUp() override { fs::create_directories(kDir); }
  void TearDown() override { fs::remove_all(kDir); }
};

std::vector<std::string> placement(const char* optimizer, const char* param, std::int64_t ga) {
  return {std::string("zero_optimization.offload_optimizer.device=") + optimizer,
          std::string("zero_optimization.offload_param.device=") + param,
          "gradient_accumulation_steps=" + std::to_string(ga), "gradient_clipping=0.6"};
}

// The small model's global norm is between 0.3 and 3 over its first steps: a clip of 0.6 clips some.
TEST_F(TrainLayerMajor, EqualsTheMicroBatchOrderForEveryPlacement) {
  std::uint64_t seed = 1101;
  for (const char* optimizer : {"cpu", "nvme"})
    for (const char* param : {"none", "nvme"})
      for (std::int64_t ga : {2, 4}) {
        SCOPED_TRACE(std::string("optimizer ") + optimizer + " param " + param + " GA " + std::to_string(ga));
        expect_layer_major_exact(placement(optimizer, param, ga), seed);
        seed += 10;
      }
}

// Checkpoints in host memory (the Checkpoints ring of two device rows, each holding every micro
// batch's row), an odd GA, an untied Llama (unit 0 is then only the embedding), and no overlap (the
// GradOut and Reduce jobs run inline on the trainer's thread).
TEST_F(TrainLayerMajor, CheckpointsInHostMemoryOddGaAnUntiedLlamaAndNoOverlap) {
  {
    SCOPED_TRACE("cpu_checkpointing, GA 3");
    auto o = placement("cpu", "nvme", 3);
    o.push_back("activation_checkpointing.cpu_checkpointing=true");
    expect_layer_major_exact(o, 1201);
  }
  {
    SCOPED_TRACE("llama, untied head, GA 3");
    auto o = placement("nvme", "none", 3);
    for (const char* x : {"model.family=llama", "model.n_kv_head=1", "model.d_ff=64", "model.tie_embeddings=false"})
      o.push_back(x);
    expect_layer_major_exact(o, 1211);
  }
  {
    SCOPED_TRACE("train.overlap none, GA 4");
    auto o = placement("nvme", "nvme", 4);
    o.push_back("train.overlap=none");
    expect_layer_major_exact(o, 1221);
  }
}

// Overflowing fp16 steps (a loss scale of 2^20 overflows until it is lowered) are skipped and the
// scale lowered exactly as in the micro-batch order; bf16 with 8-bit states.
TEST_F(TrainLayerMajor, OverflowingStepsAndBf16With8BitStates) {
  {
    SCOPED_TRACE("fp16 overflow");
    auto o = placement("cpu", "none", 4);
    for (const char* x : {"fp16.initial_scale_power=20", "fp16.hysteresis=1", "gradient_clipping=0"}) o.push_back(x);
    EXPECT_GT(expect_layer_major_exact(o, 1301).skipped, 0) << "the config does overflow";
  }
  {
    SCOPED_TRACE("bf16, 8-bit states");
    auto o = placement("nvme", "nvme", 4);
    for (const char* x : {"bf16.enabled=true", "fp16.enabled=false", "zero_optimization.optimizer_states=8bit"})
      o.push_back(x);
    expect_layer_major_exact(o, 1311);
  }
}

// With gradient streaming: no host gradient, each unit's fp32 sum made in a ring slot as its micro
// batches arrive, with and without the speculative Update (which streaming turns on).
TEST_F(TrainLayerMajor, WithGradientStreamingEqualsTheMicroBatchOrderWithoutIt) {
  std::uint64_t seed = 1401;
  for (const char* speculative : {"true", "false"})
    for (const char* clip : {"1e9", "0.6", "0.05"}) {
      SCOPED_TRACE(std::string("speculative ") + speculative + " clip " + clip);
      auto o = placement("nvme", "nvme", 4);
      o.back() = std::string("gradient_clipping=") + clip;
      expect_layer_major_exact(o, seed,
                               {"zero_optimization.offload_optimizer.gradient_streaming=true",
                                std::string("zero_optimization.offload_optimizer.speculative=") + speculative});
      seed += 10;
    }
}

// Parameters on NVMe, the optimizer in host memory (so NVMe reads are the parameters' Fetches only),
// 8 blocks through a window of 2 slots: the layer-major order fetches each block once per pass, the
// micro-batch order once per micro batch and pass, so it reads about GA times as much.
TEST_F(TrainLayerMajor, ReadsTheParametersOncePerPassInsteadOfOncePerMicroBatch) {
  const std::int64_t ga = 4;
  auto base = placement("cpu", "nvme", ga);
  for (const char* x : {"model.n_layer=8", "zero_optimization.stage3_prefetch_bucket_size=1"}) base.push_back(x);
  base.push_back("zero_optimization.offload_optimizer.layer_major=false");
  const RunResult micro = run(base);
  auto o = base;
  o.back() = "zero_optimization.offload_optimizer.layer_major=true";
  const RunResult layers = run(o);
  EXPECT_EQ(layers.digest, micro.digest);
  ASSERT_GT(layers.nvme_read, 0);
  const double ratio = micro.nvme_read / layers.nvme_read;
  EXPECT_GT(ratio, 0.75 * static_cast<double>(ga)) << micro.nvme_read << " / " << layers.nvme_read;
  EXPECT_LT(ratio, 1.25 * static_cast<double>(ga)) << micro.nvme_read << " / " << layers.nvme_read;
}

// One line naming the key for every placement the layer-major order cannot serve.
TEST(TrainLayerMajorConfig, EachUnsupportedPlacementIsRefusedWithOneLine) {
  const std::string json = test::small_train_config("/tmp");
  auto refused = [&](std::vector<std::string> o, const std::string& why, int world = 1) {
    o.push_back("zero_optimization.offload_optimizer.layer_major=true");
    try {
      parse_config(json, o, "<string>", world);
      ADD_FAILURE() << "accepted: " << why;
    } catch (const ConfigError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("zero_optimization.offload_optimizer.layer_major"), std::string::npos) << m;
      EXPECT_NE(m.find(why), std::string::npos) << m;
      EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    }
  };
  refused({"zero_optimization.offload_optimizer.device=none", "model.activation_checkpointing=true"},
          "needs the optimizer off the device");
  refused({"zero_optimization.offload_optimizer.device=cpu", "model.activation_checkpointing=true",
           "zero_optimization.offload_optimizer.device_grad_accumulation=true"},
          "two ways to sum the micro batches");
  refused({"zero_optimization.offload_optimizer.device=cpu"}, "needs model.activation_checkpointing true");
  // Accepted where it applies (a note at GA 1, where it changes nothing), off by default.
  const Config on = parse_config(json, {"zero_optimization.offload_optimizer.device=cpu",
                                        "model.activation_checkpointing=true",
                                        "zero_optimization.offload_optimizer.layer_major=true"});
  EXPECT_TRUE(on.zero.offload_optimizer.layer_major);
  EXPECT_TRUE(parse_config(json,
                           {"zero_optimization.offload_optimizer.device=nvme", "model.activation_checkpointing=true",
                            "train_batch_size=8", "zero_optimization.offload_optimizer.layer_major=true",
                            "zero_optimization.offload_optimizer.gradient_streaming=true"},
                           "<string>", 2)
                  .zero.offload_optimizer.layer_major);  // several ranks, streaming too
  const std::vector<std::string> notes =
      parse_config(json, {"zero_optimization.offload_optimizer.device=cpu", "model.activation_checkpointing=true",
                          "gradient_accumulation_steps=1", "zero_optimization.offload_optimizer.layer_major=true"})
          .notes;
  EXPECT_TRUE(std::any_of(notes.begin(), notes.end(),
                          [](const std::string& n) { return n.find("layer_major: no effect") != std::string::npos; }));
  EXPECT_FALSE(parse_config(json, {"zero_optimization.offload_optimizer.device=cpu"}).zero.offload_optimizer.layer_major);
  // Streaming with GA > 1 takes it in place of device_grad_accumulation.
  EXPECT_TRUE(parse_config(json, {"zero_optimization.offload_optimizer.device=nvme", "model.activation_checkpointing=true",
                                  "zero_optimization.offload_optimizer.layer_major=true",
                                  "zero_optimization.offload_optimizer.gradient_streaming=true"})
                  .zero.offload_optimizer.gradient_streaming);
}

}  // namespace
}  // namespace zinf
