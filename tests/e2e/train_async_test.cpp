// train_async_test.cpp — `train()` on the asynchronous, jittered CPU device: the model's ops run on
// the compute stream's worker while the trainer runs ahead, every stream and host worker waits a
// seeded random time before each job, and the trained parameters must equal the synchronous run's bit
// for bit — for every placement, both overlap modes, thread counts, checkpointing, precisions and
// gradient accumulation. Seeds per configuration: ZINF_ASYNC_SEEDS (default 3). A traced run
// (train.trace_file) records from every stream and worker at once: the same bits, and spans that add
// up to the busy times.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "app/config/config.h"
#include "app/train/train.h"
#include "small_train.h"
#include "trace_check.h"

namespace zinf {
namespace {

namespace fs = std::filesystem;

const std::string kSwap = (fs::temp_directory_path() / ("zinf-train-async-" + std::to_string(::getpid()))).string();

int seeds() {
  const char* v = std::getenv("ZINF_ASYNC_SEEDS");
  return v && *v ? std::max(1, std::atoi(v)) : 3;
}

std::string digest(std::vector<std::string> overrides) { return test::small_train_digest(kSwap, overrides); }

// The digest under `overrides` on the jittered async device, for seeds first .. first+seeds()-1.
void expect_async_equal(std::vector<std::string> overrides, const std::string& ref, std::uint64_t first) {
  for (int k = 0; k < seeds(); ++k) {
    const std::uint64_t seed = first + static_cast<std::uint64_t>(k);
    auto o = overrides;
    o.push_back("device.async=true");
    o.push_back("device.jitter_seed=" + std::to_string(seed));
    o.push_back("device.jitter_us=100");
    EXPECT_EQ(digest(o), ref) << "jitter seed " << seed;
  }
}

// expect_async_equal for `overrides` with the parameters offloaded to the CPU and the optimizer
// states on the device, then on `optimizer`; the seeds start at `seed`, which moves on by 10 a run.
void expect_async_equal_params_on_cpu(const std::vector<std::string>& overrides, const char* optimizer,
                                      const std::string& ref, std::uint64_t& seed) {
  for (const char* place : {"none", optimizer}) {
    auto o = overrides;
    o.push_back(std::string("zero_optimization.offload_optimizer.device=") + place);
    o.push_back("zero_optimization.offload_param.device=cpu");
    expect_async_equal(o, ref, seed);
    seed += 10;
  }
}

class TrainAsync : public ::testing::Test {
 protected:
  void SetUp() override { fs::create_directories(kSwap); }
  void TearDown() override {
    EXPECT_TRUE(fs::is_empty(kSwap));
    fs::remove_all(kSwap);
  }
};

TEST_F(TrainAsync, EveryPlacementEqualsTheSynchronousRun) {
  const std::string ref = digest({});
  std::uint64_t seed = 101;
  for (const char* opt : {"none", "cpu", "nvme"})
    for (const char* param : {"none", "cpu", "nvme"}) {
      SCOPED_TRACE(std::string("optimizer ") + opt + " param " + param);
      expect_async_equal({std::string("zero_optimization.offload_optimizer.device=") + opt,
                          std::string("zero_optimization.offload_param.device=") + param},
                         ref, seed);
      seed += 10;
    }
}

TEST_F(TrainAsync, OverlapNoneThreadsAndCheckpointingEqualTheSynchronousRun) {
  const std::vector<std::string> offload = {"zero_optimization.offload_optimizer.device=nvme",
                                            "zero_optimization.offload_param.device=cpu"};
  const std::string ref = digest(offload);
  std::uint64_t seed = 201;
  for (const char* extra : {"train.overlap=none", "device.threads=2", "model.activation_checkpointing=true"}) {
    SCOPED_TRACE(extra);
    auto o = offload;
    o.push_back(extra);
    expect_async_equal(o, ref, seed);
    seed += 10;
  }
}

TEST_F(TrainAsync, PrecisionsAndGradientAccumulationEqualTheSynchronousRun) {
  std::uint64_t seed = 301;
  for (const char* prec : {"fp16.enabled=false", "bf16.enabled=true"})
    for (const char* ga : {"gradient_accumulation_steps=1", "gradient_accumulation_steps=3"}) {
      SCOPED_TRACE(std::string(prec) + " " + ga);
      std::vector<std::string> base = {"fp16.enabled=false", prec, ga};
      const std::string ref = digest(base);
      expect_async_equal_params_on_cpu(base, "cpu", ref, seed);
    }
}

TEST_F(TrainAsync, LlamaEqualsTheSynchronousRun) {
  const std::vector<std::string> llama = {"model.family=llama", "model.n_kv_head=1", "model.d_ff=48",
                                          "model.tie_embeddings=false"};
  const std::string ref = digest(llama);
  std::uint64_t seed = 401;
  expect_async_equal_params_on_cpu(llama, "nvme", ref, seed);
}

// The trace is recorded by the device's stream workers, the engine's workers, the disk meter and the
// trainer at once: it changes no bit, and over the measured steps its spans add up to the busy times
// the run reports (docs/trace.md).
TEST_F(TrainAsync, ATracedRunEqualsTheSynchronousRunAndItsSpansTheBusyTimes) {
  const std::vector<std::string> place = {"zero_optimization.offload_optimizer.device=nvme",
                                          "zero_optimization.offload_param.device=cpu"};
  const std::string ref = digest(place);
  const std::string file =
      (fs::path(kSwap).parent_path() / ("zinf-async-trace-" + std::to_string(::getpid()) + ".json")).string();
  for (int k = 0; k < seeds(); ++k) {
    auto o = place;
    for (std::string x : {"device.async=true", "device.jitter_us=100", "train.trace_steps=4"}) o.push_back(x);
    o.push_back("device.jitter_seed=" + std::to_string(501 + k));
    o.push_back("train.trace_file=\"" + file + "\"");
    const TrainResult r = train(parse_config(test::small_train_config(kSwap), o), TrainHooks{});
    EXPECT_EQ(r.params_digest, ref) << "jitter seed " << 501 + k;
    test::TrackNames names;
    const test::json t = test::load_trace(file, names);
    ASSERT_FALSE(HasFatalFailure());
    ASSERT_EQ(t["zinf"]["steps"], test::json({1, 2, 3, 4}));
    const auto busy = test::busy_from_spans(t, names, [](std::int64_t step) { return step >= 2; });
    ASSERT_EQ(r.measured_steps, 3);
    r.busy.each([&](const std::string& name, double sec) {
      test::expect_agree(busy.count(name) ? busy.at(name) : 0.0, sec, name);
    });
    fs::remove(file);
  }
}

}  // namespace
}  // namespace zinf
