// monitor.h — the run's scalars for TensorBoard and as CSV files, the way DeepSpeed's Monitor writes
// them (config: tensorboard / csv_monitor, or zinf's monitor section; see docs/monitoring.md).
//
// Tags follow DeepSpeed's: "Train/Samples/train_loss", "Train/Samples/lr" and, with fp16,
// "Train/Samples/loss_scale", each at the number of samples trained so far (step × train_batch_size)
// as the step. zinf adds grad_norm, tokens_per_s, step_time_ms, val_loss, each resource's busy time
// (busy_ms_compute, busy_ms_h2d, busy_ms_d2h, busy_ms_host, busy_ms_disk_<name>) and, with
// wall_clock_breakdown, DeepSpeed's elapsed_time_ms_forward / elapsed_time_ms_backward.
//
// Every record reaches the file (the kernel's page cache) before step() returns, so a killed run keeps
// what it wrote. A resumed run writes a new event file beside the old ones and appends to the CSV files.
//
// Thread-safety: one thread (the training loop, rank 0).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "app/config/config.h"
#include "app/train/report.h"
#include "io/event_file.h"

namespace zinf {

// One CSV file per tag in a folder: <folder>/<tag, '/' and ' ' as '_'>.csv, a header "step,<the tag's
// last part>" when the file is new or empty, then one "step,value" line per record.
class CsvScalars {
 public:
  explicit CsvScalars(std::string dir);  // the folder must exist
  ~CsvScalars();
  CsvScalars(const CsvScalars&) = delete;
  CsvScalars& operator=(const CsvScalars&) = delete;
  // A failed open or write is an IoError naming the file.
  void write(std::int64_t step, const std::vector<std::pair<std::string, double>>& values);
  static std::string file_name(const std::string& tag);  // without the folder

 private:
  int open_file(const std::string& tag);
  std::string dir_;
  std::map<std::string, int> fds_;  // tag → descriptor, opened at its first record
};

class Monitor {
 public:
  // Off unless `write` (rank 0) and a folder is configured; the folders must exist
  // (the training loop creates them with the other outputs).
  Monitor(const Config& c, bool write);
  bool enabled() const { return tb_ || csv_; }
  // After every optimizer step.
  void step(const StepReport& r);
  // After an evaluation at `step` (0: before the first step).
  void validation(std::int64_t step, double val_loss);
  // The scalars of one step as written, for tests.
  std::vector<std::pair<std::string, double>> scalars(const StepReport& r) const;
  std::int64_t samples(std::int64_t step) const { return step * batch_; }

 private:
  void write(std::int64_t step, const std::vector<std::pair<std::string, double>>& values);
  std::int64_t batch_ = 1;
  bool fp16_ = false, breakdown_ = false;
  std::unique_ptr<EventFileWriter> tb_;
  std::unique_ptr<CsvScalars> csv_;
};

}  // namespace zinf
