// report.h — what a run tells its user: the progress line, the metrics file (one JSON object per
// line), and the parameters' digest.
#pragma once

#include <cstdint>
#include <string>

#include "app/config/config.h"
#include "model/ops_profile.h"
#include "model/shape.h"
#include "zinf/offload/engine.h"
#include "zinf/types.h"

namespace zinf {

struct StepReport {
  std::int64_t step = 0, steps = 0;
  double loss = 0, lr = 0, loss_scale = 1, grad_norm = 0, tokens_per_s = 0, step_s = 0;
  double fwd_s = 0, bwd_s = 0;  // the model's own forward and backward time in this step (engine waits excluded)
  bool skipped = false;
  BusyTimes busy;               // this step's, as the engine measured it
  std::int64_t rollbacks = 0;   // speculative Updates discarded so far in the run, this step's included
  bool speculative = false;     // the run speculates (offload_optimizer.speculative): the metrics carry rollbacks
  CheckpointTimes checkpoints;  // this step's activation checkpoint copies and waits (cpu_checkpointing)
};

// The metrics file (train.metrics_file): one line per step and one per validation.
class MetricsFile {
 public:
  explicit MetricsFile(const std::string& path);  // "": off; an unwritable path is a ConfigError
  ~MetricsFile();
  MetricsFile(const MetricsFile&) = delete;
  MetricsFile& operator=(const MetricsFile&) = delete;
  // A line that cannot be written (a full disk) is an IoError naming the file, at once.
  void step(const StepReport& r);
  void validation(std::int64_t step, double val_loss);

 private:
  void write_line(const std::string& line);
  std::string path_;
  int fd_ = -1;
};

// "step N/M | loss … | lr … | scale … | norm … | tok/s", plus the forward/backward times with
// wall_clock_breakdown and each resource's busy time and the overlap when anything is offloaded.
std::string progress_line(const Config& c, const StepReport& r, double fwd_ms, double bwd_ms);
// The busy part of the progress line: " | busy ms: compute … host … disk vda … (r … w …) | nvme MB r …
// w … | pace: <busiest resource>, overlap <step time / its busy time>".
std::string busy_summary(const BusyTimes& b, double step_s);

// The model's ops by kind, per step, then the engine's busy times beside them: the table of
// `zinf bench step --profile` and of the flops_profiler section. `ops` summed over `steps` steps of
// mean time `step_s`; `busy` per step; `timing` says how the ops were timed (op_timing()).
std::string op_table(const std::vector<OpTime>& ops, double steps, double step_s, const BusyTimes& busy,
                     const std::string& timing);
// How the op profiler times ops on the config's device.
std::string op_timing(const Config& c);

// FNV-1a 64 over every unit's fp32 master parameters, in unit order, as 16 hex digits.
std::string params_digest(offload::Engine& engine, const ModelShape& shape);

}  // namespace zinf
