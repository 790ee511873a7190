// monitor_test.cpp — DeepSpeed's tensorboard / csv_monitor / flops_profiler sections and zinf's
// monitor section: how they are read, the CSV files' content, and a `zinf train` run of
// configs/tiny.json (shrunk) whose event files TensorBoard's EventAccumulator reads back equal to the
// CSV files and the metrics file.
#include "app/train/monitor.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "app/config/config.h"
#include "common/checkers.h"
#include "common/error_of.h"
#include "common/temp_dir.h"
#include "e2e/shell.h"
#include "zinf/error.h"

namespace zinf {
namespace {

const char* kBase = R"({"train_batch_size": 4, "model": {"preset": "gpt2-124m"})";

Config parse(const std::string& extra) {
  return parse_config(std::string(kBase) + (extra.empty() ? "" : ", " + extra) + "}");
}

std::string config_error(const std::string& extra) {
  return test::error_of<ConfigError>([&] { parse(extra); });
}

TEST(MonitorConfig, DeepSpeedSectionsNameTheFolder) {
  Config c = parse(R"("tensorboard": {"enabled": true, "output_path": "out/logs/", "job_name": "train_bert"},
                      "csv_monitor": {"enabled": true})");
  EXPECT_EQ(c.monitor.tensorboard_dir, "out/logs/train_bert");
  EXPECT_EQ(c.monitor.csv_dir, "DeepSpeedJobName");  // DeepSpeed's defaults: "" joined with DeepSpeedJobName
  c = parse(R"("tensorboard": {"enabled": false, "output_path": "x"}, "csv_monitor": {})");
  EXPECT_EQ(c.monitor.tensorboard_dir, "");
  EXPECT_EQ(c.monitor.csv_dir, "");
  c = parse(R"("monitor": {"tensorboard_dir": "tb", "csv_dir": "csv"})");
  EXPECT_EQ(c.monitor.tensorboard_dir, "tb");
  EXPECT_EQ(c.monitor.csv_dir, "csv");
  const auto resolved = nlohmann::json::parse(c.resolved_json);
  EXPECT_EQ(resolved["monitor"]["tensorboard_dir"], "tb");
  for (const auto& n : c.notes) EXPECT_EQ(n.find("tensorboard"), std::string::npos) << n;  // no "no effect" note
}

TEST(MonitorConfig, BadKeysAndValuesAreOneError) {
  EXPECT_NE(config_error(R"("tensorboard": {"enabled": true, "outputpath": "x"})")
                .find("tensorboard.outputpath: unknown key (did you mean output_path?)"),
            std::string::npos);
  EXPECT_NE(config_error(R"("csv_monitor": {"enabled": "yes"})").find("csv_monitor.enabled: expected true or false"),
            std::string::npos);
  EXPECT_NE(config_error(R"("tensorboard": {"enabled": true, "job_name": 3})").find("tensorboard.job_name"),
            std::string::npos);
  EXPECT_NE(config_error(R"("tensorboard": {"enabled": true}, "monitor": {"tensorboard_dir": "tb"})")
                .find("monitor.tensorboard_dir: 'tensorboard.enabled' names this folder too"),
            std::string::npos);
  EXPECT_NE(config_error(R"("monitor": {"csv": "x"})").find("monitor.csv: unknown key"), std::string::npos);
  EXPECT_NE(config_error(R"("flops_profiler": {"enabled": true, "profile_step": -1})")
                .find("flops_profiler.profile_step: value -1 is out of range"),
            std::string::npos);
  EXPECT_NE(config_error(R"("flops_profiler": {"enabled": true, "top_modules": 0})").find("flops_profiler.top_modules"),
            std::string::npos);
  EXPECT_NE(config_error(R"("flops_profiler": {"enabled": true, "outputfile": "x"})")
                .find("flops_profiler.outputfile: unknown key (did you mean output_file?)"),
            std::string::npos);
}

TEST(MonitorConfig, FlopsProfilerTakesDeepSpeedsKeys) {
  const Config c = parse(R"("train": {"steps": 10}, "flops_profiler": {"enabled": true, "profile_step": 3,
      "module_depth": -1, "top_modules": 1, "detailed": true, "output_file": null, "recompute_fwd_factor": 0.0})");
  EXPECT_TRUE(c.flops_profiler.enabled);
  EXPECT_EQ(c.flops_profiler.profile_step, 3);
  EXPECT_EQ(c.flops_profiler.output_file, "");
  bool noted = false;  // the per-module keys have no meaning for zinf's by-kind table: one note each
  for (const auto& n : c.notes) noted = noted || n.rfind("flops_profiler.module_depth:", 0) == 0;
  EXPECT_TRUE(noted);
  const Config late = parse(R"("train": {"steps": 3}, "flops_profiler": {"enabled": true, "profile_step": 3})");
  bool never = false;
  for (const auto& n : late.notes) never = never || n.find("no profile is printed") != std::string::npos;
  EXPECT_TRUE(never);
}

TEST(CsvScalars, OneFilePerTagWithAHeaderOnce) {
  test::TempDir dir("csv-scalars");
  {
    CsvScalars csv(dir.path.string());
    csv.write(8, {{"Train/Samples/train_loss", 5.5}, {"Train/Samples/lr", 0.001}});
    csv.write(16, {{"Train/Samples/train_loss", 1.0 / 3}});
  }
  {  // a resumed run appends below the header
    CsvScalars csv(dir.path.string());
    csv.write(24, {{"Train/Samples/train_loss", -2e-10}});
  }
  EXPECT_EQ(test::slurp(dir / "Train_Samples_train_loss.csv"),
            "step,train_loss\n8,5.5\n16,0.3333333333333333\n24,-2e-10\n");
  EXPECT_EQ(test::slurp(dir / "Train_Samples_lr.csv"), "step,lr\n8,0.001\n");
  EXPECT_EQ(CsvScalars::file_name("Train/Samples/busy ms"), "Train_Samples_busy_ms.csv");
}

TEST(Monitor, TagsFollowDeepSpeed) {
  StepReport r;
  r.step = 3, r.loss = 2.5, r.lr = 1e-3, r.loss_scale = 1024, r.grad_norm = 0.75, r.step_s = 0.5;
  r.busy.compute = 0.25;
  r.busy.disks.push_back(DiskBusy{"vda"});
  Config c = parse(R"("fp16": {"enabled": true}, "wall_clock_breakdown": true)");
  Monitor m(c, /*write=*/false);
  EXPECT_FALSE(m.enabled());
  EXPECT_EQ(m.samples(3), 12);  // the step is the samples trained, as DeepSpeed's global_samples
  std::map<std::string, double> got;
  for (const auto& [tag, v] : m.scalars(r)) got[tag] = v;
  EXPECT_EQ(got.at("Train/Samples/train_loss"), 2.5);
  EXPECT_EQ(got.at("Train/Samples/lr"), 1e-3);
  EXPECT_EQ(got.at("Train/Samples/loss_scale"), 1024);
  EXPECT_EQ(got.at("Train/Samples/grad_norm"), 0.75);
  EXPECT_EQ(got.at("Train/Samples/step_time_ms"), 500);
  EXPECT_EQ(got.at("Train/Samples/busy_ms_compute"), 250);
  EXPECT_EQ(got.count("Train/Samples/busy_ms_disk_vda"), 1u);
  EXPECT_EQ(got.count("Train/Samples/elapsed_time_ms_forward"), 1u);
  Monitor plain(parse(""), false);  // no fp16: no loss scale, as DeepSpeed
  for (const auto& [tag, v] : plain.scalars(r)) {
    EXPECT_NE(tag, "Train/Samples/loss_scale");
    EXPECT_NE(tag, "Train/Samples/elapsed_time_ms_forward");
  }
}

// --- `zinf train` with the sections, as a user runs it -------------------------------------------

test::Result train(const std::string& sets) {
  return test::sh(std::string(ZINF_BIN) + " train --config " + test::kTinyConfig +
                  " --set model.n_layer=1 --set model.d_model=32 --set model.n_head=2 --set model.seq_len=32"
                  " --set train_micro_batch_size_per_gpu=2 --set train.eval_batches=1 --set device.threads=1"
                  " --set train.eval_interval=2 --set steps_per_print=1" +
                  sets);
}

// column 1 of a "step,value" CSV file, by step
std::map<std::int64_t, double> csv_rows(const std::string& path, std::string* header) {
  std::istringstream in(test::slurp(path));
  std::string line;
  std::getline(in, line);
  *header = line;
  std::map<std::int64_t, double> rows;
  while (std::getline(in, line)) {
    const auto comma = line.find(',');
    rows[std::stoll(line.substr(0, comma))] = std::stod(line.substr(comma + 1));
  }
  return rows;
}

// TensorBoard's EventAccumulator over a folder: {tag: [[step, value], ...]}.
constexpr const char* kAccumulate = R"PY(
import sys, json
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
ea = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
ea.Reload()
print(json.dumps({t: [[e.step, e.value] for e in ea.Scalars(t)] for t in ea.Tags()["scalars"]}))
)PY";

TEST(MonitorRun, TrainWritesEventsCsvAndTheProfile) {
  test::TempDir dir("monitor-run");
  const std::string out = dir / "out";
  const test::Result r =
      train(" --set train.steps=4 --set tensorboard.enabled=true --set tensorboard.output_path=" + out +
            " --set tensorboard.job_name=tiny --set csv_monitor.enabled=true" +
            " --set csv_monitor.output_path=" + out + " --set csv_monitor.job_name=tiny_csv" +
            " --set flops_profiler.enabled=true --set flops_profiler.profile_step=2" +
            " --set train.metrics_file=" + (dir / "metrics.jsonl"));
  ASSERT_EQ(r.rc, 0) << r.err;
  // flops_profiler: the table of the step after profile_step completed ones, once.
  EXPECT_EQ(test::count(r.out, "flops_profiler: step 3 (after 2 completed steps)"), 1u) << r.out;
  EXPECT_EQ(test::count(r.out, "the model's ops by kind, per step"), 1u) << r.out;
  EXPECT_NE(r.out.find("  gemm qkv"), std::string::npos) << r.out;

  // The metrics file's losses, against which the CSV and the event file are checked.
  std::map<std::int64_t, double> loss, val;
  std::istringstream metrics(test::slurp(dir / "metrics.jsonl"));
  for (std::string line; std::getline(metrics, line);) {
    const auto j = nlohmann::json::parse(line);
    (j.contains("loss") ? loss : val)[j["step"].get<std::int64_t>() * 2] =
        j.contains("loss") ? j["loss"].get<double>() : j["val_loss"].get<double>();
  }
  ASSERT_EQ(loss.size(), 4u);
  EXPECT_EQ(val.size(), 3u);  // before the first step (step 0), at step 2 and at the last, as the CSV has them
  // The log prints each validation loss rounded to four decimals.
  for (const auto& [step2, v] : val) {
    char want[64];
    std::snprintf(want, sizeof want, "step %lld: val_loss %.4f\n", static_cast<long long>(step2 / 2), v);
    EXPECT_NE((r.out + r.err).find(want), std::string::npos) << want << (r.out + r.err);
  }
  std::string header;
  EXPECT_EQ(csv_rows(out + "/tiny_csv/Train_Samples_train_loss.csv", &header), loss);  // exact: shortest round trip
  EXPECT_EQ(header, "step,train_loss");
  const auto val_rows = csv_rows(out + "/tiny_csv/Train_Samples_val_loss.csv", &header);
  EXPECT_EQ(val_rows.size(), 3u);  // before the first step, at step 2 and at the last
  for (const auto& [step, v] : val) EXPECT_EQ(val_rows.at(step), v) << step;
  EXPECT_TRUE(std::filesystem::exists(out + "/tiny_csv/Train_Samples_busy_ms_compute.csv"));
  EXPECT_TRUE(std::filesystem::exists(out + "/tiny_csv/Train_Samples_tokens_per_s.csv"));
  EXPECT_TRUE(std::filesystem::exists(out + "/tiny_csv/Train_Samples_grad_norm.csv"));

  const std::string py = test::checker_python("tensorboard");
  if (py.empty()) GTEST_SKIP() << test::checker_missing("tensorboard");
  const auto tb = test::run_python(py, kAccumulate, {out + "/tiny"});
  ASSERT_EQ(tb.status, 0) << tb.output;
  const auto j = nlohmann::json::parse(tb.output.substr(tb.output.rfind('{')));
  ASSERT_TRUE(j.contains("Train/Samples/train_loss")) << tb.output;
  std::map<std::int64_t, float> tb_loss;
  for (const auto& e : j["Train/Samples/train_loss"])
    tb_loss[e[0].get<std::int64_t>()] = static_cast<float>(e[1].get<double>());
  ASSERT_EQ(tb_loss.size(), loss.size());
  for (const auto& [step, v] : loss) EXPECT_EQ(tb_loss.at(step), static_cast<float>(v)) << step;
  EXPECT_EQ(j["Train/Samples/lr"].size(), 4u);
  EXPECT_EQ(j["Train/Samples/val_loss"].size(), 3u);
  EXPECT_FALSE(j.contains("Train/Samples/loss_scale"));  // fp32 run
}

TEST(MonitorRun, AResumeAddsAnEventFileAndAppendsCsv) {
  test::TempDir dir("monitor-resume");
  const std::string sets = " --set monitor.tensorboard_dir=" + (dir / "tb") +
                           " --set monitor.csv_dir=" + (dir / "csv") + " --set train.checkpoint_dir=" + (dir / "ck");
  const test::Result first = train(sets + " --set train.steps=2");
  ASSERT_EQ(first.rc, 0) << first.err;
  const test::Result second =
      train(sets + " --set train.steps=4 --resume latest --set flops_profiler.enabled=true" +
            " --set flops_profiler.profile_step=2" + " --set flops_profiler.output_file=" + (dir / "profile.txt"));
  ASSERT_EQ(second.rc, 0) << second.err;
  std::size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir / "tb"))
    files += e.path().filename().string().rfind("events.out.tfevents.", 0) == 0;
  EXPECT_EQ(files, 2u);
  std::string header;
  const auto loss = csv_rows(dir / "csv/Train_Samples_train_loss.csv", &header);
  EXPECT_EQ(test::count(test::slurp(dir / "csv/Train_Samples_train_loss.csv"), "step,"), 1u);  // one header
  std::vector<std::int64_t> steps;
  for (const auto& [s, v] : loss) steps.push_back(s);
  EXPECT_EQ(steps, (std::vector<std::int64_t>{2, 4, 6, 8}));  // samples: 2 a step, continued across the resume
  EXPECT_NE(test::slurp(dir / "profile.txt").find("the model's ops by kind"), std::string::npos);
  EXPECT_NE(second.out.find("flops_profiler: the op table of step 3 is in"), std::string::npos) << second.out;
}

TEST(MonitorRun, EvalWritesNoMonitorFiles) {
  test::TempDir dir("monitor-eval");
  const test::Result r = test::sh(std::string(ZINF_BIN) + " eval --config " + test::kTinyConfig +
                                  " --set model.n_layer=1 --set model.d_model=32 --set model.n_head=2"
                                  " --set model.seq_len=32 --set train.eval_batches=1 --set tensorboard.enabled=true"
                                  " --set tensorboard.output_path=" +
                                  (dir / "tb"));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir / "tb"));
}

TEST(MonitorRun, BadKeyIsOneErrorLine) {
  test::TempDir dir("monitor-bad");
  const test::Result r = train(" --set train.steps=1 --set tensorboard.enabeld=true");
  EXPECT_NE(r.rc, 0);
  EXPECT_EQ(test::lines(r.err), 1u) << r.err;
  EXPECT_NE(r.err.find("tensorboard.enabeld: unknown key (did you mean enabled?)"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace zinf
