// train_streaming_test.cpp — gradient streaming (offload_optimizer.gradient_streaming) through `train()`:
// the host holds no whole gradient; each unit's gradient goes through the pinned ring to the
// speculative Update and to NVMe, from where a clipped step's redo and the sub-groups speculation did
// not reach read it back. Every step's loss, loss scale and norm and the trained parameters must equal
// the run without streaming (same config, synchronous device) bit for bit, on the jittered
// asynchronous CPU device: GA 1 (the 16-bit gradient) and GA 4 (the fp32 sum made on the device with
// device_grad_accumulation), steps that never clip, sometimes clip and always clip, overflowing fp16
// steps, parameters on the device and on NVMe, 8-bit optimizer states. Each placement streaming cannot
// serve is refused by the config reader with one line naming the key. (Several ranks: dp_test.)
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

const fs::path kDir = fs::temp_directory_path() / ("zinf-train-stream-" + std::to_string(::getpid()));

int seeds() {
  const char* v = std::getenv("ZINF_ASYNC_SEEDS");
  return v && *v ? std::max(1, std::atoi(v)) : 2;
}

struct Run {
  std::string digest;
  std::vector<std::string> steps;  // each step's loss, loss scale, norm and skip, from the metrics file
  std::int64_t rollbacks = 0, skipped = 0;
};

Run run(std::vector<std::string> overrides) {
  const fs::path swap = kDir / "swap", metrics = kDir / "metrics.jsonl";
  fs::create_directories(swap);
  fs::remove(metrics);
  overrides.push_back("train.metrics_file=" + metrics.string());
  overrides.push_back("train.steps=5");
  const TrainResult r = train(parse_config(test::small_train_config(swap.string()), overrides), TrainHooks{});
  Run out{r.params_digest, test::metrics_steps(metrics.string()).steps, r.rollbacks, r.skipped};
  EXPECT_TRUE(fs::is_empty(swap));  // the gradient store's folder is removed with the optimizer's
  return out;
}

// `overrides` streamed on the jittered async device (seeds first, first+1, …) against the same config
// without streaming (and without speculation) on the synchronous device. Returns the streamed runs'
// rollbacks and skipped steps, summed.
std::pair<std::int64_t, std::int64_t> expect_streaming_exact(const std::vector<std::string>& overrides,
                                                             std::uint64_t first) {
  auto base = overrides;
  base.push_back("zero_optimization.offload_optimizer.gradient_streaming=false");
  const Run ref = run(base);
  EXPECT_FALSE(ref.steps.empty());
  std::int64_t rollbacks = 0, skipped = 0;
  for (int k = 0; k < seeds(); ++k) {
    const std::uint64_t seed = first + static_cast<std::uint64_t>(k);
    auto o = overrides;
    o.push_back("zero_optimization.offload_optimizer.gradient_streaming=true");
    o.push_back("device.async=true");
    o.push_back("device.jitter_seed=" + std::to_string(seed));
    o.push_back("device.jitter_us=100");
    const Run got = run(o);
    EXPECT_EQ(got.digest, ref.digest) << "jitter seed " << seed;
    EXPECT_EQ(got.steps, ref.steps) << "jitter seed " << seed;
    EXPECT_EQ(got.skipped, ref.skipped) << "jitter seed " << seed;
    rollbacks += got.rollbacks, skipped += got.skipped;
  }
  return {rollbacks, skipped};
}

class TrainStreaming : public ::testing::Test {
 protected:
  void SetUp() override { fs::create_directories(kDir); }
  void TearDown() override { fs::remove_all(kDir); }
};

std::vector<std::string> placement(const char* param, std::int64_t ga) {
  std::vector<std::string> o = {"zero_optimization.offload_optimizer.device=nvme",
                                std::string("zero_optimization.offload_param.device=") + param,
                                "gradient_accumulation_steps=" + std::to_string(ga)};
  if (ga > 1) o.push_back("zero_optimization.offload_optimizer.device_grad_accumulation=true");
  return o;
}

// The small model's global norm is between 0.3 and 3 over its first steps (fp16 scale 2^12): a clip
// of 1e9 never clips (everything kept from the speculation, the gradient read from the ring), 0.6
// clips some steps (those redo every sub-group with gradients read back from NVMe: rollbacks), 0.05
// clips every step from the first units on (speculation stops at once: everything read back).
TEST_F(TrainStreaming, ClippedAndUnclippedStepsEqualTheRunWithoutStreamingAtGa1AndGa4) {
  std::uint64_t seed = 801;
  for (std::int64_t ga : {1, 4})
    for (const char* param : {"none", "nvme"}) {
      std::int64_t rollbacks = 0;
      for (const char* clip : {"1e9", "0.6", "0.05"}) {
        SCOPED_TRACE("GA " + std::to_string(ga) + " param " + param + " clip " + clip);
        auto o = placement(param, ga);
        o.push_back(std::string("gradient_clipping=") + clip);
        rollbacks += expect_streaming_exact(o, seed).first;
        seed += 10;
      }
      EXPECT_GT(rollbacks, 0) << "GA " << ga << " param " << param << ": no step redone with its gradient read back";
    }
}

// Overflowing fp16 steps (a loss scale of 2^20 overflows until it is lowered to 2^17) are skipped and
// the scale lowered exactly as without streaming; the units speculation updated are restored.
TEST_F(TrainStreaming, OverflowingStepsEqualTheRunWithoutStreamingAtGa1AndGa4) {
  std::uint64_t seed = 901;
  for (std::int64_t ga : {1, 4}) {
    SCOPED_TRACE("GA " + std::to_string(ga));
    auto o = placement("none", ga);
    for (const char* x : {"fp16.initial_scale_power=20", "fp16.hysteresis=1", "gradient_clipping=0"}) o.push_back(x);
    const auto [rollbacks, skipped] = expect_streaming_exact(o, seed);
    EXPECT_GT(skipped, 0) << "the config does overflow";
    EXPECT_GT(rollbacks, 0) << "speculation ran ahead of an overflow";
    seed += 10;
  }
}

// Without the speculative Update (`speculative: false`): every step's gradient is read back from NVMe.
TEST_F(TrainStreaming, WithoutSpeculationEqualsTheRunWithoutStreaming) {
  std::uint64_t seed = 971;
  for (std::int64_t ga : {1, 4}) {
    SCOPED_TRACE("GA " + std::to_string(ga));
    auto o = placement("nvme", ga);
    for (const char* x : {"zero_optimization.offload_optimizer.speculative=false", "gradient_clipping=0.6"})
      o.push_back(x);
    EXPECT_EQ(expect_streaming_exact(o, seed).first, 0);  // nothing to roll back
    seed += 10;
  }
}

// bf16 with 8-bit optimizer states, clipping some steps.
TEST_F(TrainStreaming, Bf16With8BitStatesEqualsTheRunWithoutStreaming) {
  auto o = placement("nvme", 1);
  for (const char* x : {"bf16.enabled=true", "fp16.enabled=false", "zero_optimization.optimizer_states=8bit",
                        "gradient_clipping=0.6"})
    o.push_back(x);
  expect_streaming_exact(o, 951);
}

// One line naming the key for every placement streaming cannot serve.
TEST(TrainStreamingConfig, EachUnsupportedPlacementIsRefusedWithOneLine) {
  const std::string json = test::small_train_config("/tmp");
  auto refused = [&](std::vector<std::string> o, const std::string& why, int world = 1) {
    o.push_back("zero_optimization.offload_optimizer.gradient_streaming=true");
    try {
      parse_config(json, o, "<string>", world);
      ADD_FAILURE() << "accepted: " << why;
    } catch (const ConfigError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("zero_optimization.offload_optimizer.gradient_streaming"), std::string::npos) << m;
      EXPECT_NE(m.find(why), std::string::npos) << m;
      EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    }
  };
  refused({"zero_optimization.offload_optimizer.device=none"}, "needs offload_optimizer.device nvme (it is none)");
  refused({"zero_optimization.offload_optimizer.device=cpu"}, "needs offload_optimizer.device nvme (it is cpu)");
  refused({"zero_optimization.offload_optimizer.device=nvme", "train.overlap=none",
           "zero_optimization.offload_optimizer.device_grad_accumulation=true"},
          "needs train.overlap \"exact\"");
  refused({"zero_optimization.offload_optimizer.device=nvme", "gradient_accumulation_steps=2"},
          "needs offload_optimizer.layer_major true (each unit's micro batches one after another) or "
          "device_grad_accumulation true");
  // Several ranks with GA > 1: the layer-major order only (device_grad_accumulation takes one rank).
  refused({"zero_optimization.offload_optimizer.device=nvme", "gradient_accumulation_steps=2", "train_batch_size=8"},
          "with several ranks (this job has 2) and gradient_accumulation_steps 2 needs offload_optimizer.layer_major true",
          2);
  // Accepted where it applies, and off by default.
  const Config on = parse_config(json, {"zero_optimization.offload_optimizer.device=nvme",
                                        "zero_optimization.offload_optimizer.device_grad_accumulation=true",
                                        "zero_optimization.offload_optimizer.gradient_streaming=true"});
  EXPECT_TRUE(on.zero.offload_optimizer.gradient_streaming);
  EXPECT_TRUE(parse_config(json,
                           {"zero_optimization.offload_optimizer.device=nvme", "gradient_accumulation_steps=1",
                            "train_batch_size=4", "zero_optimization.offload_optimizer.gradient_streaming=true"},
                           "<string>", 2)
                  .zero.offload_optimizer.gradient_streaming);  // two ranks at GA 1
  EXPECT_TRUE(on.zero.offload_optimizer.speculative);  // implied ...
  EXPECT_FALSE(parse_config(json, {"zero_optimization.offload_optimizer.device=nvme",
                                   "zero_optimization.offload_optimizer.device_grad_accumulation=true",
                                   "zero_optimization.offload_optimizer.gradient_streaming=true",
                                   "zero_optimization.offload_optimizer.speculative=false"})
                   .zero.offload_optimizer.speculative);  // ... unless turned off
  EXPECT_FALSE(parse_config(json, {"zero_optimization.offload_optimizer.device=nvme"})
                   .zero.offload_optimizer.gradient_streaming);
}

}  // namespace
}  // namespace zinf
