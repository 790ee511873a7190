// checkpoint_test.cpp — checkpoints and resume: bitwise-identical resume (also across placements and
// thread counts, with the loss scaler mid-flight), keep_last, corruption and truncation refused with
// the file and tensor named, `latest` falling back past a bad checkpoint, a full disk leaving the
// previous checkpoint intact, and a run killed with SIGKILL at random moments resuming to the
// uninterrupted digest.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "zinf/checkpoint.h"
#include "zinf/config.h"
#include "zinf/error.h"
#include "zinf/train.h"

namespace zinf {
namespace {

namespace fs = std::filesystem;

class Checkpoints : public ::testing::Test {
 protected:
  fs::path dir = fs::temp_directory_path() / ("zinf-ckpt-test-" + std::to_string(::getpid()));
  void SetUp() override { fs::create_directories(dir / "swap"); }
  void TearDown() override { fs::remove_all(dir); }

  std::string cfg(int steps, const std::string& extra = "") const {
    return R"({"model": {"n_layer": 2, "n_head": 2, "d_model": 32, "vocab_size": 256, "seq_len": 16},
               "train": {"steps": )" +
           std::to_string(steps) + R"(, "eval_interval": 0, "eval_batches": 2, "seed": 5, "checkpoint_interval": 2,
                         "keep_last": 3, "checkpoint_dir": ")" +
           (dir / "ck").string() + R"("},
               "device": {"type": "cpu", "memory_budget": "256MiB", "threads": 1},
               "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "steps_per_print": 1000,
               "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}},
               "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 3, "total_num_steps": "auto"}},
               "fp16": {"enabled": true, "initial_scale_power": 24, "loss_scale_window": 3, "hysteresis": 1},
               "zero_optimization": {"stage": 3, "sub_group_size": 6000,
                 "offload_optimizer": {"nvme_path": ")" +
           (dir / "swap").string() + R"("}, "offload_param": {"nvme_path": ")" + (dir / "swap").string() + R"("}})" + extra +
           "}";
  }
  TrainResult run(int steps, const std::vector<std::string>& overrides = {}, const std::string& resume = "",
                  std::vector<std::string>* log = nullptr) {
    TrainHooks h;
    h.resume = resume;
    if (log) h.log = [log](const std::string& s) { log->push_back(s); };
    return train(parse_config(cfg(steps), overrides), h);
  }
  ModelShape shape() const { return ModelShape{2, 2, 32, 256, 16}; }
};

TEST_F(Checkpoints, ResumeIsBitwiseIdenticalAcrossPlacementsAndThreads) {
  const TrainResult full = run(10);
  EXPECT_GT(full.skipped, 0);  // the fp16 scaler was busy: its state must survive the checkpoint
  fs::remove_all(dir / "ck");
  run(4, {"train.keep_last=10"});  // checkpoints at steps 2 and 4
  ASSERT_TRUE(fs::exists(dir / "ck" / "step-00000004"));
  const TrainResult resumed = run(10, {"train.keep_last=10"}, "latest");
  EXPECT_EQ(resumed.resumed_from, 4);
  EXPECT_EQ(resumed.params_digest, full.params_digest);
  // Written with the states on the device, resumed with them on NVMe and 2 threads (and back).
  const TrainResult moved = run(10,
                                {"zero_optimization.offload_optimizer.device=nvme", "zero_optimization.offload_param.device=cpu",
                                 "device.threads=2"},
                                (dir / "ck" / "step-00000004").string());
  EXPECT_EQ(moved.params_digest, full.params_digest);
  EXPECT_TRUE(fs::is_empty(dir / "swap"));
}

TEST_F(Checkpoints, KeepLastPrunesOlderCheckpoints) {
  run(10);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir / "ck")) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"step-00000006", "step-00000008", "step-00000010"}));
  const auto m = nlohmann::json::parse(std::ifstream(dir / "ck" / "step-00000010" / "manifest.json"));
  EXPECT_EQ(m["format"], "zinf-checkpoint");
  EXPECT_EQ(m["tensors"].size(), 12u);  // 4 units × (master, m, v)
}

TEST_F(Checkpoints, CorruptionIsNamedAndLatestFallsBack) {
  run(6);
  // Corrupt the newest checkpoint's states: one flipped byte inside block.1's Adam v.
  const fs::path bad = dir / "ck" / "step-00000006";
  const auto m = nlohmann::json::parse(std::ifstream(bad / "manifest.json"));
  std::uint64_t off = 0;
  for (const auto& t : m["tensors"])
    if (t["name"] == "block.1/adam.v") off = t["offset"].get<std::uint64_t>() + 17;
  {
    std::fstream f(bad / "states.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(off));
    char ch;
    f.read(&ch, 1);
    ch = static_cast<char>(ch ^ 0x40);
    f.seekp(static_cast<std::streamoff>(off));
    f.write(&ch, 1);
  }
  try {
    verify_checkpoint(bad.string(), shape());
    FAIL();
  } catch (const Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("states.bin"), std::string::npos) << w;
    EXPECT_NE(w.find("block.1/adam.v"), std::string::npos) << w;
  }
  EXPECT_THROW(run(8, {}, bad.string()), Error);  // an explicit bad checkpoint is refused
  std::vector<std::string> log;
  const TrainResult r = run(8, {}, "latest", &log);
  EXPECT_EQ(r.resumed_from, 4);
  bool said = false;
  for (const auto& l : log) said = said || l.find("falling back") != std::string::npos;
  EXPECT_TRUE(said);
  // Truncation and a different model shape.
  fs::resize_file(dir / "ck" / "step-00000004" / "states.bin", 1000);
  EXPECT_THROW(verify_checkpoint((dir / "ck" / "step-00000004").string(), shape()), Error);
  try {
    verify_checkpoint((dir / "ck" / "step-00000008").string(), ModelShape{3, 2, 32, 256, 16});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model shape differs"), std::string::npos) << e.what();
  }
}

TEST_F(Checkpoints, FullDiskLeavesThePreviousCheckpointIntact) {
  set_checkpoint_fault(2);  // the 2nd save of this process runs out of space half-way
  try {
    run(6);
    FAIL() << "the second checkpoint should have failed";
  } catch (const IoError& e) {
    EXPECT_EQ(e.error_number(), ENOSPC);
    EXPECT_NE(std::string(e.what()).find("states.bin"), std::string::npos) << e.what();
  }
  set_checkpoint_fault(0);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir / "ck")) names.push_back(e.path().filename().string());
  EXPECT_EQ(names, (std::vector<std::string>{"step-00000002"}));  // no torn temporary left behind
  verify_checkpoint((dir / "ck" / "step-00000002").string(), shape());
  EXPECT_TRUE(fs::is_empty(dir / "swap"));
}

// ---- processes ---------------------------------------------------------------------------------------

int spawn(const std::vector<std::string>& args, const std::string& out, const std::string& err = "/dev/null") {
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    FILE* f = std::freopen(out.c_str(), "w", stdout);
    (void)f;
    FILE* e = std::freopen(err.c_str(), "w", stderr);
    (void)e;
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

TEST_F(Checkpoints, CtrlCStopsCleanlyWithACheckpointAndNoSwapLeft) {
  const std::string conf = (dir / "run.json").string();
  std::ofstream(conf) << cfg(100000);
  const std::string out = (dir / "out.json").string();
  const pid_t pid = spawn({ZINF_BIN, "train", "--json", "--config", conf, "--set", "train.checkpoint_interval=1", "--set",
                           "zero_optimization.offload_optimizer.device=nvme", "--set", "zero_optimization.offload_param.device=nvme"},
                          out);
  // Training has started once its first checkpoint exists (bounded wait on that condition).
  for (int i = 0; i < 2000 && !fs::exists(dir / "ck" / "step-00000001"); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(fs::exists(dir / "ck" / "step-00000001"));
  ::kill(pid, SIGINT);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by the signal instead of stopping cleanly";
  EXPECT_EQ(WEXITSTATUS(status), 130);
  const auto j = nlohmann::json::parse(std::ifstream(out));
  EXPECT_TRUE(j["interrupted"].get<bool>());
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(j["steps"].get<std::int64_t>()));
  EXPECT_TRUE(fs::exists(dir / "ck" / name)) << name;  // the step it stopped after was saved
  EXPECT_TRUE(fs::is_empty(dir / "swap"));               // and the NVMe swap directories are gone
}

TEST_F(Checkpoints, SurvivesSigkillAtRandomMomentsAndResumesExactly) {
  const int kills = std::getenv("ZINF_LONG_TESTS") ? 200 : 20;
  const std::string conf = (dir / "run.json").string();
  std::ofstream(conf) << cfg(40, R"(, "data": {"val_fraction": 0.1})");
  const std::string out = (dir / "out.json").string();
  auto args = [&](bool resume) {
    std::vector<std::string> a = {ZINF_BIN, "train", "--json", "--config", conf, "--set", "train.checkpoint_interval=1",
                                  "--set", "zero_optimization.offload_optimizer.device=nvme"};
    if (resume) a.push_back("--resume");
    return a;
  };
  // The uninterrupted run.
  int status = 0;
  ::waitpid(spawn(args(false), out), &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  const std::string want = nlohmann::json::parse(std::ifstream(out))["params_digest"];
  fs::remove_all(dir / "ck");
  // Kill it again and again, mid-step and mid-checkpoint, resuming each time.
  std::mt19937 rng(2024);
  int killed = 0, runs = 0;
  std::string got;
  while (true) {
    ASSERT_LT(++runs, kills + 200) << "the run never finished";
    const pid_t pid = spawn(args(true), out);
    if (killed < kills) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5 + rng() % 120));  // a random moment, not synchronisation
      ::kill(pid, SIGKILL);
    }
    ::waitpid(pid, &status, 0);
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) {
      ++killed;
      continue;
    }
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
    got = nlohmann::json::parse(std::ifstream(out))["params_digest"];
    if (killed >= kills) break;
    fs::remove_all(dir / "ck");  // it finished before the kill: start over so that kills keep landing mid-run
  }
  EXPECT_GE(killed, kills);
  EXPECT_EQ(got, want);
  // SIGKILL cannot be caught, so a killed run leaves its swap directory behind; the next run's store
  // removes it (provably stale: marker, owner gone). At most the last killed run's remains.
  std::size_t swap_dirs = 0;
  for (const auto& e : fs::directory_iterator(dir / "swap")) swap_dirs += e.is_directory();
  EXPECT_EQ(swap_dirs, 0u);
  for (const auto& e : fs::directory_iterator(dir / "ck"))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos);
}

// A second Ctrl-C stops at once — the process ends by the signal — and still removes the NVMe swap
// directories.
TEST_F(Checkpoints, SecondCtrlCStopsAtOnceAndRemovesTheSwapDirectories) {
  const std::string conf = (dir / "run.json").string();
  std::ofstream(conf) << cfg(100000);
  // Steps of 400 micro batches: long enough that the second Ctrl-C lands while the first one waits
  // for the step to end.
  const std::string err = (dir / "err.txt").string();
  const pid_t pid = spawn({ZINF_BIN, "train", "--config", conf, "--set", "train.checkpoint_interval=1", "--set",
                           "gradient_accumulation_steps=400", "--set", "zero_optimization.offload_optimizer.device=nvme", "--set",
                           "zero_optimization.offload_param.device=nvme"},
                          (dir / "out.txt").string(), err);
  for (int i = 0; i < 6000 && !fs::exists(dir / "ck" / "step-00000001"); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(fs::exists(dir / "ck" / "step-00000001"));
  ASSERT_FALSE(fs::is_empty(dir / "swap"));
  ::kill(pid, SIGINT);
  auto said = [&] {
    std::ifstream f(err);
    return std::string(std::istreambuf_iterator<char>(f), {}).find("Ctrl-C again stops at once") != std::string::npos;
  };
  for (int i = 0; i < 2000 && !said(); ++i)  // the first Ctrl-C was taken (the handler says so)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(said());
  ::kill(pid, SIGINT);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status)) << "exited with " << (WIFEXITED(status) ? WEXITSTATUS(status) : -1)
                                   << " instead of stopping at once";
  EXPECT_EQ(WTERMSIG(status), SIGINT);
  EXPECT_TRUE(fs::is_empty(dir / "swap"));  // the swap directories went with it
}

// Ctrl-C during the first evaluation stops after the current evaluation batch, not after a step and
// another full evaluation. With a million evaluation batches, only that can end the run.
TEST_F(Checkpoints, CtrlCDuringTheFirstEvaluationStopsAfterTheCurrentBatch) {
  const std::string conf = (dir / "run.json").string();
  std::ofstream(conf) << cfg(100000);
  const std::string out = (dir / "out.json").string();
  const pid_t pid = spawn({ZINF_BIN, "train", "--json", "--config", conf, "--set", "train.eval_batches=1000000", "--set",
                           "zero_optimization.offload_optimizer.device=nvme"},
                          out);
  for (int i = 0; i < 2000 && fs::is_empty(dir / "swap"); ++i)  // the engine is built: evaluation begins
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ::kill(pid, SIGINT);
  int status = 0;
  pid_t done = 0;
  for (int i = 0; i < 6000 && done == 0; ++i) {  // bounded: a run that ignores the stop is killed, and fails
    done = ::waitpid(pid, &status, WNOHANG);
    if (done == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (done == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    FAIL() << "the run did not stop within a minute of Ctrl-C during its first evaluation";
  }
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 130);
  const auto j = nlohmann::json::parse(std::ifstream(out));
  EXPECT_TRUE(j["interrupted"].get<bool>());
  EXPECT_EQ(j["steps"].get<std::int64_t>(), 0);
  EXPECT_TRUE(fs::is_empty(dir / "swap"));
}

// nvme_path is created when it does not exist (as DeepSpeed does), and a run whose optimizer and
// parameters share one swap path does not call its own second directory stale.
TEST_F(Checkpoints, NvmePathIsCreatedAndARunsOwnDirectoriesAreNotStale) {
  const fs::path fresh = dir / "new" / "swap";
  std::vector<std::string> log;
  const TrainResult r = run(2, {"zero_optimization.offload_optimizer.device=nvme", "zero_optimization.offload_param.device=nvme",
                                "zero_optimization.offload_optimizer.nvme_path=\"" + fresh.string() + "\"",
                                "zero_optimization.offload_param.nvme_path=\"" + fresh.string() + "\""},
                        "", &log);
  EXPECT_EQ(r.steps, 2);
  EXPECT_TRUE(fs::is_directory(fresh));
  EXPECT_TRUE(fs::is_empty(fresh));
  std::string offload, created;
  for (const auto& l : log) {
    if (l.rfind("offload:", 0) == 0) offload = l;
    if (l.find("created " + fresh.string()) != std::string::npos) created = l;
  }
  EXPECT_EQ(created, "zero_optimization.offload_optimizer.nvme_path: created " + fresh.string() + ", which did not exist");
  EXPECT_EQ(offload.find("stale"), std::string::npos) << offload;
}

// train.steps 0 only evaluates: a checkpoint of any step, with the loss the run ended with.
TEST_F(Checkpoints, StepsZeroEvaluatesACheckpoint) {
  const TrainResult trained = run(4);
  const TrainResult evaluated = run(0, {}, "latest");
  EXPECT_EQ(evaluated.resumed_from, 4);
  EXPECT_EQ(evaluated.val_loss, trained.val_loss);
  EXPECT_EQ(evaluated.params_digest, trained.params_digest);
}

// A llama-family run resumes bitwise, and its checkpoint is refused by a GPT-2 config.
TEST_F(Checkpoints, LlamaResumesExactlyAndOtherFamiliesAreRefused) {
  const std::vector<std::string> llama = {"model.family=llama", "model.n_kv_head=1", "model.d_ff=40", "model.tie_embeddings=false"};
  const TrainResult full = run(4, llama);
  fs::remove_all(dir / "ck" / "step-00000004");
  const TrainResult resumed = run(4, llama, "latest");
  EXPECT_EQ(resumed.resumed_from, 2);
  EXPECT_EQ(resumed.params_digest, full.params_digest);
  try {
    run(4, {}, (dir / "ck" / "step-00000002").string());
    FAIL() << "a GPT-2 config resumed a llama checkpoint";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the model family differs (checkpoint llama, config gpt2)"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace zinf
