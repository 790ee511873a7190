// cli_test.cpp — the `zinf` binary as a user runs it: help, version, exit codes, one-line errors,
// `info` and `plan` (text and --json) on every shipped config.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sys/stat.h>
#include <sys/statvfs.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "common/temp_dir.h"
#include "shell.h"

namespace zinf::test {
namespace {

Result run(const std::string& args) { return sh(std::string(ZINF_BIN) + " " + args); }

// The JSON object `zinf <args>` prints; the test fails (and the object is empty) when it exits non-zero.
nlohmann::json run_json(const std::string& args) {
  const Result r = run(args);
  EXPECT_EQ(r.rc, 0) << r.err;
  return r.rc == 0 ? nlohmann::json::parse(r.out) : nlohmann::json::object();
}

// The lines of stderr that are zinf's error lines (notes and progress may share stderr).
std::size_t error_lines(const std::string& s) {
  std::size_t n = s.rfind("zinf: ", 0) == 0 ? 1 : 0;
  for (std::size_t p = s.find("\nzinf: "); p != std::string::npos; p = s.find("\nzinf: ", p + 1)) ++n;
  return n;
}

const std::string kConfigs = std::string(ZINF_SOURCE_DIR) + "/configs";

// --set options for a model small enough that a step takes milliseconds, evaluated over
// `eval_batches` batches.
std::string small_model(int eval_batches = 1) {
  return " --set model.n_layer=1 --set model.d_model=32 --set model.n_head=2 --set model.seq_len=32"
         " --set train_micro_batch_size_per_gpu=2 --set train.eval_batches=" +
         std::to_string(eval_batches) + " --set device.threads=1";
}

TEST(Cli, HelpAndVersion) {
  Result r = run("--help");
  EXPECT_EQ(r.rc, 0);
  EXPECT_NE(r.out.find("info"), std::string::npos);
  EXPECT_NE(r.out.find("plan"), std::string::npos);
  r = run("--version");
  EXPECT_EQ(r.rc, 0);
  EXPECT_EQ(r.out.rfind("zinf ", 0), 0u);
  for (const char* sub :
       {"info", "plan", "train", "export", "bench adam", "bench nvme", "bench step", "bench pcie", "bench comm"}) {
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
    EXPECT_EQ(j["largest_fit"].size(), 6u);
    ++n;
  }
  EXPECT_GE(n, 6);
}

TEST(Cli, PlanWithOverride) {
  Result r = run("plan --json --config " + kConfigs + "/tiny.json --set model.n_layer=8");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["model"]["n_layer"], 8);
}

// `zinf plan --dataflow` prints the step of the configured placement: its supernodes with their
// resources and its edges with their handoffs; `--dot` the same for Graphviz. The placement decides
// what is drawn: the optimizer in host memory has a Reduce and an Upload, on NVMe a SwapIn and SwapOut.
TEST(Cli, PlanPrintsTheStepAsADataflow) {
  Result r = run("plan --dataflow --config " + kConfigs + "/tiny.json");
  ASSERT_EQ(r.rc, 0) << r.err;
  for (const char* s : {"step dataflow: offload_optimizer cpu, offload_param none", "GradOut(u)  [d2h stream]",
                        "Reduce(u)  [Reduce worker]", "Update(g)  [Update worker]", "Upload(g)  [h2d stream]",
                        "GradOut(u) -> Reduce(u)", "host wait"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  EXPECT_EQ(r.out.find("SwapIn(g)"), std::string::npos);
  r = run("plan --dataflow --config " + kConfigs + "/tiny.json --set zero_optimization.offload_optimizer.device=none");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("Update(g)  [device Update stream]"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("Reduce(u)"), std::string::npos);
  r = run("plan --dataflow --dot --config " + kConfigs + "/6.7b-nvme.json");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out.rfind("digraph step {", 0), 0u) << r.out;
  for (const char* s : {"label=\"SwapIn(g)\"", "label=\"SwapOut(g)\"", "label=\"Fetch(u)\"", "subgraph cluster_"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s;
  // --dot belongs to --dataflow, which is not --json: usage errors.
  for (const std::string args : {"plan --dot --config ", "plan --dataflow --json --config "}) {
    r = run(args + kConfigs + "/tiny.json");
    EXPECT_EQ(r.rc, 2) << args;
    EXPECT_EQ(lines(r.err), 1u) << r.err;
  }
}

// `zinf plan` and `zinf train` say which device device.type resolved to, and why: auto is the CPU
// device at this version, GPU or not.
TEST(Cli, PlanAndTrainPrintTheResolvedDevice) {
  const std::string cfg = "--config " + kConfigs + "/tiny.json --set device.type=\"auto\"";
  const auto j = run_json("plan --json " + cfg);
  EXPECT_EQ(j["device"]["type"], "cpu");
  EXPECT_EQ(j["device"]["reason"].get<std::string>().rfind("auto: ", 0), 0u) << j["device"];
  Result r = run("plan " + cfg);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("\ndevice     cpu (auto: "), std::string::npos) << r.out;
  r = run("train " + cfg + " --set train.steps=0" + small_model(1));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("\ndevice.type resolved: cpu (auto: "), std::string::npos) << r.out;
  r = run("plan --config " + kConfigs + "/tiny.json --set device.type=\"cuda\"");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("\ndevice     cuda (as configured)"), std::string::npos) << r.out;
  // device.comm nccl needs the CUDA device: with auto on the CPU device, one line and exit 2.
  r = run("plan " + cfg + " --set device.comm=\"nccl\"");
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("device.type auto is the CPU device"), std::string::npos) << r.err;
  EXPECT_EQ(lines(r.err), 1u) << r.err;
}

// `zinf plan` in each optimizer_states mode: the m and v rows carry the mode and shrink with it (with
// the states in host memory: 4, 2 and 1 byte per element plus the 8bit scales); a bad word is one line.
TEST(Cli, PlanShowsTheOptimizerStatesMode) {
  const std::string base = "plan --json --config " + kConfigs +
                           "/tiny.json --set zero_optimization.stage=2 --set zero_optimization.offload_optimizer.device=cpu";
  std::uint64_t m_bytes[3] = {};
  int k = 0;
  for (const char* mode : {"fp32", "bf16", "8bit"}) {
    const auto j = run_json(base + " --set zero_optimization.optimizer_states=" + mode);
    for (const auto& row : j["states"])
      if (row["name"] == "adam.m") {
        EXPECT_EQ(row["dtype"], mode);
        m_bytes[k] = row["bytes"]["host"].get<std::uint64_t>();
      }
    ++k;
  }
  EXPECT_EQ(m_bytes[1] * 2, m_bytes[0]);
  EXPECT_LE(m_bytes[2], m_bytes[0] / 4 + m_bytes[0] / 256 + 4096);  // (each unit rounds its arrays up)
  EXPECT_GT(m_bytes[2], m_bytes[0] / 4);
  const Result r = run(base + " --set zero_optimization.optimizer_states=int8");
  EXPECT_EQ(r.rc, 2);
  EXPECT_EQ(lines(r.err), 1u) << r.err;
  EXPECT_NE(r.err.find("zero_optimization.optimizer_states: 'int8' is not one of fp32, bf16, 8bit"), std::string::npos)
      << r.err;
}

TEST(Cli, BenchAdamReportsTheRatio) {
  auto j = run_json("bench adam --params 2M --threads 1 --reps 1 --json");
  EXPECT_GT(j["ratio"].get<double>(), 0.0);
  EXPECT_GT(j["fused"]["params_per_s"].get<double>(), 0.0);
  EXPECT_GT(j["memory_limit"]["gb_per_s"].get<double>(), 0.0);
  EXPECT_EQ(j["bytes_per_param"].get<double>(), 28.0);
  EXPECT_EQ(run_json("bench adam --params 2M --threads 1 --reps 1 --simd scalar --json")["simd"], "scalar");
  EXPECT_EQ(run("bench adam --params zero").rc, 2);
  const auto q8 = run_json("bench adam --params 2M --threads 1 --reps 1 --states 8bit --json");
  EXPECT_EQ(q8["states"], "8bit");
  EXPECT_EQ(q8["bytes_per_param"].get<double>(), 16.0625);
  EXPECT_GT(q8["ratio"].get<double>(), 0.0);
  EXPECT_FALSE(q8.contains("naive"));  // the plain loop knows fp32 states only
  EXPECT_EQ(run_json("bench adam --params 2M --threads 1 --reps 1 --states bf16 --json")["bytes_per_param"], 20.0);
  const Result bad = run("bench adam --states bf61");
  EXPECT_EQ(bad.rc, 2);
  EXPECT_NE(bad.err.find("did you mean bf16"), std::string::npos) << bad.err;
  const Result r = run("bench adam --help");
  EXPECT_NE(r.out.find("memory"), std::string::npos);
}

TEST(Cli, BenchNvmeSweepsAndCleansUp) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("zinf-bench-nvme-" + std::to_string(::getpid()));
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
  EXPECT_TRUE(std::filesystem::is_empty(dir));            // the private directory is gone
  r = run("bench nvme --path /nonexistent-zinf-dir --size 8M --cell 4M");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("/nonexistent-zinf-dir"), std::string::npos) << r.err;
  EXPECT_EQ(lines(r.err), 1u) << r.err;
  std::filesystem::remove_all(dir);
}

TEST(Cli, TrainPrintsConfigProgressAndTheFinalLine) {
  const std::string small = small_model(2);
  const std::string metrics =
      std::filesystem::temp_directory_path() / ("zinf-metrics-" + std::to_string(::getpid()) + ".jsonl");
  Result r = run("train --config " + kConfigs +
                 "/tiny.json --set train.steps=4 --set steps_per_print=2"
                 " --set wall_clock_breakdown=true --set train.metrics_file=\"" +
                 metrics + "\"" + small);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("optimizer.params.lr"), std::string::npos);  // the resolved config table
  EXPECT_NE(r.out.find("step     2/4 | loss"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fwd "), std::string::npos);
  EXPECT_NE(r.out.find("val_loss"), std::string::npos);
  const auto fin = r.out.find("final step=4 loss=");
  ASSERT_NE(fin, std::string::npos) << r.out;
  EXPECT_NE(r.out.find("params_digest=", fin), std::string::npos);
  EXPECT_EQ(lines(slurp(metrics)), 6u);  // the validation before the first step, 4 steps, the final validation
  std::filesystem::remove(metrics);
  // The same run twice gives the same digest; --json gives the summary on stdout.
  Result a = run("train --json --config " + kConfigs + "/tiny.json --set train.steps=2" + small);
  Result b = run("train --json --config " + kConfigs + "/tiny.json --set train.steps=2" + small);
  ASSERT_EQ(a.rc, 0) << a.err;
  auto ja = nlohmann::json::parse(a.out), jb = nlohmann::json::parse(b.out);
  EXPECT_EQ(ja["params_digest"], jb["params_digest"]);
  EXPECT_EQ(ja["steps"], 2);
}

// The host memory `zinf plan` predicts is what a run holds: the peak resident set of a small ZeRO-2
// run with the optimizer in host memory (on the CPU device, whose memory is host memory too) is at
// most 5% over the plan's prediction. The model's embedding (a wide vocabulary) makes the engine's
// host states the largest part of the process, so a buffer the plan misses, or one the run keeps beyond it,
// shows. Not timed: memory only.
TEST(Cli, PeakResidentSetIsWithinFivePercentOfThePlan) {
  const std::string cfg = "--config " + kConfigs +
                          "/tiny.json --set model.vocab_size=16384 --set model.n_layer=2 --set model.d_model=256"
                          " --set model.n_head=4 --set model.seq_len=32 --set train_micro_batch_size_per_gpu=2"
                          " --set bf16.enabled=true --set device.threads=1";
  const nlohmann::json plan = run_json("plan --json " + cfg);
  ASSERT_TRUE(plan.contains("host_memory"));
  const double predicted = plan["host_memory"]["predicted_peak_rss"].get<double>();
  EXPECT_EQ(plan["host_memory"]["device_in_host_memory"], plan["totals"]["device"]);
  // The engine's host states are the largest part of the prediction beside the program as loaded
  // (which, with the CUDA libraries linked, is larger than everything else).
  const double runtime = plan["host_memory"]["runtime"].get<double>();
  EXPECT_GT(plan["totals"]["host"].get<double>(), (predicted - runtime) / 3);
  const nlohmann::json r = run_json("train --json " + cfg + " --set train.steps=2 --set train.eval_batches=1");
  ASSERT_TRUE(r.contains("peak_rss_bytes"));
  // The two processes each measure the program as loaded, a few pages apart at most.
  EXPECT_NEAR(r["planned_rss_bytes"].get<double>(), predicted, 0.02 * predicted);
  const double peak = r["peak_rss_bytes"].get<double>();
  EXPECT_LE(peak, 1.05 * predicted) << "peak RSS " << peak << " B, plan " << predicted << " B";
  EXPECT_GE(peak, 0.5 * predicted) << "peak RSS " << peak << " B, plan " << predicted << " B";
}

TEST(Cli, BenchStepReportsOverlapAndMatchesNoOffload) {
  const std::string swap = std::filesystem::temp_directory_path() / ("zinf-bench-step-" + std::to_string(::getpid()));
  std::filesystem::create_directories(swap + "/params");
  auto j = run_json(
      "bench step --json --profile --steps 3 --config " + kConfigs +
      "/tiny.json --set model.n_layer=2"
      " --set model.d_model=32 --set model.n_head=2 --set model.seq_len=32 --set train_micro_batch_size_per_gpu=2"
      " --set device.threads=1 --set zero_optimization.stage=3 --set zero_optimization.offload_optimizer.device=nvme"
      " --set zero_optimization.offload_param.device=nvme --set zero_optimization.offload_optimizer.nvme_path=" +
      swap + " --set zero_optimization.offload_param.nvme_path=" + swap + "/params");
  EXPECT_GE(j["overlap_ratio"].get<double>(), 0.5);
  EXPECT_GT(j["busy_s"]["compute"].get<double>(), 0.0);
  // The optimizer and parameter stores, in two folders on one disk: one resource, busy once.
  ASSERT_EQ(j["disks"].size(), 1u) << j.dump();
  const auto& disk = j["disks"][0];
  const std::string name = "disk " + disk["name"].get<std::string>();
  EXPECT_EQ(j["busy_s"][name], disk["busy_s"]);
  EXPECT_GT(disk["busy_s"].get<double>(), 0.0);
  EXPECT_LE(disk["busy_s"].get<double>(), disk["read_plus_write_s"].get<double>() + 1e-9);
  EXPECT_GE(disk["busy_s"].get<double>() + 1e-9, std::max(disk["read_s"].get<double>(), disk["write_s"].get<double>()));
  // Bytes from the transfers: every step reads and writes each sub-group's master|m|v.
  EXPECT_GT(j["nvme_read_bytes_per_step"].get<double>(), 0.0);
  EXPECT_GT(j["nvme_write_bytes_per_step"].get<double>(), 0.0);
  EXPECT_EQ(j["nvme_read_bytes_per_step"], disk["read_bytes"]);
  EXPECT_EQ(j["nvme_write_bytes_per_step"], disk["write_bytes"]);
  // The busiest resource is named, and the ratio is taken against it.
  double most = 0;
  std::string busiest;
  for (const auto& [k, v] : j["busy_s"].items())
    if (v.get<double>() > most) most = v.get<double>(), busiest = k;
  EXPECT_EQ(j["busiest"], busiest);
  EXPECT_DOUBLE_EQ(j["busiest_s"].get<double>(), most);
  EXPECT_NEAR(j["overlap_ratio"].get<double>(), j["step_s"].get<double>() / most, 1e-9);
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
  EXPECT_TRUE(std::filesystem::is_empty(swap + "/params"));
  std::filesystem::remove(swap + "/params");
  EXPECT_TRUE(std::filesystem::is_empty(swap));
  std::filesystem::remove_all(swap);
}

// speculative: true and cpu_checkpointing in the config: bench step runs the placement without each
// for the two comparisons and the baseline with neither (the speculative Update needs the optimizer
// off the device, so a baseline that kept it would be refused), all to one digest.
TEST(Cli, BenchStepComparesTheSpeculativeUpdateAndHostCheckpoints) {
  auto j = run_json("bench step --json --steps 3 --config " + kConfigs +
                    "/tiny.json --set model.n_layer=2 --set model.d_model=32 --set model.n_head=2"
                    " --set model.seq_len=32 --set model.activation_checkpointing=true --set device.threads=1"
                    " --set zero_optimization.offload_optimizer.device=cpu --set gradient_clipping=1000"
                    " --set zero_optimization.offload_optimizer.speculative=true"
                    " --set activation_checkpointing.cpu_checkpointing=true");
  EXPECT_EQ(j["rollbacks"], 0) << "the clip never applies";
  EXPECT_GT(j["unspeculated_step_s"].get<double>(), 0.0);
  EXPECT_GT(j["unspeculated_overlap_ratio"].get<double>(), 0.0);
  ASSERT_TRUE(j.contains("cpu_checkpointing")) << j.dump();
  EXPECT_GT(j["cpu_checkpointing"]["copy_d2h_s"].get<double>(), 0.0);
  EXPECT_GT(j["cpu_checkpointing"]["device_bytes_saved"].get<double>(), 0.0);
  EXPECT_GT(j["relative_to_no_offload"].get<double>(), 0.0);
  for (const char* k : {"unspeculated_params_digest", "no_offload_params_digest"}) EXPECT_EQ(j["params_digest"], j[k]) << k;
  EXPECT_EQ(j["params_digest"], j["cpu_checkpointing"]["on_device_params_digest"]);
}

TEST(Cli, CheckpointResumeAndExport) {
  const std::string dir = std::filesystem::temp_directory_path() / ("zinf-cli-ck-" + std::to_string(::getpid()));
  const std::string small =
      small_model() + " --set train.checkpoint_interval=2 --set train.checkpoint_dir=\"" + dir + "\"";
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
  EXPECT_NE(bad.err.find("step-99999999: does not exist"), std::string::npos) << bad.err;
  EXPECT_EQ(run("export --checkpoint " + dir + "/step-00000006 --dtype int8 -o " + out).rc, 2);
  std::filesystem::remove_all(dir);
}

TEST(Cli, TrainErrorsAreOneLine) {
  Result r = run("train --config " + kConfigs + "/tiny.json --set data.path=/nonexistent/corpus.txt");
  EXPECT_EQ(r.rc, 2);
  EXPECT_EQ(lines(r.err), 1u) << r.err;
  EXPECT_NE(r.err.find("data.path /nonexistent/corpus.txt: does not exist"), std::string::npos) << r.err;
  r = run("train --config " + kConfigs + "/tiny.json --set device.memory_budget=\"1MiB\"");
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(lines(r.err), 1u) << r.err;
  EXPECT_NE(r.err.find("device memory budget exceeded"), std::string::npos) << r.err;
  // A newline in a path the error quotes is written as an escape: still one line.
  r = run("train --config " + kConfigs + "/tiny.json --set data.path='\"/nonexistent/two\\nlines.txt\"'");
  EXPECT_EQ(r.rc, 2);
  EXPECT_EQ(lines(r.err), 1u) << r.err;
  EXPECT_NE(r.err.find("data.path /nonexistent/two\\nlines.txt: does not exist"), std::string::npos) << r.err;
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
  EXPECT_NE(r.err.find("config file /nonexistent.json: does not exist"), std::string::npos) << r.err;
  r = run("plan --config " + kConfigs + "/tiny.json --set zero_optimization.stage=9");
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("zero_optimization.stage"), std::string::npos) << r.err;
}

// What a user gets wrong is found before any training, with one line and exit code 2.
TEST(Cli, FailuresAreFoundBeforeTraining) {
  const std::string small = small_model();
  Result r = run("train --config " + kConfigs +
                 "/tiny.json --set train.steps=40 --set train.checkpoint_dir=/proc/zinf-ck" + small);
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("train.checkpoint_dir /proc/zinf-ck: cannot"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("\nstep "), std::string::npos) << r.out;  // not one step ran (nor a step-0 evaluation)
  EXPECT_EQ(lines(r.err), 1u) << r.err;
  r = run("train --config " + kConfigs +
          "/tiny.json --set zero_optimization.stage=3"
          " --set zero_optimization.offload_optimizer.device=nvme --set "
          "zero_optimization.offload_optimizer.nvme_path=/proc/zinf-swap" +
          small);
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("zero_optimization.offload_optimizer.nvme_path /proc/zinf-swap: cannot"), std::string::npos)
      << r.err;
  r = run("train --config " + std::filesystem::temp_directory_path().string());
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("is a directory, not a config file"), std::string::npos) << r.err;
}

TEST(Cli, ResumePastTheLastStepIsAnErrorAndEvalReportsTheCheckpointsLoss) {
  const std::string dir = std::filesystem::temp_directory_path() / ("zinf-cli-eval-" + std::to_string(::getpid()));
  const std::string small = small_model(3) + " --set train.checkpoint_dir=\"" + dir + "\"";
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
  const std::string missing =
      std::filesystem::temp_directory_path() / ("zinf-plan-new-" + std::to_string(::getpid())) / "swap";
  auto plan = [&](const std::string& path) {
    return run("plan --config " + kConfigs + "/6.7b-nvme.json --set zero_optimization.offload_optimizer.nvme_path=\"" +
               path + "\"");
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

// ---------------------------------------------------------------------------------------------------
// Outputs appear whole or not at all; bad input files are refused with one line and exit code 2.

namespace fs = std::filesystem;

const std::string kSmall = small_model();

// The command under a file size limit of `kib` KiB, SIGXFSZ ignored: a write past it fails with
// EFBIG part way through, as a full disk fails with ENOSPC.
Result run_limited(int kib, const std::string& args) {
  return sh("(ulimit -f " + std::to_string(kib * 2) + "; trap '' XFSZ; exec " + std::string(ZINF_BIN) + " " + args +
            ")");
}

TEST(Cli, FolderExportReplacesTheOldExportWholeOrNotAtAll) {
  TempDir t("cli-hfexport");
  // d_ff 512: the MLP's matrices (64 KiB each in fp32) outgrow the embedding, so with 40 KB shards
  // the first shards are small and a later one large — the case where a full disk strikes part way.
  Result tr = run("train --config " + kConfigs +
                  "/tiny.json --set model.family=llama --set model.d_ff=512 --set train.steps=4"
                  " --set train.checkpoint_interval=2"
                  " --set train.checkpoint_dir=\"" +
                  t / "ck" + "\"" + kSmall);
  ASSERT_EQ(tr.rc, 0) << tr.err;
  const std::string ck = t / "ck/step-00000002", out = t / "out/hf";
  ASSERT_EQ(run("export --format hf --shard-size 10KB --checkpoint " + ck + " -o " + out).rc, 0);
  ASSERT_TRUE(fs::exists(out + "/model.safetensors.index.json"));
  std::ofstream(out + "/tokenizer.json") << "{}";
  Result one = run("export --format hf --checkpoint " + ck + " -o " + out);  // one file now
  ASSERT_EQ(one.rc, 0) << one.err;
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(out)) names.insert(e.path().filename().string());
  EXPECT_EQ(names,
            (std::set<std::string>{"config.json", "model.safetensors", "tokenizer.json"}));  // no old shard or index
  // A full disk part way: exit 1, one line, the folder as it was and nothing beside it.
  const auto before = snapshot(t / "out");
  Result full = run_limited(48, "export --format hf --shard-size 40KB --checkpoint " + ck + " -o " + out);
  EXPECT_EQ(full.rc, 1) << full.err;
  EXPECT_EQ(error_lines(full.err), 1u) << full.err;
  EXPECT_EQ(snapshot(t / "out"), before);
  // The output may not be what it is made from.
  Result self = run("export --format hf --checkpoint " + ck + " -o " + ck);
  EXPECT_EQ(self.rc, 2);
  EXPECT_NE(self.err.find("is the checkpoint folder"), std::string::npos) << self.err;
  Result holder = run("export --format hf --checkpoint " + ck + " -o " + t / "ck");
  EXPECT_EQ(holder.rc, 2);
  EXPECT_NE(holder.err.find("a folder holding the checkpoint"), std::string::npos) << holder.err;
  // A folder with config.json that is not an object, or impossible numbers in it: one line, exit 2.
  fs::create_directories(t / "bad");
  fs::copy_file(out + "/model.safetensors", t / "bad/model.safetensors");
  std::ofstream(t / "run.json")
      << nlohmann::json{{"train_batch_size", 2}, {"model", {{"init_from", t / "bad"}}}}.dump();
  for (const std::string& text : {std::string("[1,2]"), std::string("null"), std::string("42")}) {
    std::ofstream(t / "bad/config.json") << text;
    Result r = run("plan --config " + t / "run.json");
    EXPECT_EQ(r.rc, 2) << text << r.err;
    EXPECT_EQ(error_lines(r.err), 1u) << r.err;
    EXPECT_NE(r.err.find("config.json: expected a JSON object"), std::string::npos) << r.err;
  }
  // A folder holding both model.safetensors and an index with shards: model.safetensors is read, as
  // Hugging Face's loaders read it, and the log says so.
  ASSERT_EQ(run("export --format hf --checkpoint " + t / "ck/step-00000004" + " -o " + t / "single").rc, 0);
  ASSERT_EQ(run("export --format hf --shard-size 40KB --checkpoint " + ck + " -o " + t / "both").rc, 0);
  fs::copy_file(t / "single/model.safetensors", t / "both/model.safetensors");
  auto digest = [&](const std::string& folder) {
    std::ofstream(t / "eval.json") << nlohmann::json{{"train_batch_size", 2},
                                                     {"model", {{"init_from", folder}, {"seq_len", 32}}},
                                                     {"train", {{"eval_batches", 1}}},
                                                     {"device", {{"type", "cpu"}, {"threads", 1}}}}
                                          .dump();
    Result r = run("eval --json --config " + t / "eval.json");
    EXPECT_EQ(r.rc, 0) << r.err;
    return std::make_pair(nlohmann::json::parse(r.out)["params_digest"].get<std::string>(), r.err);
  };
  const auto [both, both_log] = digest(t / "both");
  EXPECT_EQ(both, digest(t / "single").first);
  EXPECT_NE(both, digest(out).first);  // step 2's weights differ from step 4's
  EXPECT_NE(both_log.find("(model.safetensors (model.safetensors.index.json beside it is ignored"), std::string::npos)
      << both_log;

  auto cfg = nlohmann::json::parse(slurp(out + "/config.json"));
  for (const auto& [key, value] : {std::pair<std::string, double>{"rms_norm_eps", -1}, {"rope_theta", -5}}) {
    auto c = cfg;
    c[key] = value;
    std::ofstream(t / "bad/config.json") << c.dump();
    Result r = run("plan --config " + t / "run.json");
    EXPECT_EQ(r.rc, 2) << key << r.err;
    EXPECT_NE(r.err.find("config.json: " + key + ": expected a positive number"), std::string::npos) << r.err;
  }
}

TEST(Cli, FileExportIsWholeOrNotAtAllAndBadWeightsExitTwo) {
  TempDir t("cli-stexport");
  ASSERT_EQ(run("train --config " + kConfigs +
                "/tiny.json --set train.steps=2 --set train.checkpoint_interval=2"
                " --set train.checkpoint_dir=\"" +
                t / "ck" + "\"" + kSmall)
                .rc,
            0);
  const std::string ck = t / "ck/step-00000002", out = t / "out/model.safetensors";
  fs::create_directories(t / "out");
  ASSERT_EQ(run("export --checkpoint " + ck + " -o " + out).rc, 0);
  const auto before = snapshot(t / "out");
  Result full = run_limited(8, "export --checkpoint " + ck + " -o " + out);
  EXPECT_EQ(full.rc, 1) << full.err;
  EXPECT_EQ(error_lines(full.err), 1u) << full.err;
  EXPECT_EQ(snapshot(t / "out"), before);  // the old file, and no temporary beside it
  const std::string states = slurp(ck + "/states.bin");
  Result self = run("export --checkpoint " + ck + " -o " + ck + "/states.bin");
  EXPECT_EQ(self.rc, 2);
  EXPECT_NE(self.err.find("is the checkpoint's"), std::string::npos) << self.err;
  EXPECT_EQ(slurp(ck + "/states.bin"), states);
  Result missing = run("export --checkpoint " + t / "ck/step-99999999" + " -o " + t / "x.safetensors");
  EXPECT_EQ(missing.rc, 2);
  EXPECT_NE(missing.err.find("--checkpoint " + t / "ck/step-99999999" + ": does not exist"), std::string::npos)
      << missing.err;

  const std::string eval = "eval --config " + kConfigs + "/tiny.json" + kSmall + " --weights ";
  Result none = run(eval + t / "nonexistent.safetensors");
  EXPECT_EQ(none.rc, 2);
  EXPECT_NE(none.err.find("model.init_from " + t / "nonexistent.safetensors" + ": does not exist"), std::string::npos)
      << none.err;
  std::ofstream(t / "junk.safetensors") << "not a safetensors file";
  Result junk = run(eval + t / "junk.safetensors");
  EXPECT_EQ(junk.rc, 2);
  EXPECT_NE(junk.err.find("invalid safetensors file"), std::string::npos) << junk.err;
  // A NaN in the first tensor (wte.weight): refused with the tensor named, not trained to nan.
  std::string bytes = slurp(out);
  std::uint64_t header = 0;
  std::memcpy(&header, bytes.data(), 8);
  const std::uint32_t nan_bits = 0x7fc00000u;
  std::memcpy(bytes.data() + 8 + header, &nan_bits, 4);
  std::ofstream(t / "nan.safetensors", std::ios::binary) << bytes;
  Result nan = run(eval + t / "nan.safetensors");
  EXPECT_EQ(nan.rc, 2);
  EXPECT_EQ(error_lines(nan.err), 1u) << nan.err;
  EXPECT_NE(nan.err.find("tensor wte.weight holds NaN at element 0"), std::string::npos) << nan.err;
}

TEST(Cli, TokenizeNeverReplacesItsInputAndLeavesNothingPartial) {
  TempDir t("cli-tokenize");
  std::ofstream(t / "a.txt") << std::string(5000, 'a');
  const std::string text = slurp(t / "a.txt");
  Result same = run("tokenize " + t / "a.txt" + " -o " + t / "a.txt");
  EXPECT_EQ(same.rc, 2);
  EXPECT_NE(same.err.find("--output " + t / "a.txt" + ": is the input"), std::string::npos) << same.err;
  EXPECT_EQ(slurp(t / "a.txt"), text);
  Result other = run("tokenize " + t / "a.txt" + " -o " + (t.path / "." / "a.txt").string());  // another spelling
  EXPECT_EQ(other.rc, 2);
  EXPECT_EQ(slurp(t / "a.txt"), text);
  ASSERT_EQ(run("tokenize " + t / "a.txt" + " -o " + t / "t.bin").rc, 0);
  std::ofstream(t / "b.txt") << std::string(20000, 'b');
  const auto before = snapshot(t.path);
  Result full = run_limited(8, "tokenize " + t / "b.txt" + " -o " + t / "t.bin");
  EXPECT_EQ(full.rc, 1) << full.err;
  EXPECT_EQ(snapshot(t.path), before);  // no .tmp file, the old token file as it was
  std::ofstream(t / "junk.model") << "not a model";
  Result junk = run("tokenize " + t / "a.txt" + " --tokenizer " + t / "junk.model" + " -o " + t / "u.bin");
  EXPECT_EQ(junk.rc, 2);
  EXPECT_EQ(error_lines(junk.err), 1u) << junk.err;
  EXPECT_NE(junk.err.find("--tokenizer " + t / "junk.model" + ": not a SentencePiece model"), std::string::npos)
      << junk.err;
  EXPECT_EQ(junk.err.find(".cc("), std::string::npos) << junk.err;
}

// A FIFO is refused, not waited on (the timeout only turns a regression into a failure, rc 124).
TEST(Cli, FifosAndDirectoriesAreRefusedWhereverAFileIsRead) {
  TempDir t("cli-fifo");
  ASSERT_EQ(::mkfifo((t / "fifo").c_str(), 0600), 0);
  const std::string bin = "timeout 60 " + std::string(ZINF_BIN) + " ";
  const std::string train = "train --config " + kConfigs + "/tiny.json --set train.steps=1" + kSmall;
  for (const std::string& args :
       {"tokenize " + t / "fifo" + " -o " + t / "o.bin", train + " --set data.path=\"" + t / "fifo" + "\"",
        train + " --set model.init_from=\"" + t / "fifo" + "\"", "plan --config " + t / "fifo"}) {
    Result r = sh(bin + args);
    EXPECT_EQ(r.rc, 2) << args << "\n" << r.err;
    EXPECT_EQ(error_lines(r.err), 1u) << r.err;
    EXPECT_NE(r.err.find(t / "fifo" + ": is a FIFO"), std::string::npos) << r.err;
  }
  std::ofstream(t / "text.txt") << std::string(4000, 'x');
  Result dir =
      run(train + " --set data.path=\"" + t / "text.txt" + "\" --set data.tokenizer=\"" + t.path.string() + "\"");
  EXPECT_EQ(dir.rc, 2);
  EXPECT_EQ(error_lines(dir.err), 1u) << dir.err;
  // A folder is a model folder to data.tokenizer: one without a tokenizer file is refused, saying so.
  EXPECT_NE(dir.err.find("data.tokenizer " + t.path.string() + ": the folder holds neither tokenizer.json nor"),
            std::string::npos)
      << dir.err;
}

TEST(Cli, AMetricsFileOrLogThatCannotBeWrittenIsAnError) {
  const std::string train = "train --config " + kConfigs + "/tiny.json --set train.steps=2" + kSmall;
  Result m = run(train + " --set train.metrics_file=/dev/full");
  EXPECT_EQ(m.rc, 1);
  EXPECT_NE(m.err.find("train.metrics_file /dev/full: write failed (No space left on device)"), std::string::npos)
      << m.err;
  Result log = sh("(" + std::string(ZINF_BIN) + " " + train + " >/dev/full)");
  EXPECT_EQ(log.rc, 1);
  EXPECT_NE(log.err.find("stdout: cannot write the progress log (No space left on device)"), std::string::npos)
      << log.err;
}

// A run whose NVMe stores do not fit the free space under nvme_path is refused with one line naming
// the path and the bytes, before anything is created: the model is scaled (n_layer) until `zinf plan`
// puts more NVMe bytes there than the whole filesystem holds. Under a file size limit, so that a run
// that went ahead anyway would fail at its first large reservation instead of filling the disk.
TEST(Cli, TrainRefusesNvmeStoresLargerThanTheFreeSpaceBeforeCreatingAnything) {
  const fs::path parent = fs::temp_directory_path() / ("zinf-cli-space-" + std::to_string(::getpid()));
  const std::string swap = (parent / "swap").string();
  const std::string paths = " --set zero_optimization.offload_optimizer.nvme_path=\"" + swap +
                            "\" --set zero_optimization.offload_param.nvme_path=\"" + swap + "\"";
  const std::string config = "--config " + kConfigs + "/6.7b-stream-nvme.json" + paths;
  auto nvme_bytes = [&](int n_layer) {
    const auto j = run_json("plan --json " + config + " --set model.n_layer=" + std::to_string(n_layer));
    return j.empty() ? 0.0 : j["totals"]["nvme"].get<double>();
  };
  struct statvfs v {};
  ASSERT_EQ(::statvfs(fs::temp_directory_path().c_str(), &v), 0);
  const double disk = static_cast<double>(v.f_blocks) * static_cast<double>(v.f_frsize);
  const double two = nvme_bytes(2), per_layer = (nvme_bytes(4) - two) / 2;
  ASSERT_GT(per_layer, 0);
  const int n_layer = 2 + static_cast<int>(std::ceil(std::max(0.0, disk - two) / per_layer)) + 1;
  ASSERT_GT(nvme_bytes(n_layer), disk) << n_layer;
  const Result r = run_limited(64 << 10, "train " + config + " --set model.n_layer=" + std::to_string(n_layer));
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_EQ(error_lines(r.err), 1u) << r.err;
  EXPECT_NE(r.err.find("zero_optimization.offload_optimizer.nvme_path " + swap +
                       " and zero_optimization.offload_param.nvme_path " + swap + ": the NVMe stores need "),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find(" GiB is free, one filesystem (measured at " + fs::temp_directory_path().string()),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.out.find("\nstep "), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(parent));  // neither nvme_path nor its parent was created
  fs::remove_all(parent);
}

}  // namespace
}  // namespace zinf::test
