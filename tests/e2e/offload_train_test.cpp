// offload_train_test.cpp — `train()` with the offload engine: the numerics contract (every placement,
// overlap mode and thread count gives the same params_digest), gradient accumulation with offload
// equals the run without it, and a model whose training state is over 4× the device budget trains
// within the budget and the pinned pool.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "app/config/config.h"
#include "app/train/train.h"
#include "model/shape.h"
#include "small_train.h"

namespace zinf {
namespace {

namespace fs = std::filesystem;

const std::string kSwap = (fs::temp_directory_path() / ("zinf-offload-train-" + std::to_string(::getpid()))).string();

std::string digest(const std::vector<std::string>& overrides) { return test::small_train_digest(kSwap, overrides); }

class OffloadTrain : public ::testing::Test {
 protected:
  void SetUp() override { fs::create_directories(kSwap); }
  void TearDown() override {
    EXPECT_TRUE(fs::is_empty(kSwap));  // no swap directory outlives its run
    fs::remove_all(kSwap);
  }
};

TEST_F(OffloadTrain, EveryPlacementGivesTheSameDigest) {
  const std::string ref = digest({});  // everything on the device
  for (const char* opt : {"none", "cpu", "nvme"})
    for (const char* param : {"none", "cpu", "nvme"}) {
      SCOPED_TRACE(std::string("optimizer ") + opt + " param " + param);
      EXPECT_EQ(digest({std::string("zero_optimization.offload_optimizer.device=") + opt,
                        std::string("zero_optimization.offload_param.device=") + param}),
                ref);
    }
}

// zero_optimization.optimizer_states through train(): in each compressed format every placement (and
// the other overlap mode) gives one digest, and it is not the fp32 digest, nor the other format's.
TEST_F(OffloadTrain, EachStateFormatGivesOneDigestOverEveryPlacement) {
  std::vector<std::string> refs = {digest({})};
  for (const char* states : {"bf16", "8bit"}) {
    const std::string mode = std::string("zero_optimization.optimizer_states=") + states;
    refs.push_back(digest({mode}));
    for (const char* opt : {"none", "cpu", "nvme"})
      for (const char* param : {"none", "cpu", "nvme"}) {
        SCOPED_TRACE(std::string(states) + " optimizer " + opt + " param " + param);
        EXPECT_EQ(digest({mode, std::string("zero_optimization.offload_optimizer.device=") + opt,
                          std::string("zero_optimization.offload_param.device=") + param}),
                  refs.back());
      }
    EXPECT_EQ(digest({mode, "zero_optimization.offload_optimizer.device=nvme", "train.overlap=none"}), refs.back());
  }
  EXPECT_NE(refs[1], refs[0]);
  EXPECT_NE(refs[2], refs[0]);
  EXPECT_NE(refs[2], refs[1]);
}

TEST_F(OffloadTrain, OverlapModesThreadsAndCheckpointingGiveTheSameDigest) {
  const std::vector<std::string> nvme = {"zero_optimization.offload_optimizer.device=nvme",
                                         "zero_optimization.offload_param.device=cpu"};
  const std::string ref = digest(nvme);
  auto with = [&](const char* o) {
    auto v = nvme;
    v.push_back(o);
    return v;
  };
  EXPECT_EQ(digest(with("train.overlap=none")), ref);
  EXPECT_EQ(digest(with("device.threads=2")), ref);
  EXPECT_EQ(digest(with("model.activation_checkpointing=true")), ref);
}

TEST_F(OffloadTrain, GradientAccumulationWithOffloadMatchesNoOffloadForBf16AndFp32) {
  for (const char* prec : {"fp16.enabled=false", "bf16.enabled=true"}) {
    SCOPED_TRACE(prec);
    std::vector<std::string> base = {"fp16.enabled=false", prec, "gradient_accumulation_steps=3"};
    const std::string ref = digest(base);
    base.push_back("zero_optimization.offload_optimizer.device=cpu");
    EXPECT_EQ(digest(base), ref);
    base.push_back("zero_optimization.offload_optimizer.device_grad_accumulation=true");  // summed on the device
    EXPECT_EQ(digest(base), ref);
    base.pop_back();
    base.back() = "zero_optimization.offload_optimizer.device=nvme";
    base.push_back("zero_optimization.offload_param.device=nvme");
    EXPECT_EQ(digest(base), ref);
    base.push_back("zero_optimization.offload_optimizer.device_grad_accumulation=true");
    EXPECT_EQ(digest(base), ref);
  }
}

TEST_F(OffloadTrain, StateFourTimesTheDeviceBudgetTrainsWithinIt) {
  // 16 blocks of width 128: 3.2M parameters, 51 MB of fp32 training state (param, grad, m, v), on a
  // 12 MiB device: the device holds the embedding, the final LayerNorm, two block windows, two
  // gradient windows and the (checkpointed) activations.
  const std::string cfg = R"({"model": {"n_layer": 16, "n_head": 4, "d_model": 128, "vocab_size": 256, "seq_len": 32,
                                        "activation_checkpointing": true},
      "train": {"steps": 3, "eval_interval": 0, "eval_batches": 1},
      "device": {"type": "cpu", "memory_budget": "12MiB", "threads": 2},
      "train_micro_batch_size_per_gpu": 2,
      "zero_optimization": {"stage": 3, "sub_group_size": 200000,
        "offload_optimizer": {"device": "nvme", "nvme_path": ")" +
                          kSwap + R"(", "buffer_count": 3}, "offload_param": {"device": "cpu"}}})";
  const Config c = parse_config(cfg);
  const ModelShape s = model_shape(c.model);
  const std::uint64_t state = static_cast<std::uint64_t>(count_params(s)) * 16;
  ASSERT_GE(state, 4 * c.device.memory_budget);
  TrainResult r = train(c, TrainHooks{});
  EXPECT_EQ(r.steps, 3);
  EXPECT_LE(r.peak_device_bytes, r.device_budget);
  EXPECT_GT(r.pinned_capacity, 0u);
  EXPECT_LE(r.pinned_peak, r.pinned_capacity);
  EXPECT_LT(r.val_loss, r.first_val_loss);
  // The same model without offload does not fit that budget at all.
  EXPECT_ANY_THROW(train(parse_config(cfg, {"zero_optimization.offload_optimizer.device=none",
                                            "zero_optimization.offload_param.device=none"}),
                         TrainHooks{}));
}

// The llama family through the same engine: every placement gives one digest (untied head, grouped
// key/value heads, q/k/v biases), with activation checkpointing too.
TEST_F(OffloadTrain, LlamaEveryPlacementGivesTheSameDigest) {
  const std::vector<std::string> llama = {"model.family=llama", "model.n_kv_head=1", "model.d_ff=48",
                                          "model.tie_embeddings=false", "model.qkv_bias=true"};
  auto with = [&](std::vector<std::string> extra) {
    auto v = llama;
    v.insert(v.end(), extra.begin(), extra.end());
    return v;
  };
  const std::string ref = digest(llama);
  EXPECT_NE(ref, digest({}));  // a different model than GPT-2
  for (const char* opt : {"none", "cpu", "nvme"})
    for (const char* param : {"none", "cpu", "nvme"}) {
      SCOPED_TRACE(std::string("optimizer ") + opt + " param " + param);
      EXPECT_EQ(digest(with({std::string("zero_optimization.offload_optimizer.device=") + opt,
                             std::string("zero_optimization.offload_param.device=") + param})),
                ref);
    }
  EXPECT_EQ(digest(with({"model.activation_checkpointing=true", "zero_optimization.offload_optimizer.device=cpu"})),
            ref);
  EXPECT_EQ(digest(with({"device.threads=2", "train.overlap=none"})), ref);
}

}  // namespace
}  // namespace zinf
