// cli_test.cpp — the `zinf` binary as a user runs it: help, version, exit codes, one-line errors,
// `info` and `plan` (text and --json) on every shipped config.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "shell.h"

namespace {

using zinf::test::Result;
using zinf::test::slurp;

Result run(const std::string& args) { return zinf::test::sh(std::string(ZINF_BIN) + " " + args); }

std::size_t lines(const std::string& s) { return static_cast<std::size_t>(std::count(s.begin(), s.end(), '\n')); }

const std::string kConfigs = std::string(ZINF_SOURCE_DIR) + "/configs";

TEST(Cli, HelpAndVersion) {
  Result r = run("--help");
  EXPECT_EQ(r.rc, 0);
  EXPECT_NE(r.out.find("info"), std::string::npos);
  EXPECT_NE(r.out.find("plan"), std::string::npos);
  r = run("--version");
  EXPECT_EQ(r.rc, 0);
  EXPECT_EQ(r.out.rfind("zinf ", 0), 0u);
  for (const char* sub : {"info", "plan", "train", "export", "bench adam", "bench nvme", "bench step", "bench pcie", "bench comm"}) {
    r = run(std::string(sub) + " --help");
    EXPECT_EQ(r.rc, 0) << sub;
    EXPECT_NE(r.out.find(std::string(sub) == "export" ? "--output" : "--json"), std::string::npos) << sub;
  }
}

TEST(Cli, UsageErrorsExitTwoWithOneLine) {
  for (const char* args : {"", "frobnicate", "plan", "plan --config", "info --bogus"}) {
    Result r = run(args);
    EXPECT_EQ(r.rc, 2) << args;
    EXPECT_EQ(lines(r.err), 1u) << args << ": " << r.err;
    EXPECT_EQ(r.err.rfind("zinf: ", 0), 0u) << r.err;
  }
}

TEST(Cli, InfoReportsTheMachine) {
  Result r = run("info --path " + std::filesystem::temp_directory_path().string());
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("simd"), std::string::npos);
  EXPECT_NE(r.out.find("memlock"), std::string::npos);
  EXPECT_NE(r.out.find("O_DIRECT"), std::string::npos);
  r = run("info --json --path /nonexistent-dir");
  ASSERT_EQ(r.rc, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_GE(j["cpu"]["logical_cpus"].get<int>(), 1);
  EXPECT_GT(j["memory"]["total_bytes"].get<std::uint64_t>(), 0u);
  EXPECT_FALSE(j["paths"][0]["exists"].get<bool>());
  EXPECT_TRUE(j["cuda"].contains("status"));
  if (j["gpus"].empty()) {
    EXPECT_FALSE(j["cuda"]["status"].get<std::string>().empty());
  }
}

TEST(Cli, PlanEveryShippedConfig) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(kConfigs)) {
    if (e.path().extension() != ".json") continue;
    SCOPED_TRACE(e.path().string());
    Result r = run("plan --config " + e.path().string());
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_NE(r.out.find("param16"), std::string::npos);
    EXPECT_NE(r.out.find("verdict"), std::string::npos);
    r = run("plan --json --config " + e.path().string());
    ASSERT_EQ(r.rc, 0) << r.err;
    auto j = nlohmann::json::parse(r.out);
    std::uint64_t sum = 0;
    for (const auto& s : j["states"])
      for (auto& [tier, b] : s["bytes"].items()) sum += b.get<std::uint64_t>();
    std::uint64_t total = 0;
    for (auto& [tier, b] : j["model_states"].items()) total += b.get<std::uint64_t>();
    EXPECT_EQ(sum, total);
    EXPECT_GT(j["model"]["params"].get<std::int64_t>(), 0);
    EXPECT_EQ(j["largest_fit"].size(), 5u);
    ++n;
  }
  EXPECT_GE(n, 6);
}

TEST(Cli, PlanWithOverride) {
  Result r = run("plan --json --config " + kConfigs + "/tiny.json --set model.n_layer=8");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["model"]["n_layer"], 8);
}

TEST(Cli, BenchAdamReportsTheRatio) {
  Result r = run("bench adam --params 2M --threads 1 --reps 1 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_GT(j["ratio"].get<double>(), 0.0);
  EXPECT_GT(j["fused"]["params_per_s"].get<double>(), 0.0);
  EXPECT_GT(j["memory_limit"]["gb_per_s"].get<double>(), 0.0);
  EXPECT_EQ(j["bytes_per_param"].get<double>(), 28.0);
  r = run("bench adam --params 2M --threads 1 --reps 1 --simd scalar --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["simd"], "scalar");
  EXPECT_EQ(run("bench adam --params zero").rc, 2);
  r = run("bench adam --help");
  EXPECT_NE(r.out.find("memory"), std::string::npos);
}

TEST(Cli, BenchNvmeSweepsAndCleansUp) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("zinf-bench-nvme-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  Result r = run("bench nvme --path " + dir.string() +
                 " --size 8M --cell 4M --swap-item 1M --blocks 128K,1M --depths 1,4 --threads 1 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["cells"].size(), 8u);  // 2 blocks x 2 depths x 1 thread x 2 directions
  EXPECT_GT(j["best_read_gb_per_s"].get<double>(), 0.0);
  EXPECT_GT(j["best_write_gb_per_s"].get<double>(), 0.0);
  EXPECT_GT(j["swap_ratio"].get<double>(), 0.0);
  EXPECT_TRUE(j["aio"].contains("queue_depth"));
  EXPECT_NE(r.err.find("swap mode"), std::string::npos);  // progress was shown
  EXPECT_TRUE(std::filesystem::is_empty(dir));             // the private directory is gone
  r = run("bench nvme --path /nonexistent-zinf-dir --size 8M --cell 4M");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("/nonexistent-zinf-dir"), std::string::npos) << r.err;
  EXPECT_EQ(lines(r.err), 1u) << r.err;
  std::filesystem::remove_all(dir);
}

TEST(Cli, TrainPrintsConfigProgressAndTheFinalLine) {
  const std::string small = " --set model.n_layer=1 --set model.d_model=32 --set model.n_head=2 --set model.seq_len=32"
                            " --set train_micro_batch_size_per_gpu=2 --set train.eval_batches=2 --set device.threads=1";
  const std::string metrics = std::filesystem::temp_directory_path() / ("zinf-metrics-" + std::to_string(::getpid()) + ".jsonl");
  Result r = run("train --config " + kConfigs + "/tiny.json --set train.steps=4 --set steps_per_print=2"
                 " --set wall_clock_breakdown=true --set train.metrics_file=\"" + metrics + "\"" + small);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("optimizer.params.lr"), std::string::npos);  // the resolved config table
  EXPECT_NE(r.out.find("step     2/4 | loss"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fwd "), std::string::npos);
  EXPECT_NE(r.out.find("val_loss"), std::string::npos);
  const auto fin = r.out.find("final step=4 loss=");
  ASSERT_NE(fin, std::string::npos) << r.out;
  EXPECT_NE(r.out.find("params_digest=", fin), std::string::npos);
  EXPECT_EQ(lines(slurp(metrics)), 5u);  // 4 steps + the final validation line
  std::filesystem::remove(metrics);
  // The same run twice gives the same digest; --json gives the summary on stdout.
  Result a = run("train --json --config " + kConfigs + "/tiny.json --set train.steps=2" + small);
  Result b = run("train --json --config " + kConfigs + "/tiny.json --set train.steps=2" + small);
  ASSERT_EQ(a.rc, 0) << a.err;
  auto ja = nlohmann::json::parse(a.out), jb = nlohmann::json::parse(b.out);
  EXPECT_EQ(ja["params_digest"], jb["params_digest"]);
  EXPECT_EQ(ja["steps"], 2);
}

TEST(Cli, BenchStepReportsOverlapAndMatchesNoOffload) {
  const std::string swap = std::filesystem::temp_directory_path() / ("zinf-bench-step-" + std::to_string(::getpid()));
  std::filesystem::create_directories(swap);
  Result r = run("bench step --json --profile --steps 3 --config " + kConfigs + "/tiny.json --set model.n_layer=2 --set model.d_model=32"
                 " --set model.n_head=2 --set model.seq_len=32 --set train_micro_batch_size_per_gpu=2 --set device.threads=1"
                 " --set zero_optimization.stage=3 --set zero_optimization.offload_optimizer.device=nvme"
                 " --set zero_optimization.offload_param.device=cpu --set zero_optimization.offload_optimizer.nvme_path=" + swap);
  ASSERT_EQ(r.rc, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_GE(j["overlap_ratio"].get<double>(), 0.5);
  EXPECT_GT(j["busy_s"]["compute"].get<double>(), 0.0);
  EXPECT_GT(j["busy_s"]["nvme_read"].get<double>(), 0.0);
  EXPECT_GT(j["relative_to_no_offload"].get<double>(), 0.0);
  EXPECT_EQ(j["params_digest"], j["no_offload_params_digest"]);  // the profiled run's math is the plain run's
  // --profile: the model's ops by kind, slowest first, each a share of the step.
  ASSERT_GE(j["profile"].size(), 8u) << j.dump();
  double share = 0;
  for (const auto& o : j["profile"]) share += o["share_of_step"].get<double>();
  EXPECT_GT(share, 0.0);
  EXPECT_LE(share, 1.05);
  bool gemm = false;
  for (const auto& o : j["profile"])
    if (o["op"] == "gemm mlp up") gemm = o["tflops"].get<double>() > 0 && o["calls_per_step"].get<double>() == 4;
  EXPECT_TRUE(gemm) << j["profile"].dump();
  EXPECT_TRUE(std::filesystem::is_empty(swap));
  std::filesystem::remove_all(swap);
}

TEST(Cli, CheckpointResumeAndExport) {
  const std::string dir = std::filesystem::temp_directory_path() / ("zinf-cli-ck-" + std::to_string(::getpid()));
  const std::string small = " --set model.n_layer=1 --set model.d_model=32 --set model.n_head=2 --set model.seq_len=32"
                            " --set train_micro_batch_size_per_gpu=2 --set train.eval_batches=1 --set device.threads=1"
                            " --set train.checkpoint_interval=2 --set train.checkpoint_dir=\"" + dir + "\"";
  Result full = run("train --json --config " + kConfigs + "/tiny.json --set train.steps=6" + small);
  ASSERT_EQ(full.rc, 0) << full.err;
  std::filesystem::remove_all(dir);
  ASSERT_EQ(run("train --json --config " + kConfigs + "/tiny.json --set train.steps=3" + small).rc, 0);
  Result resumed = run("train --json --resume --config " + kConfigs + "/tiny.json --set train.steps=6" + small);
  ASSERT_EQ(resumed.rc, 0) << resumed.err;
  auto jr = nlohmann::json::parse(resumed.out);
  EXPECT_EQ(jr["resumed_from"], 3);
  EXPECT_EQ(jr["params_digest"], nlohmann::json::parse(full.out)["params_digest"]);
  const std::string out = dir + "/model.safetensors";
  Result ex = run("export --checkpoint " + dir + "/step-00000006 --dtype bf16 -o " + out);
  ASSERT_EQ(ex.rc, 0) << ex.err;
  EXPECT_GT(std::filesystem::file_size(out), 8u);
  Result bad = run("export --checkpoint " + dir + "/step-99999999 -o " + out);
  EXPECT_EQ(bad.rc, 2);  // a missing checkpoint is bad input
  EXPECT_EQ(lines(bad.err), 1u) << bad.err;
  EXPECT_NE(bad.err.find("step-99999999/manifest.json"), std::string::npos) << bad.err;
  EXPECT_EQ(run("export --checkpoint " + dir + "/step-00000006 --dtype int8 -o " + out).rc, 2);
  std::filesystem::remove_all(dir);
}

TEST(Cli, TrainErrorsAreOneLine) {
  Result r = run("train --config " + kConfigs + "/tiny.json --set data.path=/nonexistent/corpus.txt");
  EXPECT_EQ(r.rc, 2);
  EXPECT_EQ(lines(r.err), 1u) << r.err;
  EXPECT_NE(r.err.find("/nonexistent/corpus.txt: data file does not exist"), std::string::npos) << r.err;
  r = run("train --config " + kConfigs + "/tiny.json --set device.memory_budget=\"1MiB\"");
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(lines(r.err), 1u) << r.err;
  EXPECT_NE(r.err.find("device memory budget exceeded"), std::string::npos) << r.err;
}

TEST(Cli, BrokenConfigIsRefusedWithOneLine) {
  const std::string bad = std::filesystem::temp_directory_path() / ("zinf-bad-" + std::to_string(::getpid()) + ".json");
  std::ofstream(bad) << R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "offload_optimzer": {}}})";
  Result r = run("plan --config " + bad);
  EXPECT_EQ(r.rc, 2);
  EXPECT_EQ(lines(r.err), 1u) << r.err;
  EXPECT_NE(r.err.find("zero_optimization.offload_optimzer: unknown key (did you mean offload_optimizer?)"),
            std::string::npos)
      << r.err;
  std::filesystem::remove(bad);
  r = run("plan --config /nonexistent.json");
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("/nonexistent.json: cannot open config file"), std::string::npos) << r.err;
  r = run("plan --config " + kConfigs + "/tiny.json --set zero_optimization.stage=9");
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("zero_optimization.stage"), std::string::npos) << r.err;
}

// What a user gets wrong is found before any training, with one line and exit code 2.
TEST(Cli, FailuresAreFoundBeforeTraining) {
  const std::string small = " --set model.n_layer=1 --set model.d_model=32 --set model.n_head=2 --set model.seq_len=32"
                            " --set train_micro_batch_size_per_gpu=2 --set train.eval_batches=1 --set device.threads=1";
  Result r = run("train --config " + kConfigs + "/tiny.json --set train.steps=40 --set train.checkpoint_dir=/proc/zinf-ck" + small);
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("train.checkpoint_dir /proc/zinf-ck: cannot"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("step "), std::string::npos) << r.out;  // not one step ran
  EXPECT_EQ(lines(r.err), 1u) << r.err;
  r = run("train --config " + kConfigs + "/tiny.json --set zero_optimization.stage=3"
          " --set zero_optimization.offload_optimizer.device=nvme --set zero_optimization.offload_optimizer.nvme_path=/proc/zinf-swap" + small);
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("zero_optimization.offload_optimizer.nvme_path /proc/zinf-swap: cannot"), std::string::npos) << r.err;
  r = run("train --config " + std::filesystem::temp_directory_path().string());
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("is a directory, not a config file"), std::string::npos) << r.err;
}

TEST(Cli, ResumePastTheLastStepIsAnErrorAndEvalReportsTheCheckpointsLoss) {
  const std::string dir = std::filesystem::temp_directory_path() / ("zinf-cli-eval-" + std::to_string(::getpid()));
  const std::string small = " --set model.n_layer=1 --set model.d_model=32 --set model.n_head=2 --set model.seq_len=32"
                            " --set train_micro_batch_size_per_gpu=2 --set train.eval_batches=3 --set device.threads=1"
                            " --set train.checkpoint_dir=\"" + dir + "\"";
  Result t = run("train --json --config " + kConfigs + "/tiny.json --set train.steps=4" + small);
  ASSERT_EQ(t.rc, 0) << t.err;
  const auto jt = nlohmann::json::parse(t.out);
  // zinf eval of that checkpoint: the loss the run ended with, on the same validation windows.
  Result e = run("eval --json --config " + kConfigs + "/tiny.json --checkpoint latest" + small);
  ASSERT_EQ(e.rc, 0) << e.err;
  const auto je = nlohmann::json::parse(e.out);
  EXPECT_EQ(je["val_loss"].get<double>(), jt["val_loss"].get<double>());
  EXPECT_EQ(je["params_digest"], jt["params_digest"]);
  EXPECT_EQ(je["of"], "checkpoint step 4");
  // Resuming it with fewer steps than it has is refused.
  Result r = run("train --config " + kConfigs + "/tiny.json --set train.steps=2 --resume" + small);
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("the checkpoint is at step 4, past train.steps 2"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("final step="), std::string::npos) << r.out;
  std::filesystem::remove_all(dir);
}

TEST(Cli, PlanMeasuresAMissingNvmePathWhereItWillBeCreatedAndRefusesAnUnwritableOne) {
  const std::string missing = std::filesystem::temp_directory_path() / ("zinf-plan-new-" + std::to_string(::getpid())) / "swap";
  auto plan = [&](const std::string& path) {
    return run("plan --config " + kConfigs + "/6.7b-nvme.json --set zero_optimization.offload_optimizer.nvme_path=\"" + path + "\"");
  };
  Result r = plan(missing);
  EXPECT_NE((r.out + r.err).find("does not exist yet: zinf train creates it"), std::string::npos) << r.out;
  EXPECT_FALSE(std::filesystem::exists(missing));  // plan only looks
  EXPECT_NE(r.out.find("nvme "), std::string::npos);
  r = plan("/proc/zinf-plan-x");
  EXPECT_NE(r.out.find("DOES NOT FIT"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("is not a directory this user can write to"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("inf%"), std::string::npos) << r.out;
}

}  // namespace
