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

namespace zinf::test {
namespace {

using nlohmann::json;

Result run(const std::string& args) { return sh(std::string(ZINF_BIN) + " " + args); }

// A model small enough that a step takes milliseconds, with the optimizer states in host memory.
const std::string kSmall = " --config " + kTinyConfig +
                           " --set model.n_layer=2 --set model.d_model=32 --set model.n_head=2 --set model.seq_len=32"
                           " --set train_micro_batch_size_per_gpu=2 --set device.threads=1"
                           " --set zero_optimization.offload_optimizer.device=cpu";

// Checks the Chrome-trace shape of `t`: every event has the fields its phase needs, complete events a
// non-negative duration and a step, and every process and thread a complete event uses is named.
// Sets the name of each (pid, tid) track.
using TrackNames = std::map<std::pair<int, int>, std::string>;
void check_chrome_trace(const json& t, TrackNames& threads) {
  ASSERT_TRUE(t.is_object());
  ASSERT_TRUE(t.contains("traceEvents") && t["traceEvents"].is_array());
  std::set<int> processes;
  std::set<std::pair<int, int>> used;
  for (const json& e : t["traceEvents"]) {
    ASSERT_TRUE(e.contains("name") && e["name"].is_string()) << e.dump();
    ASSERT_TRUE(e.contains("ph") && e["ph"].is_string()) << e.dump();
    ASSERT_TRUE(e.contains("pid") && e["pid"].is_number_integer()) << e.dump();
    ASSERT_TRUE(e.contains("args") && e["args"].is_object()) << e.dump();
    const int pid = e["pid"].get<int>();
    if (e["ph"] == "X") {
      ASSERT_TRUE(e.contains("tid") && e["tid"].is_number_integer()) << e.dump();
      ASSERT_TRUE(e.contains("ts") && e["ts"].is_number()) << e.dump();
      ASSERT_TRUE(e.contains("dur") && e["dur"].is_number()) << e.dump();
      EXPECT_GE(e["ts"].get<double>(), 0.0) << e.dump();
      EXPECT_GE(e["dur"].get<double>(), 0.0) << e.dump();
      EXPECT_TRUE(e["args"].contains("step") && e["args"]["step"].is_number_integer()) << e.dump();
      used.insert({pid, e["tid"].get<int>()});
    } else {
      ASSERT_EQ(e["ph"], "M") << e.dump();
      const std::string n = e["name"].get<std::string>();
      if (n == "process_name") processes.insert(pid);
      if (n == "thread_name") threads[{pid, e["tid"].get<int>()}] = e["args"]["name"].get<std::string>();
      EXPECT_TRUE(n == "process_name" || n == "thread_name" || n == "process_sort_index" || n == "thread_sort_index")
          << e.dump();
    }
  }
  for (const auto& [pid, tid] : used) {
    EXPECT_TRUE(processes.count(pid)) << "process " << pid << " is not named";
    EXPECT_TRUE(threads.count({pid, tid})) << "thread " << pid << "/" << tid << " is not named";
  }
}

// The seconds covered by a set of intervals, each instant once.
double union_seconds(std::vector<std::pair<double, double>> iv) {
  std::sort(iv.begin(), iv.end());
  double total = 0, end = -1e300;
  for (const auto& [a, b] : iv) {
    if (b <= end) continue;
    total += b - std::max(a, end);
    end = b;
  }
  return 1e-6 * total;
}

// Busy seconds per resource from the spans of the steps `keep` accepts, named as the run reports
// them: a device stream and a disk by their track ("compute", "disk vda"), the host workers together
// as "host". A stream or a disk is busy while any of its spans is open (the union); the host's busy
// time is its workers' times added up, as the engine counts it (two workers at once count twice).
template <class Keep>
std::map<std::string, double> busy_from_spans(const json& t, const TrackNames& names, Keep keep) {
  std::map<std::string, std::vector<std::pair<double, double>>> spans;
  std::map<std::string, double> busy;
  for (const json& e : t["traceEvents"]) {
    if (e["ph"] != "X" || !keep(e["args"]["step"].get<std::int64_t>())) continue;
    const double ts = e["ts"].get<double>(), dur = e["dur"].get<double>();
    if (e["pid"] == 2) {  // the host's threads
      busy["host"] += 1e-6 * dur;
      continue;
    }
    spans[names.at({e["pid"].get<int>(), e["tid"].get<int>()})].push_back({ts, ts + dur});
  }
  for (const auto& [name, iv] : spans) busy[name] = union_seconds(iv);
  return busy;
}

// Within 1 % (and a nanosecond, for the rounding of a time of zero or a few microseconds).
void expect_agree(double from_spans, double reported, const std::string& what) {
  EXPECT_LE(std::abs(from_spans - reported), 0.01 * reported + 1e-9)
      << what << ": spans " << from_spans << " s, reported " << reported << " s";
}

// The names of the spans on each track.
std::map<std::string, std::set<std::string>> span_names(const json& t, const TrackNames& names) {
  std::map<std::string, std::set<std::string>> out;
  for (const json& e : t["traceEvents"])
    if (e["ph"] == "X") out[names.at({e["pid"].get<int>(), e["tid"].get<int>()})].insert(e["name"]);
  return out;
}

TEST(TraceFile, BenchStepSpansAddUpToItsBusyTimes) {
  TempDir dir("trace-bench");
  const std::string file = dir / "step.json";
  const Result r = run("bench step --json --no-baseline --steps 4 --trace " + file + kSmall);
  ASSERT_EQ(r.rc, 0) << r.err;
  const json b = json::parse(r.out);
  EXPECT_EQ(b["trace_file"], file);
  const json t = json::parse(slurp(file));
  TrackNames names;
  check_chrome_trace(t, names);
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
  const json t = json::parse(slurp(file));
  TrackNames names;
  check_chrome_trace(t, names);
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_EQ(t["zinf"]["steps"], json({1, 2, 3}));
  std::map<std::int64_t, json> reported;  // the metrics file's busy_s per step
  std::istringstream lines_in(slurp(metrics));
  for (std::string line; std::getline(lines_in, line);) {
    const json m = json::parse(line);
    if (m.contains("busy_s")) reported[m["step"].get<std::int64_t>()] = m["busy_s"];
  }
  ASSERT_EQ(reported.size(), 5u);
  std::set<std::int64_t> traced;
  for (const json& e : t["traceEvents"])
    if (e["ph"] == "X") traced.insert(e["args"]["step"].get<std::int64_t>());
  EXPECT_EQ(traced, (std::set<std::int64_t>{1, 2, 3})) << "only the first trace_steps steps";
  for (std::int64_t step = 1; step <= 3; ++step) {
    const auto busy = busy_from_spans(t, names, [&](std::int64_t s) { return s == step; });
    for (const auto& [name, sec] : reported[step].items())
      expect_agree(busy.count(name) ? busy.at(name) : 0.0, sec.get<double>(),
                   "step " + std::to_string(step) + " " + name);
    for (const auto& [name, sec] : busy)
      EXPECT_TRUE(reported[step].contains(name)) << "step " << step << ": spans on " << name << ", no busy figure";
  }
  const auto spans = span_names(t, names);
  EXPECT_EQ(spans.at("compute"), (std::set<std::string>{"forward", "backward"}));
  EXPECT_TRUE(spans.at("h2d").count("Fetch"));
  EXPECT_TRUE(spans.at("d2h").count("GradOut"));
  EXPECT_TRUE(spans.at("Update worker").count("Update"));
  bool disk = false;
  for (const auto& [track, what] : spans) disk = disk || track.rfind("disk ", 0) == 0;
  EXPECT_TRUE(disk) << "the optimizer states' disk has a track";
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
}

}  // namespace
}  // namespace zinf::test
