// config_test.cpp — the ds_config.json reader: DeepSpeed's shapes load, every error class names its
// JSON path, the batch-size rule matches DeepSpeed's, overrides and "auto" resolve, defaults hold.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "app/config/config.h"
#include "zinf/error.h"

namespace zinf {
namespace {

// Parses and returns the error message; fails the test if parsing succeeds.
std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse_config(text, overrides, "cfg.json");
  } catch (const ConfigError& e) {
    return std::string(e.what()) + (e.hint().empty() ? "" : " ---> HINT: " + e.hint());
  }
  ADD_FAILURE() << "expected a ConfigError for: " << text;
  return {};
}

// Expects `text` to be refused with a message that contains `expected`.
void expect_error(const std::string& text, const std::string& expected) {
  const std::string e = error_of(text);
  EXPECT_NE(e.find(expected), std::string::npos) << e << "\nfor: " << text;
}

Config ok(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return parse_config(text, overrides, "cfg.json");
}

const char* kMinimal = R"({"train_micro_batch_size_per_gpu": 4})";

// ---- defaults (one source of truth) ---------------------------------------------------------------

TEST(Config, MinimalConfigTakesDeepSpeedDefaults) {
  Config c = ok(kMinimal);
  EXPECT_EQ(c.train_batch_size, 4);
  EXPECT_EQ(c.micro_batch_size, 4);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.optimizer.type, OptimizerType::adamw);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 1e-3);
  EXPECT_DOUBLE_EQ(c.optimizer.beta1, 0.9);
  EXPECT_DOUBLE_EQ(c.optimizer.beta2, 0.999);
  EXPECT_DOUBLE_EQ(c.optimizer.eps, 1e-8);
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 0.0);
  EXPECT_TRUE(c.optimizer.bias_correction);
  EXPECT_DOUBLE_EQ(c.gradient_clipping, 1.0);
  EXPECT_EQ(c.steps_per_print, 10);
  EXPECT_EQ(c.zero.stage, 0);
  EXPECT_EQ(c.zero.offload_optimizer.device, OffloadDevice::none);
  EXPECT_EQ(c.zero.offload_optimizer.buffer_count, 4);
  EXPECT_TRUE(c.zero.offload_optimizer.pin_memory);
  EXPECT_EQ(c.zero.offload_param.buffer_count, 5);
  EXPECT_EQ(c.zero.offload_param.buffer_size, 100'000'000);
  EXPECT_EQ(c.zero.sub_group_size, 1'000'000'000);
  EXPECT_EQ(c.zero.reduce_bucket_size, 500'000'000);
  EXPECT_EQ(c.zero.prefetch_bucket_size, 50'000'000);
  EXPECT_EQ(c.zero.param_persistence_threshold, 100'000);
  EXPECT_FALSE(c.zero.overlap_comm);
  EXPECT_EQ(c.aio.block_size, 1'048'576);
  EXPECT_EQ(c.aio.queue_depth, 8);
  EXPECT_EQ(c.aio.intra_op_parallelism, 1);
  EXPECT_TRUE(c.aio.overlap_events);
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_EQ(c.fp16.initial_scale_power, 16);
  EXPECT_EQ(c.fp16.loss_scale_window, 1000);
  EXPECT_EQ(c.fp16.hysteresis, 2);
  EXPECT_DOUBLE_EQ(c.fp16.min_loss_scale, 1.0);
  EXPECT_EQ(c.precision(), Precision::fp32);
  EXPECT_EQ(c.scheduler.type, SchedulerType::none);
  EXPECT_EQ(c.model.preset, "gpt2-124m");
  EXPECT_EQ(c.model.n_layer, 12);
  ASSERT_EQ(c.notes.size(), 1u);  // no model section: the default model is named
  EXPECT_NE(c.notes[0].find("no model section; training zinf's default model, gpt2-124m"), std::string::npos)
      << c.notes[0];
  EXPECT_TRUE(ok(R"({"train_batch_size": 8, "model": {"preset": "gpt2-124m"}})").notes.empty());
}

TEST(Config, OverlapCommDefaultsTrueOnlyForStage3) {
  EXPECT_FALSE(ok(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2}})").zero.overlap_comm);
  EXPECT_TRUE(ok(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3}})").zero.overlap_comm);
}

TEST(Config, ResolvedJsonRoundTripsToTheSameConfig) {
  Config a = ok(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 8,
                    "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}},
                    "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"},
                                          "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"}},
                    "device": {"memory_budget": "1GiB"}})");
  auto j = nlohmann::json::parse(a.resolved_json);
  EXPECT_EQ(j["aio"]["queue_depth"], 8);
  EXPECT_EQ(j["gradient_accumulation_steps"], 4);
  EXPECT_EQ(j["zero_optimization"]["offload_optimizer"]["buffer_count"], 4);
  Config b = ok(a.resolved_json);
  EXPECT_EQ(a.resolved_json, b.resolved_json);
  EXPECT_EQ(b.device.memory_budget, 1ull << 30);
}

// ---- DeepSpeed documentation shapes, written here ----------------------------------------------------

TEST(Config, ZeroOffloadTutorialShapeLoads) {
  Config c = ok(R"({
    "train_batch_size": 64, "gradient_accumulation_steps": 2,
    "optimizer": {"type": "Adam", "params": {"lr": 0.00015, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.01}},
    "fp16": {"enabled": true, "loss_scale": 0, "loss_scale_window": 1000, "hysteresis": 2, "min_loss_scale": 1},
    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}, "contiguous_gradients": true,
                          "overlap_comm": true, "allgather_partitions": true, "allgather_bucket_size": 5e8,
                          "reduce_scatter": true, "reduce_bucket_size": 5e8}})");
  EXPECT_EQ(c.micro_batch_size, 32);
  EXPECT_EQ(c.precision(), Precision::fp16);
  EXPECT_EQ(c.zero.offload_optimizer.device, OffloadDevice::cpu);
  EXPECT_DOUBLE_EQ(c.optimizer.beta2, 0.95);
  EXPECT_EQ(c.notes.size(), 4u);  // allgather_partitions, allgather_bucket_size, reduce_scatter; the default model
}

TEST(Config, ZeroInfinityShapeWithAioLoads) {
  Config c = ok(R"({
    "train_micro_batch_size_per_gpu": 1,
    "zero_optimization": {"stage": 3,
      "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme", "pin_memory": true,
                            "buffer_count": 4, "fast_init": false},
      "offload_param": {"device": "nvme", "nvme_path": "/local_nvme", "pin_memory": true,
                        "buffer_count": 5, "buffer_size": 1e8, "max_in_cpu": 1e9},
      "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
      "stage3_prefetch_bucket_size": 5e8, "stage3_param_persistence_threshold": 1e6,
      "sub_group_size": 1e12, "stage3_gather_16bit_weights_on_model_save": true},
    "aio": {"block_size": 1048576, "queue_depth": 8, "thread_count": 1, "single_submit": false,
            "overlap_events": true}})");
  EXPECT_EQ(c.zero.offload_param.device, OffloadDevice::nvme);
  EXPECT_EQ(c.zero.offload_optimizer.nvme_path, "/local_nvme");
  EXPECT_EQ(c.zero.sub_group_size, 1'000'000'000'000);
  EXPECT_EQ(c.zero.prefetch_bucket_size, 500'000'000);
  EXPECT_EQ(c.aio.intra_op_parallelism, 1);
}

TEST(Config, HuggingFaceAutoConfigResolves) {
  Config c = ok(R"({
    "model": {"n_layer": 2, "n_head": 2, "d_model": 64, "vocab_size": 256, "seq_len": 32},
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3,
    "optimizer": {"type": "AdamW", "params": {"lr": 5e-4}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": 5}},
    "zero_optimization": {"stage": 3, "overlap_comm": "auto", "reduce_bucket_size": "auto",
                          "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto"}})");
  EXPECT_EQ(c.train_batch_size, 6);
  EXPECT_DOUBLE_EQ(c.scheduler.warmup_min_lr, 0.0);
  EXPECT_DOUBLE_EQ(c.scheduler.warmup_max_lr, 5e-4);
  EXPECT_EQ(c.zero.reduce_bucket_size, 64 * 64);
  EXPECT_EQ(c.zero.prefetch_bucket_size, 9 * 64 * 64 / 10);
  EXPECT_EQ(c.zero.param_persistence_threshold, 640);
  EXPECT_TRUE(c.zero.overlap_comm);
}

TEST(Config, AutoThatCannotBeResolvedIsRejectedWithReason) {
  std::string e = error_of(R"({"train_batch_size": 8, "optimizer": {"params": {"lr": "auto"}}})");
  EXPECT_NE(e.find("1 key is \"auto\", which the Hugging Face Trainer fills"), std::string::npos) << e;
  EXPECT_NE(e.find("--set optimizer.params.lr=0.001"), std::string::npos) << e;
  e = error_of(R"({"train_batch_size": 8, "fp16": {"enabled": "auto"}})");
  EXPECT_NE(e.find("--set fp16.enabled=false"), std::string::npos) << e;
}

// A Hugging Face Trainer config: every "auto" zinf cannot fill is named in one error, with a --set
// line for each, and pasting those lines makes it load.
TEST(Config, EveryUnresolvedAutoIsReportedAtOnceWithLinesToPaste) {
  const std::string hf = R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto"}},
    "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"}, "model": {"preset": "gpt2-124m"}})";
  const std::string e = error_of(hf);
  EXPECT_EQ(e.find("Either train_batch_size"), std::string::npos) << e;  // not the misleading batch message
  for (const char* key :
       {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping",
        "optimizer.params.lr", "optimizer.params.betas", "optimizer.params.eps", "optimizer.params.weight_decay",
        "scheduler.params.warmup_num_steps", "fp16.enabled", "bf16.enabled"})
    EXPECT_NE(e.find(std::string("--set ") + key + "="), std::string::npos) << key << ": " << e;
  EXPECT_EQ(e.find("warmup_min_lr="), std::string::npos) << e;  // resolved: 0
  std::vector<std::string> sets;
  for (std::size_t p = e.find("--set "); p != std::string::npos; p = e.find("--set ", p + 1)) {
    const std::size_t b = p + 6, end = e.find(" --set ", b);
    sets.push_back(e.substr(b, end == std::string::npos ? std::string::npos : end - b));
  }
  const Config c = ok(hf, sets);
  EXPECT_EQ(c.micro_batch_size, 1);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 1e-3);
}

TEST(Config, DuplicateKeysAreRejectedWithTheirPath) {
  std::string e = error_of(R"({"train_batch_size": 8, "train_batch_size": 16})");
  EXPECT_NE(e.find("cfg.json: train_batch_size: the key appears twice"), std::string::npos) << e;
  e = error_of(
      R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "device": "nvme"}}})");
  EXPECT_NE(e.find("zero_optimization.offload_optimizer.device: the key appears twice"), std::string::npos) << e;
  // The same key in two different objects is fine.
  ok(R"({"train_batch_size": 8, "fp16": {"enabled": false}, "bf16": {"enabled": false}})");
}

TEST(Config, NonPositiveBatchValuesGetTheirOwnError) {
  for (const char* v : {"0", "-4"}) {
    std::string e = error_of(std::string(R"({"train_micro_batch_size_per_gpu": )") + v + "}");
    EXPECT_NE(e.find(std::string("train_micro_batch_size_per_gpu: must be a positive integer, got ") + v),
              std::string::npos)
        << e;
  }
  std::string e = error_of(R"({"train_batch_size": 8, "gradient_accumulation_steps": 0})");
  EXPECT_NE(e.find("gradient_accumulation_steps: must be a positive integer, got 0"), std::string::npos) << e;
}

TEST(Config, DeviceKernelsDefaultsToTheReferenceAndRefusesOtherWords) {
  EXPECT_EQ(ok(kMinimal).device.kernels, Kernels::reference);
  EXPECT_EQ(ok(kMinimal, {"device.kernels=fast"}).device.kernels, Kernels::fast);
  const std::string e = error_of(R"({"train_batch_size": 8, "device": {"kernels": "wrong"}})");
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;  // one line
  EXPECT_NE(e.find("cfg.json: device.kernels: 'wrong' is not one of reference, fast"), std::string::npos) << e;
}

TEST(Config, DeviceAttentionBelongsToItsKernelSet) {
  EXPECT_EQ(ok(kMinimal).device.attention, Attention::automatic);
  EXPECT_EQ(ok(kMinimal, {"device.kernels=fast", "device.attention=cudnn"}).device.attention, Attention::cudnn);
  EXPECT_EQ(ok(kMinimal, {"device.kernels=fast", "device.attention=wmma"}).device.attention, Attention::wmma);
  EXPECT_EQ(ok(kMinimal, {"device.attention=reference"}).device.attention, Attention::reference);
  std::string e = error_of(R"({"train_batch_size": 8, "device": {"kernels": "fast", "attention": "flash"}})");
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;  // one line
  EXPECT_NE(e.find("device.attention: 'flash' is not one of auto, cudnn, wmma, reference"), std::string::npos) << e;
  e = error_of(R"({"train_batch_size": 8, "device": {"attention": "cudnn"}})");  // reference kernels
  EXPECT_NE(e.find("device.attention: cudnn is an attention of the fast kernels"), std::string::npos) << e;
  e = error_of(R"({"train_batch_size": 8, "device": {"kernels": "fast", "attention": "reference"}})");
  EXPECT_NE(e.find("device.attention: reference is the reference kernels' attention"), std::string::npos) << e;
  e = error_of(R"({"train_batch_size": 8, "device": {"type": "cpu", "kernels": "fast", "attention": "wmma"}})");
  EXPECT_NE(e.find("device.attention: wmma runs on the CUDA device only"), std::string::npos) << e;
  // What auto means (zinf/types.h): the kernel set's own attention, cuDNN's under fast where built.
  EXPECT_EQ(resolve_attention(Attention::automatic, Kernels::fast, true), Attention::cudnn);
  EXPECT_EQ(resolve_attention(Attention::automatic, Kernels::fast, false), Attention::wmma);
  EXPECT_EQ(resolve_attention(Attention::automatic, Kernels::reference, true), Attention::reference);
  EXPECT_EQ(resolve_attention(Attention::wmma, Kernels::fast, true), Attention::wmma);
}

TEST(Config, RangesPrintIntegersAsWritten) {
  std::string e = error_of(R"({"train_batch_size": 8, "device": {"jitter_us": 2000000}})");
  EXPECT_NE(e.find("value 2000000 is out of range; expected a value in [1, 1000000]"), std::string::npos) << e;
}

TEST(Config, ADirectoryIsNotAConfigFile) {
  try {
    load_config(std::filesystem::temp_directory_path().string());
    FAIL();
  } catch (const ConfigError& err) {
    EXPECT_NE(std::string(err.what()).find("is a directory, not a config file"), std::string::npos) << err.what();
  }
}

// ---- the batch-size rule (DeepSpeed's _set_batch_related_parameters) -------------------------------

struct BatchCase {
  const char* json;
  std::int64_t train, micro, ga;
};
class BatchRule : public ::testing::TestWithParam<BatchCase> {};
TEST_P(BatchRule, InfersTheMissingValue) {
  Config c = ok(GetParam().json);
  EXPECT_EQ(c.train_batch_size, GetParam().train);
  EXPECT_EQ(c.micro_batch_size, GetParam().micro);
  EXPECT_EQ(c.gradient_accumulation_steps, GetParam().ga);
}
INSTANTIATE_TEST_SUITE_P(
    DeepSpeed, BatchRule,
    ::testing::Values(
        BatchCase{R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 8})", 32, 8, 4},
        BatchCase{R"({"train_batch_size": 32, "gradient_accumulation_steps": 4})", 32, 8, 4},
        BatchCase{R"({"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 4})", 32, 8, 4},
        BatchCase{R"({"train_batch_size": 32})", 32, 32, 1},
        BatchCase{R"({"train_micro_batch_size_per_gpu": 8})", 8, 8, 1},
        BatchCase{R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 4})",
                  32, 8, 4},
        BatchCase{R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 8,
                      "gradient_accumulation_steps": "auto"})",
                  8, 8, 1}));

TEST(Config, BatchRuleErrorsUseDeepSpeedsWording) {
  EXPECT_NE(error_of(R"({})").find("Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided"),
            std::string::npos);
  std::string e = error_of(R"({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4})");
  EXPECT_NE(e.find("Check batch related parameters. train_batch_size is not equal to micro_batch_per_gpu * "
                   "gradient_acc_step * world_size 10 != 4 * 2 * 1"),
            std::string::npos)
      << e;
  e = error_of(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 3})");
  EXPECT_NE(e.find("32 != 8 * 3 * 1"), std::string::npos) << e;
  e = error_of(R"({"train_batch_size": 2, "train_micro_batch_size_per_gpu": 4})");
  EXPECT_NE(e.find("Gradient accumulation steps: 0 has to be greater than 0"), std::string::npos) << e;
}

// ---- unknown keys, types, ranges -------------------------------------------------------------------

TEST(Config, UnknownNestedKeyNamesPathAndNearestKey) {
  std::string e = error_of(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "offload_optimzer": {}}})");
  EXPECT_EQ(e, "cfg.json: zero_optimization.offload_optimzer: unknown key (did you mean offload_optimizer?)");
}

// zinf's optimizer_states: fp32 by default (and in the resolved config), the three words accepted,
// another word one error naming the key, the words and the nearest one.
TEST(Config, OptimizerStatesTakesThreeWordsAndSuggestsTheNearest) {
  Config c = ok(kMinimal);
  EXPECT_EQ(c.zero.optimizer_states, cpu_adam::StateFormat::fp32);
  EXPECT_EQ(nlohmann::json::parse(c.resolved_json)["zero_optimization"]["optimizer_states"], "fp32");
  for (auto [word, f] : {std::pair{"fp32", cpu_adam::StateFormat::fp32}, std::pair{"bf16", cpu_adam::StateFormat::bf16},
                         std::pair{"8bit", cpu_adam::StateFormat::q8}}) {
    c = ok(kMinimal, {std::string("zero_optimization.optimizer_states=") + word});
    EXPECT_EQ(c.zero.optimizer_states, f) << word;
    EXPECT_EQ(nlohmann::json::parse(c.resolved_json)["zero_optimization"]["optimizer_states"], word);
    EXPECT_EQ(ok(c.resolved_json).zero.optimizer_states, f) << word;  // the resolved config reads back
  }
  const std::string e =
      error_of(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "optimizer_states": "8-bit"}})");
  EXPECT_EQ(e, "cfg.json: zero_optimization.optimizer_states: '8-bit' is not one of fp32, bf16, 8bit (did you mean 8bit?)");
}

// zinf's offload_optimizer.speculative: off by default; auto is on with the optimizer off the device
// and overlap exact, off otherwise; true where it cannot apply is one error naming the key and why.
TEST(Config, SpeculativeUpdateIsOptInAndRefusedWhereItCannotApply) {
  const std::string cpu = R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}})";
  EXPECT_FALSE(ok(cpu).zero.offload_optimizer.speculative);
  const std::string autos = "zero_optimization.offload_optimizer.speculative=\"auto\"";
  EXPECT_TRUE(ok(cpu, {autos}).zero.offload_optimizer.speculative);
  EXPECT_FALSE(ok(cpu, {"train.overlap=none", autos}).zero.offload_optimizer.speculative);
  EXPECT_FALSE(ok(cpu, {"zero_optimization.offload_optimizer.speculative=false"}).zero.offload_optimizer.speculative);
  EXPECT_FALSE(ok(kMinimal).zero.offload_optimizer.speculative);
  EXPECT_EQ(ok(cpu, {"zero_optimization.offload_optimizer.speculative_backup_size=1000"})
                .zero.offload_optimizer.speculative_backup_size,
            1000);
  EXPECT_EQ(error_of(kMinimal, {"zero_optimization.stage=2", "zero_optimization.offload_optimizer.speculative=true"}),
            "cfg.json: zero_optimization.offload_optimizer.speculative: the speculative Update needs the optimizer "
            "off the device (device cpu or nvme)");
  EXPECT_NE(error_of(cpu, {"train.overlap=none", "zero_optimization.offload_optimizer.speculative=true"})
                .find("needs train.overlap \"exact\""),
            std::string::npos);
  EXPECT_NE(error_of(cpu, {"zero_optimization.offload_optimizer.speculative=1"}).find("expected true or false"),
            std::string::npos);
}

TEST(Config, UnknownTopLevelKeySuggests) {
  std::string e = error_of(R"({"train_batch_size": 8, "gradient_clippin": 1.0})");
  EXPECT_EQ(e, "cfg.json: gradient_clippin: unknown key (did you mean gradient_clipping?)");
}

TEST(Config, UnknownKeyFarFromAnyGivesNoSuggestion) {
  std::string e = error_of(R"({"train_batch_size": 8, "aio": {"zzzzzzzzzzzz": 1}})");
  EXPECT_EQ(e, "cfg.json: aio.zzzzzzzzzzzz: unknown key");
}

TEST(Config, UnknownKeyInsideOptimizerParams) {
  std::string e =
      error_of(R"({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"weight_dacay": 0.1}}})");
  EXPECT_NE(e.find("optimizer.params.weight_dacay: unknown key (did you mean weight_decay?)"), std::string::npos) << e;
}

TEST(Config, WrongTypeNamesPathValueAndExpectation) {
  std::string e = error_of(R"({"train_batch_size": 8, "zero_optimization": {"stage": "three"}})");
  EXPECT_EQ(e, "cfg.json: zero_optimization.stage: expected an integer, got \"three\"");
  e = error_of(R"({"train_batch_size": 8, "fp16": {"enabled": 1}})");
  EXPECT_EQ(e, "cfg.json: fp16.enabled: expected true or false, got 1");
  e = error_of(R"({"train_batch_size": 8, "zero_optimization": []})");
  EXPECT_EQ(e, "cfg.json: zero_optimization: expected an object, got []");
}

TEST(Config, OutOfRangeValueNamesTheRange) {
  std::string e = error_of(R"({"train_batch_size": 8, "zero_optimization": {"stage": 4}})");
  EXPECT_NE(e.find("zero_optimization.stage: value 4 is out of range; expected a value in [0, 3]"), std::string::npos)
      << e;
  e = error_of(R"({"train_batch_size": 8, "optimizer": {"params": {"lr": -1}}})");
  EXPECT_NE(e.find("optimizer.params.lr"), std::string::npos) << e;
}

TEST(Config, ElementCountsAcceptIntegralFloatsOnly) {
  EXPECT_EQ(ok(R"({"train_batch_size": 8, "zero_optimization": {"reduce_bucket_size": 5e8}})").zero.reduce_bucket_size,
            500'000'000);
  std::string e = error_of(R"({"train_batch_size": 8, "zero_optimization": {"reduce_bucket_size": 5.5}})");
  EXPECT_NE(e.find("expected an integer, got 5.5"), std::string::npos) << e;
  e = error_of(R"({"train_batch_size": true})");
  EXPECT_NE(e.find("train_batch_size: expected an integer"), std::string::npos) << e;
}

TEST(Config, InvalidJsonReportsPosition) {
  std::string e = error_of("{\"train_batch_size\": 8,\n \"fp16\": {\"enabled\": tru}}");
  EXPECT_EQ(e.rfind("cfg.json: invalid JSON: ", 0), 0u) << e;
  EXPECT_NE(e.find("line 2"), std::string::npos) << e;
  EXPECT_EQ(error_of("[1, 2]").rfind("cfg.json: the config must be a JSON object, got array", 0), 0u);
}

TEST(Config, MissingFileIsAConfigErrorNamingIt) {
  try {
    load_config("/nonexistent/ds_config.json");
    FAIL() << "expected an error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("config file /nonexistent/ds_config.json: does not exist"), std::string::npos);
  }
}

// ---- optimizer ----------------------------------------------------------------------------------

TEST(Config, OptimizerTypeIsCaseInsensitiveAndAdamDecouplesByDefault) {
  Config c = ok(R"({"train_batch_size": 8, "optimizer": {"type": "adam", "params": {"weight_decay": 0.1}}})");
  EXPECT_EQ(c.optimizer.type, OptimizerType::adam);
  EXPECT_TRUE(c.optimizer.decoupled_weight_decay);  // DeepSpeed: adam_w_mode defaults to true
  c = ok(R"({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"adam_w_mode": false}}})");
  EXPECT_FALSE(c.optimizer.decoupled_weight_decay);  // classic L2
  c = ok(R"({"train_batch_size": 8, "optimizer": {"type": "ADAMW", "params": {"adam_w_mode": false}}})");
  EXPECT_EQ(c.optimizer.type, OptimizerType::adamw);
  EXPECT_TRUE(c.optimizer.decoupled_weight_decay);  // AdamW always decouples
}

TEST(Config, OtherDeepSpeedOptimizersAreNamedAsUnsupported) {
  expect_error(R"({"train_batch_size": 8, "optimizer": {"type": "Lamb"}})",
               "optimizer.type: 'Lamb' is a DeepSpeed optimizer zinf does not implement");
  expect_error(R"({"train_batch_size": 8, "optimizer": {"type": "Adamm"}})", "did you mean Adam");
}

TEST(Config, MaxGradNormInOptimizerParamsIsRefusedLikeDeepSpeed) {
  std::string e =
      error_of(R"({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"max_grad_norm": 1.0}}})");
  EXPECT_NE(e.find("gradient_clipping"), std::string::npos) << e;
}

TEST(Config, BetasMustBeAPairInRange) {
  EXPECT_NE(
      error_of(R"({"train_batch_size": 8, "optimizer": {"params": {"betas": [0.9]}}})").find("optimizer.params.betas"),
      std::string::npos);
  EXPECT_NE(error_of(R"({"train_batch_size": 8, "optimizer": {"params": {"betas": [0.9, 1.0]}}})").find("[0, 1)"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"train_batch_size": 8, "optimizer": {"params": {"amsgrad": true}}})").find("AMSGrad"),
            std::string::npos);
}

// ---- schedulers ------------------------------------------------------------------------------------

TEST(Config, WarmupLRDefaultsFollowDeepSpeed) {
  Config c = ok(R"({"train_batch_size": 8, "optimizer": {"params": {"lr": 2e-4}}, "scheduler": {"type": "WarmupLR"}})");
  EXPECT_EQ(c.scheduler.type, SchedulerType::warmup_lr);
  EXPECT_DOUBLE_EQ(c.scheduler.warmup_min_lr, 0.0);
  EXPECT_DOUBLE_EQ(c.scheduler.warmup_max_lr, 2e-4);
  EXPECT_EQ(c.scheduler.warmup_num_steps, 1000);
  EXPECT_EQ(c.scheduler.warmup_type, WarmupType::log);
  c = ok(R"({"train_batch_size": 8, "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 1}}})");
  EXPECT_EQ(c.scheduler.warmup_num_steps, 2);  // clamped like DeepSpeed
}

TEST(Config, WarmupDecayAndCosineNeedTotalSteps) {
  std::string e = error_of(R"({"train_batch_size": 8, "scheduler": {"type": "WarmupDecayLR", "params": {}}})");
  EXPECT_NE(e.find("scheduler.params.total_num_steps: required by WarmupDecayLR"), std::string::npos) << e;
  Config c = ok(R"({"train_batch_size": 8, "train": {"steps": 77},
                    "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": "auto", "warmup_num_steps": 7}}})");
  EXPECT_EQ(c.scheduler.total_num_steps, 77);
  EXPECT_DOUBLE_EQ(c.scheduler.cos_min_ratio, 1e-4);
  e = error_of(
      R"({"train_batch_size": 8, "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 9, "warmup_max_lr": 1}}})");
  EXPECT_NE(e.find("scheduler.params.warmup_max_lr: unknown key"), std::string::npos) << e;
}

TEST(Config, SchedulerNamesAreCheckedWithSuggestion) {
  expect_error(R"({"train_batch_size": 8, "scheduler": {"type": "WarmupCosineLr"}})", "did you mean WarmupCosineLR?");
  expect_error(R"({"train_batch_size": 8, "scheduler": {"type": "OneCycle"}})", "does not implement");
}

// ---- precision -------------------------------------------------------------------------------------

TEST(Config, Fp16AndBf16CannotBothBeEnabled) {
  std::string e = error_of(R"({"train_batch_size": 8, "fp16": {"enabled": true}, "bf16": {"enabled": true}})");
  EXPECT_NE(e.find("bfloat16 and fp16 modes cannot be simultaneously enabled"), std::string::npos) << e;
}

TEST(Config, Bf16AcceptsItsOldAliasButNotBoth) {
  EXPECT_EQ(ok(R"({"train_batch_size": 8, "bfloat16": {"enabled": true}})").precision(), Precision::bf16);
  std::string e = error_of(R"({"train_batch_size": 8, "bfloat16": {"enabled": true}, "bf16": {"enabled": true}})");
  EXPECT_NE(e.find("name the same setting"), std::string::npos) << e;
}

TEST(Config, LossScaleRejectsBool) {
  std::string e = error_of(R"({"train_batch_size": 8, "fp16": {"enabled": true, "loss_scale": true}})");
  EXPECT_NE(e.find("fp16.loss_scale"), std::string::npos) << e;
  EXPECT_DOUBLE_EQ(ok(R"({"train_batch_size": 8, "fp16": {"enabled": true, "loss_scale": 128}})").fp16.loss_scale, 128);
}

// ---- activation_checkpointing -----------------------------------------------------------------------

TEST(Config, CpuCheckpointingIsReadFromDeepSpeedsSection) {
  const std::string model = R"("model": {"preset": "gpt2-124m", "activation_checkpointing": true})";
  EXPECT_FALSE(ok(R"({"train_batch_size": 8, )" + model + "}").model.cpu_checkpointing);  // default off
  const Config on = ok(R"({"train_batch_size": 8, )" + model +
                       R"(, "activation_checkpointing": {"cpu_checkpointing": true, "partition_activations": false,
                            "contiguous_memory_optimization": false, "number_checkpoints": null,
                            "synchronize_checkpoint_boundary": false, "profile": false}})");
  EXPECT_TRUE(on.model.cpu_checkpointing);
  EXPECT_TRUE(on.model.activation_checkpointing);
  // partition_activations and the others are accepted with a note each (number_checkpoints: null is absent)
  int notes = 0;
  for (const auto& n : on.notes) notes += n.rfind("activation_checkpointing.", 0) == 0;
  EXPECT_EQ(notes, 4);
  EXPECT_FALSE(ok(R"({"train_batch_size": 8, )" + model + R"(, "activation_checkpointing": {"cpu_checkpointing": false}})")
                   .model.cpu_checkpointing);
  EXPECT_TRUE(ok(R"({"train_batch_size": 8, )" + model + "}", {"activation_checkpointing.cpu_checkpointing=true"})
                  .model.cpu_checkpointing);
  // the round trip through the resolved config keeps it
  EXPECT_TRUE(ok(on.resolved_json).model.cpu_checkpointing);
}

TEST(Config, CpuCheckpointingErrors) {
  // without the recompute there is nothing to move
  EXPECT_EQ(error_of(R"({"train_batch_size": 8, "activation_checkpointing": {"cpu_checkpointing": true}})"),
            "cfg.json: activation_checkpointing.cpu_checkpointing: moves the checkpoints of activation checkpointing "
            "to host memory, which is off: set model.activation_checkpointing to true (zinf's per-block recompute)");
  expect_error(R"({"train_batch_size": 8, "model": {"activation_checkpointing": true},
                  "activation_checkpointing": {"cpu_checkpointing": "yes"}})",
               "activation_checkpointing.cpu_checkpointing: expected true or false");
  expect_error(R"({"train_batch_size": 8, "activation_checkpointing": {"cpu_checkpoint": true}})",
               "activation_checkpointing.cpu_checkpoint: unknown key (did you mean cpu_checkpointing?)");
  expect_error(R"({"train_batch_size": 8, "activation_checkpointing": true})",
               "activation_checkpointing: expected an object");
}

// ---- zero_optimization cross-checks -----------------------------------------------------------------

TEST(Config, NvmeOffloadNeedsAPath) {
  std::string e = error_of(
      R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}})");
  EXPECT_EQ(e, "cfg.json: zero_optimization.offload_optimizer.nvme_path: device is nvme but nvme_path is not set");
}

TEST(Config, OffloadNeedsTheRightStage) {
  std::string e =
      error_of(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})");
  EXPECT_NE(e.find("offloading parameters needs ZeRO stage 3 (stage is 2)"), std::string::npos) << e;
  e = error_of(R"({"train_batch_size": 8, "zero_optimization": {"offload_optimizer": {"device": "cpu"}}})");
  EXPECT_NE(e.find("needs ZeRO stage 1, 2 or 3"), std::string::npos) << e;
  e = error_of(
      R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "disk"}}})");
  EXPECT_NE(e.find("'disk' is not one of none, cpu, nvme"), std::string::npos) << e;
}

TEST(Config, DeprecatedCpuOffloadMapsWithNote) {
  Config c = ok(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "cpu_offload": true}})");
  EXPECT_EQ(c.zero.offload_optimizer.device, OffloadDevice::cpu);
  ASSERT_EQ(c.notes.size(), 2u);  // and the default model
  EXPECT_NE(c.notes[0].find("deprecated"), std::string::npos);
  std::string e = error_of(
      R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "cpu_offload": true, "offload_optimizer": {"device": "cpu"}}})");
  EXPECT_NE(
      e.find("Cannot provide deprecated parameter 'cpu_offload' and replacing parameter 'offload_optimizer' together"),
      std::string::npos)
      << e;
}

TEST(Config, Stage3AliasesAreAcceptedButNotTwice) {
  EXPECT_EQ(
      ok(R"({"train_batch_size": 8, "zero_optimization": {"prefetch_bucket_size": 123}})").zero.prefetch_bucket_size,
      123);
  std::string e = error_of(
      R"({"train_batch_size": 8, "zero_optimization": {"prefetch_bucket_size": 1, "stage3_prefetch_bucket_size": 2}})");
  EXPECT_NE(e.find("name the same setting"), std::string::npos) << e;
}

TEST(Config, NonApplicableDeepSpeedKeysGiveOneNoteEach) {
  Config c = ok(R"({"train_batch_size": 8, "communication_data_type": "fp16", "wandb": {"enabled": false},
                    "zero_optimization": {"round_robin_gradients": true}})");
  ASSERT_EQ(c.notes.size(), 4u);  // and the default model
  EXPECT_NE(c.notes[0].find("zero_optimization.round_robin_gradients"), std::string::npos);
}

// ---- aio -------------------------------------------------------------------------------------------

TEST(Config, AioThreadCountIsTheDocumentedAlias) {
  EXPECT_EQ(ok(R"({"train_batch_size": 8, "aio": {"thread_count": 4}})").aio.intra_op_parallelism, 4);
  EXPECT_EQ(ok(R"({"train_batch_size": 8, "aio": {"intra_op_parallelism": 3}})").aio.intra_op_parallelism, 3);
  EXPECT_NE(error_of(R"({"train_batch_size": 8, "aio": {"thread_count": 4, "intra_op_parallelism": 2}})").find("aio."),
            std::string::npos);
}

TEST(Config, AioBlockSizeMustSuitODirect) {
  std::string e = error_of(R"({"train_batch_size": 8, "aio": {"block_size": 5000}})");
  EXPECT_NE(e.find("aio.block_size: must be a multiple of 4096"), std::string::npos) << e;
  EXPECT_EQ(ok(R"({"train_batch_size": 8, "aio": {"engine": "posix"}})").aio.engine, AsyncIoKind::posix);
}

// ---- zinf sections --------------------------------------------------------------------------------

TEST(Config, ModelPresetWithFieldOverride) {
  Config c = ok(R"({"train_batch_size": 8, "model": {"preset": "gpt2-350m", "seq_len": 256}})");
  EXPECT_EQ(c.model.n_layer, 24);
  EXPECT_EQ(c.model.d_model, 1024);
  EXPECT_EQ(c.model.seq_len, 256);
  EXPECT_EQ(c.model.preset, "");  // no longer the preset's shape
  EXPECT_EQ(ok(R"({"train_batch_size": 8, "model": {"preset": "13b"}})").model.d_model, 5120);
}

TEST(Config, ModelShapeIsValidated) {
  std::string e = error_of(R"({"train_batch_size": 8, "model": {"n_head": 5, "d_model": 64}})");
  EXPECT_NE(e.find("model.d_model: d_model 64 is not divisible by n_head 5"), std::string::npos) << e;
  e = error_of(R"({"train_batch_size": 8, "model": {"preset": "gpt2-125m"}})");
  EXPECT_NE(e.find("did you mean gpt2-124m?"), std::string::npos) << e;
}

TEST(Config, DeviceMemoryBudgetTakesUnits) {
  EXPECT_EQ(ok(R"({"train_batch_size": 8, "device": {"memory_budget": "8GiB"}})").device.memory_budget, 8ull << 30);
  EXPECT_EQ(ok(R"({"train_batch_size": 8, "device": {"memory_budget": "8GB"}})").device.memory_budget,
            8'000'000'000ull);
  EXPECT_EQ(ok(R"({"train_batch_size": 8, "device": {"memory_budget": "auto"}})").device.memory_budget, 0u);
  EXPECT_EQ(ok(R"({"train_batch_size": 8, "device": {"memory_budget": 4096}})").device.memory_budget, 4096u);
  std::string e = error_of(R"({"train_batch_size": 8, "device": {"memory_budget": "8 parsecs"}})");
  EXPECT_NE(e.find("device.memory_budget: '8 parsecs' has an unknown unit"), std::string::npos) << e;
}

TEST(Config, AZeroBudgetIsRefusedNotReadAsAuto) {
  for (const char* v : {"0", "\"0\"", "\"0GiB\""}) {
    const std::string e = error_of(std::string(R"({"train_batch_size": 8, "device": {"memory_budget": )") + v + "}}");
    EXPECT_NE(e.find("device.memory_budget: expected a size above 0 or \"auto\""), std::string::npos) << v << ": " << e;
  }
}

// A batch number past its limit is refused as it is read, before any product is formed from it: no
// silent wrap to a small int, no allocation sized by it.
TEST(Config, BatchNumbersAreBoundedBeforeAnythingIsSizedFromThem) {
  expect_error(R"({"train_micro_batch_size_per_gpu": 4294967297})",
               "train_micro_batch_size_per_gpu: 4294967297 is above the largest micro batch zinf takes, 65536");
  expect_error(R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2147483648})",
               "gradient_accumulation_steps: 2147483648 is above the most micro batches a step takes, 65536");
  expect_error(R"({"train_batch_size": 18446744073709551615})", "train_batch_size:");
  expect_error(R"({"train_batch_size": 4294967296, "gradient_accumulation_steps": 1})",
               "train_micro_batch_size_per_gpu: train_batch_size / (gradient_accumulation_steps × world size) = "
               "4294967296 is above the largest micro batch zinf takes");
  expect_error(R"({"train_micro_batch_size_per_gpu": 4096, "model": {"seq_len": 1048576}})",
               "micro batch 4096 × model.seq_len 1048576 rows is above 2^31 - 1");
  EXPECT_EQ(ok(R"({"train_micro_batch_size_per_gpu": 65536, "gradient_accumulation_steps": 65536})").train_batch_size,
            std::int64_t{1} << 32);
}

TEST(Config, DeviceAsyncModeAndJitter) {
  const Config d = ok(R"({"train_batch_size": 8})");
  EXPECT_FALSE(d.device.async);
  EXPECT_EQ(d.device.jitter_seed, 0u);
  EXPECT_EQ(d.device.jitter_us, 200);
  const Config c =
      ok(R"({"train_batch_size": 8, "device": {"type": "cpu", "async": true, "jitter_seed": 9, "jitter_us": 50}})");
  EXPECT_TRUE(c.device.async);
  EXPECT_EQ(c.device.jitter_seed, 9u);
  EXPECT_EQ(c.device.jitter_us, 50);
  std::string e = error_of(R"({"train_batch_size": 8, "device": {"jitter_us": 0}})");
  EXPECT_NE(e.find("device.jitter_us"), std::string::npos) << e;
  e = error_of(R"({"train_batch_size": 8, "device": {"jitter_seed": -1}})");
  EXPECT_NE(e.find("device.jitter_seed"), std::string::npos) << e;
  e = error_of(R"({"train_batch_size": 8, "device": {"type": "cuda", "async": true}})");
  EXPECT_NE(e.find("device.async: applies to the CPU device only"), std::string::npos) << e;
}

TEST(Config, DataTokenizerAppliesToText) {
  EXPECT_EQ(ok(R"({"train_batch_size": 8, "data": {"path": "a.txt", "tokenizer": "t.model"}})").data.tokenizer,
            "t.model");
  std::string e = error_of(R"({"train_batch_size": 8, "data": {"format": "tokens", "tokenizer": "t.model"}})");
  EXPECT_NE(e.find("data.tokenizer: a tokenizer applies to text"), std::string::npos) << e;
}

TEST(Config, TrainCheckpointIntervalNeedsADirectory) {
  std::string e = error_of(R"({"train_batch_size": 8, "train": {"checkpoint_interval": 10}})");
  EXPECT_NE(e.find("train.checkpoint_interval"), std::string::npos) << e;
}

TEST(ParseBytes, UnitsAndErrors) {
  EXPECT_EQ(parse_bytes("0", "x"), 0u);
  EXPECT_EQ(parse_bytes("1.5G", "x"), 3ull << 29);
  EXPECT_EQ(parse_bytes("512MiB", "x"), 512ull << 20);
  EXPECT_EQ(parse_bytes("2 TB", "x"), 2'000'000'000'000ull);
  EXPECT_EQ(parse_bytes("64k", "x"), 65536u);
  EXPECT_THROW(parse_bytes("", "x"), ConfigError);
  EXPECT_THROW(parse_bytes("-1G", "x"), ConfigError);
  EXPECT_THROW(parse_bytes("1.2.3G", "x"), ConfigError);
  EXPECT_THROW(parse_bytes("99999999999TiB", "x"), ConfigError);
}

TEST(EditDistance, Basics) {
  EXPECT_EQ(edit_distance("", ""), 0u);
  EXPECT_EQ(edit_distance("abc", ""), 3u);
  EXPECT_EQ(edit_distance("offload_optimzer", "offload_optimizer"), 1u);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
}

// ---- command-line overrides ------------------------------------------------------------------------

TEST(Overrides, SetDottedKeysWithJsonOrBareStrings) {
  Config c = ok(kMinimal, {"zero_optimization.stage=3", "zero_optimization.offload_param.device=cpu",
                           "model.preset=gpt2-350m", "optimizer.params.betas=[0.8,0.9]", "fp16.enabled=true"});
  EXPECT_EQ(c.zero.stage, 3);
  EXPECT_EQ(c.zero.offload_param.device, OffloadDevice::cpu);
  EXPECT_EQ(c.model.n_layer, 24);
  EXPECT_DOUBLE_EQ(c.optimizer.beta1, 0.8);
  EXPECT_TRUE(c.fp16.enabled);
}

TEST(Overrides, ReplaceValuesFromTheFile) {
  Config c =
      ok(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 8})", {"train_micro_batch_size_per_gpu=4"});
  EXPECT_EQ(c.gradient_accumulation_steps, 8);
}

TEST(Overrides, AreValidatedLikeTheFile) {
  EXPECT_EQ(error_of(kMinimal, {"zero_optimization.stgae=3"}),
            "cfg.json: zero_optimization.stgae: unknown key (did you mean stage?)");
  EXPECT_NE(error_of(kMinimal, {"noequals"}).find("expected key.path=value"), std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"train_micro_batch_size_per_gpu.x=1"}).find("is not an object"), std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"a..b=1"}).find("empty key"), std::string::npos);
}

// ---- the shipped configs ---------------------------------------------------------------------------

TEST(ShippedConfigs, AllLoadWithoutNotesExceptDocumentedOnes) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(std::string(ZINF_SOURCE_DIR) + "/configs")) {
    if (e.path().extension() != ".json") continue;
    SCOPED_TRACE(e.path().string());
    Config c = load_config(e.path().string());
    EXPECT_GT(c.train_batch_size, 0);
    ++n;
  }
  EXPECT_GE(n, 6);
}

}  // namespace
}  // namespace zinf
