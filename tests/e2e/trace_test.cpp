// trace_test.cpp — the timeline of a run (train.trace_file, `zinf bench step --trace`; docs/trace.md):
// the file is a valid Chrome trace, it holds the steps it says, and per resource its spans add up to
// the busy time the same run reports — bench step's busy_s over its measured steps, and the metrics
// file's busy_s step by step — on the synchronous CPU device and on the asynchronous, jittered one
// with the optimizer states on NVMe (so every stream, both host workers and a disk have spans).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/temp_dir.h"
#include "shell.h"
#include "trace_check.h"

namespace zinf::test {
namespace {

Result run(const std::string& args) { return sh(std::string(ZINF_BIN) + " " + args); }

// A model small enough that a step takes milliseconds, with the optimizer states in host memory.
const std::string kSmall = " --config " + kTinyConfig +
                           " --set model.n_layer=2 --set model.d_model=32 --set model.n_head=2 --set model.seq_len=32"
                           " --set train_micro_batch_size_per_gpu=2 --set device.threads=1"
                           " --set zero_optimization.offload_optimizer.device=cpu";

TEST(TraceFile, BenchStepSpansAddUpToItsBusyTimes) {
  TempDir dir("trace-bench");
  const std::string file = dir / "step.json";
  const Result r = run("bench step --json --no-baseline --steps 4 --trace " + file + kSmall);
  ASSERT_EQ(r.rc, 0) << r.err;
  const json b = json::parse(r.out);
  EXPECT_EQ(b["trace_file"], file);
  TrackNames names;
  const json t = load_trace(file, names);
  ASSERT_FALSE(HasFatalFailure());
  // Every step, the warm-up too; bench step measures from the second.
  EXPECT_EQ(t["zinf"]["steps"], json({1, 2, 3, 4}));
  ASSERT_EQ(t["zinf"]["measured_from"], 2);
  ASSERT_EQ(b["steps_measured"], 3);
  const auto busy = busy_from_spans(t, names, [](std::int64_t step) { return step >= 2; });
  const double steps = b["steps_measured"].get<double>();
  for (const auto& [name, per_step] : b["busy_s"].items()) {
    const double reported = per_step.get<double>() * steps;
    expect_agree(busy.count(name) ? busy.at(name) : 0.0, reported, name);
  }
  EXPECT_GT(busy.at("compute"), 0.0);
  EXPECT_GT(busy.at("host"), 0.0);
  // The tracks and supernodes of an offloaded optimizer: the model's passes per unit on compute, the
  // gradients out on d2h, the new parameters in on h2d, the Reduce and the Update on the host workers.
  const auto spans = span_names(t, names);
  EXPECT_EQ(spans.at("compute"), (std::set<std::string>{"forward", "backward"}));
  EXPECT_TRUE(spans.at("d2h").count("GradOut"));
  EXPECT_TRUE(spans.at("h2d").count("Upload"));
  EXPECT_TRUE(spans.at("Reduce worker").count("Reduce"));
  EXPECT_TRUE(spans.at("Update worker").count("Update"));
}

TEST(TraceFile, TrainSpansAddUpToEachStepsBusyTimesAsync) {
  TempDir dir("trace-train");
  const std::string file = dir / "run.json", metrics = dir / "metrics.jsonl";
  // Parameters in host memory (Fetch), optimizer states on NVMe (a disk), the model's ops as stream
  // work with every job jittered, an evaluation between steps (its busy time in no step), and a
  // trace of the first 3 of 5 steps.
  const Result r = run("train" + kSmall + " --set train.steps=5 --set zero_optimization.stage=3" +
                       " --set zero_optimization.offload_optimizer.device=nvme" +
                       " --set zero_optimization.offload_optimizer.nvme_path=\"" + (dir / "swap") + "\"" +
                       " --set zero_optimization.offload_param.device=cpu --set device.async=true" +
                       " --set device.jitter_seed=7 --set train.eval_interval=2 --set train.eval_batches=1" +
                       " --set train.trace_steps=3 --set train.trace_file=\"" + file + "\"" +
                       " --set train.metrics_file=\"" + metrics + "\"");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("trace: steps 1-3 in " + file), std::string::npos) << r.out;
  TrackNames names;
  const json t = load_trace(file, names);
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_EQ(t["zinf"]["steps"], json({1, 2, 3}));
  const auto reported = metrics_busy(metrics);
  ASSERT_EQ(reported.size(), 5u);
  std::set<std::int64_t> traced;
  for (const json& e : t["traceEvents"])
    if (e["ph"] == "X") traced.insert(e["args"]["step"].get<std::int64_t>());
  EXPECT_EQ(traced, (std::set<std::int64_t>{1, 2, 3})) << "only the first trace_steps steps";
  expect_spans_match_metrics(t, names, reported);
  const auto spans = span_names(t, names);
  EXPECT_EQ(spans.at("compute"), (std::set<std::string>{"forward", "backward"}));
  EXPECT_TRUE(spans.at("h2d").count("Fetch"));
  EXPECT_TRUE(spans.at("d2h").count("GradOut"));
  EXPECT_TRUE(spans.at("Update worker").count("Update"));
  bool disk = false, queue = false;
  for (const auto& [track, what] : spans) {
    disk = disk || track.rfind("disk ", 0) == 0;
    // The optimizer store's queue: each sub-group's SwapIn and SwapOut, named by its tensor.
    if (track.rfind("optimizer states (disk ", 0) == 0)
      queue = what == std::set<std::string>{"SwapIn", "SwapOut"};
  }
  EXPECT_TRUE(disk) << "the optimizer states' disk has a track";
  EXPECT_TRUE(queue) << "the optimizer states' queue has SwapIn and SwapOut spans";
  std::set<std::string> tensors;
  for (const json& e : t["traceEvents"])
    if (e["ph"] == "X" && e["name"] == "SwapIn") tensors.insert(e["args"]["tensor"].get<std::string>());
  EXPECT_TRUE(tensors.count("unit 0.sg0")) << "a SwapIn names its sub-group";
}

TEST(TraceFile, AnUnwritablePathIsRefusedBeforeTheRun) {
  TempDir dir("trace-bad");
  const std::string metrics = dir / "metrics.jsonl";
  for (const std::string& bad : {dir.path.string(), dir / "missing/run.json"}) {
    const Result r = run("train" + kSmall + " --set train.steps=2 --set train.trace_file=\"" + bad + "\"" +
                         " --set train.metrics_file=\"" + metrics + "\"");
    EXPECT_EQ(r.rc, 2) << r.err;
    EXPECT_EQ(count(r.err, "zinf: "), 1u) << r.err;
    EXPECT_NE(r.err.find("zinf: train.trace_file " + bad + ": "), std::string::npos) << r.err;
    EXPECT_EQ((r.out + r.err).find("val_loss"), std::string::npos) << "nothing ran: " << r.err;
    EXPECT_FALSE(std::filesystem::exists(metrics)) << "nothing written before the refusal";
  }
  const Result r = run("bench step --no-baseline --steps 2 --trace " + (dir / "missing/step.json") + kSmall);
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_EQ(count(r.err, "zinf: "), 1u) << r.err;
  EXPECT_NE(r.err.find("zinf: --trace " + (dir / "missing/step.json") + ": "), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("bench step: "), std::string::npos) << "no run started: " << r.err;
}

}  // namespace
}  // namespace zinf::test
