// app/train/train.h — the training loop (`zinf train`), with DeepSpeed's numerics: mixed precision with
// dynamic loss scaling, gradient accumulation, global-norm clipping, Adam/AdamW through cpu_adam's
// fused Update, and the WarmupLR / WarmupDecayLR / WarmupCosineLR schedules.
//
// Every state goes through the offload engine (zinf/offload/engine.h), whatever the placement. The
// CPU device computes in fp32 from the 16-bit parameter copy (so fp16/bf16 runs see 16-bit weights
// and 16-bit gradients, and fp16 overflows exactly where a GPU run would); gradients are rounded to
// 16 bits before the update and, with GA > 1, accumulated in fp32.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "app/config/config.h"
#include "model/ops_profile.h"
#include "zinf/comm.h"

namespace zinf {

// DeepSpeed's DynamicLossScaler (or a static scale when fp16.loss_scale > 0; 1 without fp16).
class LossScaler {
 public:
  explicit LossScaler(const Fp16Config& c);
  double scale() const { return cur_scale_; }
  bool dynamic() const { return dynamic_; }
  // Call once per step with whether the gradients overflowed. Throws zinf::Error when an overflow
  // happens at the minimum scale (DeepSpeed's "Current loss scale already at minimum").
  void update(bool overflow);
  void restore(double scale, std::int64_t iter, std::int64_t last_overflow, int hysteresis) {
    cur_scale_ = scale;
    cur_iter = iter;
    last_overflow_iter = last_overflow;
    cur_hysteresis = hysteresis;
  }
  // State, for checkpoints and tests.
  std::int64_t cur_iter = 0, last_overflow_iter = -1;
  int cur_hysteresis = 0;

 private:
  bool dynamic_ = false;
  double cur_scale_ = 1, min_scale_ = 1;
  int window_ = 1000, hysteresis_ = 2;
  bool consecutive_ = false;
};

// The learning rate for the optimizer step that follows `t` completed steps (t = 0 for the first).
double lr_at(const SchedulerConfig& s, double base_lr, std::int64_t t);

struct TrainResult {
  std::int64_t steps = 0;         // training steps completed (including skipped ones)
  std::int64_t resumed_from = 0;  // the checkpoint's step, when resumed
  double checkpoint_seconds = 0;  // time spent writing checkpoints
  std::int64_t skipped = 0;       // overflowed steps
  std::int64_t rollbacks = 0;     // speculative Updates discarded (offload_optimizer.speculative)
  double loss = 0, val_loss = 0;  // last training loss, last validation loss
  double first_val_loss = 0;      // validation loss before training
  std::string params_digest;      // FNV-1a 64 over every fp32 master parameter, in unit order
  double tokens_per_s = 0;
  DeviceType device = DeviceType::cpu;  // the device it ran on: device.type resolved (app/config/device_choice.h)
  std::size_t peak_device_bytes = 0, device_budget = 0;
  std::size_t pinned_capacity = 0, pinned_peak = 0;
  bool interrupted = false;
  int stop_signal =
      0;  // interrupted: the signal behind the stop (TrainHooks::stop_signal of the lowest rank that had one)
  // Per-resource busy seconds summed over the measured steps (every step after the first), and the
  // mean step time over them: the inputs of `zinf bench step`.
  std::int64_t measured_steps = 0;
  double step_seconds = 0;
  BusyTimes busy;
  CheckpointTimes checkpoints;  // cpu_checkpointing: the checkpoint copies and waits, summed as `busy`
  std::vector<OpTime> profile;  // with TrainHooks::profile: summed over the measured steps, slowest first
};

struct TrainHooks {
  std::function<void(const std::string&)> log;  // progress lines
  const std::atomic<bool>* stop = nullptr;      // set (e.g. by SIGTERM) to stop after the current step
  // Set by train() once the run's state is built (and a checkpoint resumed): from then on a stop is
  // honoured at a step boundary; before, there is nothing to save and a caller may end at once.
  std::atomic<bool>* stoppable = nullptr;
  // The signal that set *stop, if any: every rank learns it, also those that did not receive it.
  const std::atomic<int>* stop_signal = nullptr;
  // Resume from a checkpoint: "" (start fresh), "latest" (the newest valid checkpoint under
  // train.checkpoint_dir, falling back past invalid ones; fresh when there is none), or a path.
  std::string resume;
  // The data-parallel ranks of this run (zinf/comm.h); null: the ranks this process was launched with
  // (mpirun), or one. Rank 0 alone logs, writes metrics and checkpoints.
  Comm* comm = nullptr;
  // Time every op of the model by kind (TrainResult::profile). Adds two timed events per op on
  // stream-ordered devices; the math is unchanged.
  bool profile = false;
};

TrainResult train(const Config& c, const TrainHooks& hooks);

// FNV-1a 64-bit of a byte range, continuing from `h` (the digest's building block).
std::uint64_t fnv1a64(const void* data, std::size_t n, std::uint64_t h = 1469598103934665603ull);

}  // namespace zinf
