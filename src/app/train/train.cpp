// train.cpp — the training loop (train.h).
//
// One optimizer step: for each micro batch, upload a batch and run forward and backward through the
// offload engine (which windows the parameters and streams each unit's gradient out as soon as it is
// complete, see zinf/offload/engine.h); then engine.step() — the norm barrier, the overflow/clip
// decision and the Update, which lands unit by unit while the next forward starts. The loss scaler
// and the LR schedule live here; a skipped (overflowed) step advances neither the optimizer step
// nor the schedule. A Run holds what the loop needs, built in dependency order; train() is the loop.
//
// Data parallelism (zinf/comm.h): every rank draws the same stream of training rows and keeps its
// own — micro batch m of rank r is micro batch m·W + r of one rank with W × the accumulation —, seeds
// the backward with 1/(B·T·GA·W), and reports the loss summed in that global order; evaluation
// batches are dealt round-robin. So W ranks × GA g match one rank × GA g·W: exactly for g = 1 (the
// engine sums contributions in rank order, as one rank sums its micro batches), within rounding
// otherwise. With masked (chat) data the normalizer is instead the step's count of unmasked targets
// over every rank and micro batch, which each rank knows before the step's first backward: every
// rank draws the same rows. Rank 0 alone logs, writes metrics and checkpoints (full tensors: any
// world size resumes).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <random>

#include "app/config/device_choice.h"
#include "app/config/engine_config.h"
#include "app/plan/plan.h"
#include "app/train/batches.h"
#include "app/train/checkpoint.h"
#include "app/train/monitor.h"
#include "app/train/report.h"
#include "app/train/trace_file.h"
#include "app/train/train.h"
#include "io/data.h"
#include "io/files.h"
#include "io/hf.h"
#include "io/safetensors.h"
#include "model/host_math.h"
#include "model/lm.h"
#include "model/ops_profile.h"
#include "zinf/backends/backend.h"
#include "zinf/backends/world.h"
#include "zinf/cpu_adam/adam.h"
#include "zinf/cpu_adam/host_threads.h"
#include "zinf/device.h"
#include "zinf/error.h"
#include "zinf/offload/engine.h"
#include "zinf/pinned.h"
#include "zinf/backends/sysinfo.h"
#include "zinf/trace.h"

namespace zinf {
namespace {

// A loss as the log prints it: rounded to four decimals (4.603172 is 4.6032).
std::string four_decimals(double x) {
  char b[64];
  std::snprintf(b, sizeof b, "%.4f", x);
  return b;
}

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// A directory the run will write to, created when missing (as DeepSpeed creates nvme_path) and
// probed with a scratch file, so that a wrong path fails before any training, not at the first
// checkpoint or swap.
// Returns whether it had to create it.
bool ensure_writable_dir(const std::string& dir, const std::string& what) {
  std::error_code ec;
  const bool existed = std::filesystem::exists(dir, ec);
  std::filesystem::create_directories(dir, ec);
  if (ec) throw ConfigError(what + " " + dir + ": cannot create it: " + ec.message());
  const std::string probe = (std::filesystem::path(dir) / (".zinf-write-test-" + std::to_string(::getpid()))).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) throw ConfigError(what + " " + dir + ": cannot write there: " + std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
  return !existed;
}

// The filesystems of the NVMe swap paths have room for the stores the plan puts there (nvme_space in
// app/plan/plan.h; the stores reserve exactly the plan's NVMe bytes), checked before any folder is
// created or anything allocated. Rank 0's plan: the largest shards.
void check_nvme_space(const Config& c, const ModelShape& shape) {
  const std::string problem = nvme_space_problem(nvme_space(c, offload::make_plan(make_plan_input(c, shape))));
  if (!problem.empty())
    throw ConfigError(problem, "free space there, point nvme_path at a larger drive, or see `zinf plan` for what "
                               "takes the space");
}

// Everything a run will write, checked before anything is built; one line per directory created.
void check_output_paths(const Config& c, const TrainHooks& hooks) {
  auto check = [&](const std::string& dir, const std::string& what) {
    if (ensure_writable_dir(dir, what) && hooks.log) hooks.log(what + ": created " + dir + ", which did not exist");
  };
  if (!c.train.checkpoint_dir.empty() && c.train.steps > 0)
    check(c.train.checkpoint_dir, "train.checkpoint_dir");  // steps 0 writes none
  if (c.zero.offload_optimizer.device == OffloadDevice::nvme)
    check(c.zero.offload_optimizer.nvme_path, "zero_optimization.offload_optimizer.nvme_path");
  if (c.zero.offload_param.device == OffloadDevice::nvme &&
      c.zero.offload_param.nvme_path != c.zero.offload_optimizer.nvme_path)
    check(c.zero.offload_param.nvme_path, "zero_optimization.offload_param.nvme_path");
  if (!c.monitor.tensorboard_dir.empty()) check(c.monitor.tensorboard_dir, "monitor.tensorboard_dir");
  if (!c.monitor.csv_dir.empty()) check(c.monitor.csv_dir, "monitor.csv_dir");
  if (!c.train.trace_file.empty() && c.train.steps > 0) check_trace_path(c.train.trace_file, "train.trace_file");
  if (c.flops_profiler.enabled && !c.flops_profiler.output_file.empty()) {  // written at the profile step
    const std::filesystem::path parent = std::filesystem::path(c.flops_profiler.output_file).parent_path();
    check(parent.empty() ? "." : parent.string(), "flops_profiler.output_file's folder");
  }
}

// What rank 0 settles about checkpoints before anything is built or written: the checkpoint to load,
// and what the run may do to the checkpoints already in train.checkpoint_dir. A checkpoint this
// config cannot continue, a fresh run into a directory that holds checkpoints, or a resume from an
// older checkpoint with newer ones beside it is refused here — one line, nothing written or deleted.
struct CheckpointPlan {
  std::string load;                  // the checkpoint to load ("": start from step 0)
  std::vector<std::string> corrupt;  // newer checkpoints passed over as corrupt: moved aside once the run is ready
  std::vector<std::string> replace;  // train.overwrite_checkpoints: replaced by the run's first checkpoint
  // The checkpoint folders' locks (CheckpointLock), held as long as the plan: for the run's whole life.
  std::shared_ptr<CheckpointLock> lock, read_lock;
};

std::string names(const std::vector<std::pair<std::int64_t, std::string>>& cks) {
  std::string s;
  for (std::size_t i = 0; i < cks.size() && i < 3; ++i)
    s += (i ? ", " : "") + std::filesystem::path(cks[i].second).filename().string();
  if (cks.size() > 3) s += " and " + std::to_string(cks.size() - 3) + " more";
  return s;
}

CheckpointPlan plan_checkpoints(const Config& c, const std::string& which, const ModelShape& shape,
                                const TrainHooks& hooks) {
  auto log = [&](const std::string& s) {
    if (hooks.log) hooks.log(s);
  };
  const std::string& dir = c.train.checkpoint_dir;
  CheckpointPlan p;
  std::int64_t from = 0;
  // One writer a folder, and no reader beside it: the lock comes before anything there is read or written.
  const bool writes = !dir.empty() && c.train.steps > 0;
  if (writes) {
    if (ensure_writable_dir(dir, "train.checkpoint_dir"))
      log("train.checkpoint_dir: created " + dir + ", which did not exist");
    p.lock = std::make_shared<CheckpointLock>(dir, CheckpointLock::Mode::write, "train.checkpoint_dir");
    // A run killed while replacing or pruning checkpoints left them renamed aside: put them back first.
    recover_interrupted_saves(dir, log);
  }
  if (!which.empty() && !(which == "latest" && dir.empty())) {  // the folder of the checkpoint read
    const std::string folder = which == "latest" ? dir : checkpoint_folder(which);
    if (!(writes && same_file(folder, dir)))
      p.read_lock = std::make_shared<CheckpointLock>(folder, CheckpointLock::Mode::read, "checkpoint folder");
  }
  if (!which.empty()) {
    if (which == "latest" && dir.empty()) throw ConfigError(c.source + ": --resume latest needs train.checkpoint_dir");
    const ResumeChoice ch = choose_checkpoint(dir, which, shape);
    for (const auto& n : ch.notes) log("resume: " + n);
    if (ch.path.empty()) {
      if (c.train.steps == 0)  // only evaluating: the random initial parameters are not what was asked for
        throw ConfigError("no valid checkpoint under train.checkpoint_dir " + dir +
                              (std::filesystem::exists(dir)
                                   ? ch.corrupt.empty() ? "" : " (" + std::to_string(ch.corrupt.size()) + " corrupt)"
                                   : " (it does not exist)"),
                          "train one first, or name a checkpoint directory");
      log("resume: no valid checkpoint under " + dir + "; starting from step 0");
    }
    if (!ch.path.empty() && c.train.steps > 0 &&
        ch.step > c.train.steps)  // train.steps 0 evaluates a checkpoint of any step
      throw ConfigError(ch.path + ": the checkpoint is at step " + std::to_string(ch.step) + ", past train.steps " +
                            std::to_string(c.train.steps),
                        "raise train.steps to continue training from it, or evaluate it with `zinf eval`");
    p.load = ch.path;
    from = ch.step;
    if (!dir.empty() && c.train.steps > 0) p.corrupt = ch.corrupt;  // (evaluating moves nothing)
  }
  if (dir.empty() || c.train.steps == 0) return p;  // writes no checkpoints
  // Checkpoints newer than the starting point would outrank this run's own (`latest`, keep_last):
  // every one of them when starting fresh.
  std::vector<std::pair<std::int64_t, std::string>> newer;
  for (const auto& ck : list_checkpoints(dir))
    if (ck.first > from && std::find(p.corrupt.begin(), p.corrupt.end(), ck.second) == p.corrupt.end())
      newer.push_back(ck);
  if (newer.empty()) return p;
  if (!c.train.overwrite_checkpoints) {
    if (from == 0)
      throw ConfigError(
          "train.checkpoint_dir " + dir + " holds checkpoints (" + names(newer) +
              ") and this run is not a resume: its checkpoints would overwrite and mix with them",
          "continue them with --resume, choose another train.checkpoint_dir, or set train.overwrite_checkpoints "
          "true to replace them (they are removed once this run's first checkpoint is written and verified)");
    throw ConfigError(
        "train.checkpoint_dir " + dir + " holds checkpoints newer than " + p.load + " (" + names(newer) +
            "): this run's checkpoints would mix with them",
        "resume the newest with --resume latest, choose another train.checkpoint_dir, or set "
        "train.overwrite_checkpoints true to replace them (they are removed once this run's first checkpoint is "
        "written and verified)");
  }
  for (const auto& ck : newer) p.replace.push_back(ck.second);
  log("train.overwrite_checkpoints: " + std::to_string(newer.size()) + " checkpoint(s) in " + dir + " (" +
      names(newer) + ") will be replaced once this run's first checkpoint is written and verified");
  return p;
}

// Rank 0's string on every rank.
std::string broadcast_string(Comm& comm, std::string s) {
  std::uint64_t n = s.size();
  comm.broadcast(&n, sizeof n, 0);
  s.resize(static_cast<std::size_t>(n));
  if (n > 0) comm.broadcast(s.data(), s.size(), 0);
  return s;
}

// The backend of the device a config resolved to (train() resolves device.type before anything is built).
const backends::Backend& device_backend(const Config& c) { return backends::backend_for(run_device_type(c)); }

std::unique_ptr<Device> make_device(const Config& c, const backends::Backend& be, int local_rank, Trace* trace) {
  backends::DeviceSpec spec;
  spec.local_rank = local_rank;
  spec.budget_bytes = c.device.memory_budget;  // 0: the GPU's free memory less a reserve, or half the host's
  if (be.type() == DeviceType::cpu) {  // the CPU device's async mode and jitter, from the config or the environment
    spec.cpu.async = c.device.async;
    spec.cpu.jitter = JitterSpec{c.device.jitter_seed, c.device.jitter_us};
    spec.cpu = cpu_device_options_from_env(spec.cpu);
  }
  std::unique_ptr<Device> d = be.make_device(spec);
  if (trace) d->trace_to(trace);  // before any busy mark
  return d;
}

// The model's ops on that device; with `profile`, wrapped in the op profiler, which reports into
// *profile.
std::unique_ptr<OpsBackend> make_ops(const Config& c, const backends::Backend& be, Device& dev, int threads,
                                     std::shared_ptr<OpProfile>* profile, const ModelShape& shape) {
  std::unique_ptr<OpsBackend> ops = be.make_ops(dev, c.precision(), threads, c.device.kernels, c.device.attention);
  return profile ? make_profile_ops(dev, shape, std::move(ops), profile) : std::move(ops);
}

// Row losses of several forwards, copied behind the model's ops into (pinned) host memory and read
// when the caller asks — once a step, not once a micro batch: the forward never makes the host wait
// for the device. On the synchronous CPU device the ops have run when forward returns and the rows
// are copied at once.
class LossRows {
 public:
  LossRows(Device& device, int rows, int slots)
      : device_(device),
        rows_(static_cast<std::size_t>(rows)),
        slots_(static_cast<std::size_t>(slots)),
        pool_(std::max<std::size_t>(PinnedPool::kAlign, (rows_ * slots_ * 4 + PinnedPool::kAlign - 1) /
                                                            PinnedPool::kAlign * PinnedPool::kAlign),
              /*lock=*/false),
        buf_(pool_.acquire(rows_ * slots_ * 4)) {
    device_.register_host(buf_.data(), pool_.capacity());
  }
  ~LossRows() {
    try {
      device_.synchronize(StreamRole::compute);  // no copy may still target the buffer
    } catch (...) {
    }
    device_.unregister_host(buf_.data());
  }
  std::size_t slots() const { return slots_; }
  // Slot k receives the rows of the forward just issued.
  void take(std::size_t k, const float* device_rows) {
    float* dst = at(k);
    if (device_.ops_stream_ordered())
      device_.copy_to_host(dst, device_rows, rows_ * 4, StreamRole::compute);
    else
      std::memcpy(dst, device_rows, rows_ * 4);
  }
  // The mean loss of slot k's rows (waits for the compute stream the first time after a take).
  double mean(std::size_t k) {
    if (device_.ops_stream_ordered()) device_.synchronize(StreamRole::compute);
    return ops::mean_loss(at(k), static_cast<int>(rows_));
  }
  // The summed loss of slot k's rows, for masked data (masked rows hold 0; the caller divides by
  // the unmasked count).
  double sum(std::size_t k) {
    if (device_.ops_stream_ordered()) device_.synchronize(StreamRole::compute);
    const float* r = at(k);
    double total = 0;
    for (std::size_t i = 0; i < rows_; ++i) total += r[i];
    return total;
  }

 private:
  float* at(std::size_t k) { return static_cast<float*>(buf_.data()) + k * rows_; }
  Device& device_;
  std::size_t rows_, slots_;
  PinnedPool pool_;
  PinnedBuffer buf_;
};

// The model's view of the engine, with the time the model spends waiting for fetches and landings
// kept apart from its compute time.
//
// With a trace, on a device whose ops run on the host (the synchronous CPU device), a pass (begin_pass
// … end_pass) is also cut at every call into the engine: each piece between two calls is a span of the
// unit named last on the compute track, from the same clock reads as the waits, so the spans add up
// to the pass's time less its waits — the compute busy time the trainer reports.
class EngineUnits final : public UnitSource {
  template <class F>
  auto timed(std::size_t u, F f) -> decltype(f()) {
    const auto t0 = Clock::now();
    auto r = f();
    const auto t1 = Clock::now();
    wait_ += std::chrono::duration<double>(t1 - t0).count();
    if (pass_) {
      piece(t0);
      piece_from_ = t1;
      unit_ = static_cast<std::int64_t>(u);
    }
    return r;
  }
  void piece(Clock::time_point to) {  // (an empty piece, between two calls in a row, adds nothing)
    if (to > piece_from_) trace_->span(track_, pass_, unit_, piece_from_, to, trace_->windows());
  }

 public:
  EngineUnits(offload::Engine& engine, std::vector<std::size_t> unit_params)
      : engine_(engine), unit_params_(std::move(unit_params)) {}
  ConstTensorView weights(std::size_t u) override {
    const void* w = timed(u, [&] { return engine_.weights(u); });
    return ConstTensorView(w, dtype_of(engine_.weights_precision()), unit_params_[u]);
  }
  void done_with(std::size_t u) override { engine_.done_with(u); }
  void micro_batch(std::int64_t m) override { engine_.micro_batch(m); }
  float* grads(std::size_t u) override {
    return timed(u, [&] { return engine_.grads(u); });
  }
  void grads_done(std::size_t u) override {
    timed(u, [&] {
      engine_.grads_done(u);
      return 0;
    });
  }
  double take_wait() {
    const double w = wait_;
    wait_ = 0;
    return w;
  }
  // Spans of the model's host time on `trace`'s compute track (null: none).
  void trace_to(Trace* trace) {
    trace_ = trace;
    if (trace_) track_ = trace_->track(Trace::Group::device, to_string(StreamRole::compute));
  }
  // A pass ("forward", "backward") of the model's host time starts at t0 / ends at t1.
  void begin_pass(const char* name, Clock::time_point t0) {
    if (!trace_) return;
    pass_ = name;
    piece_from_ = t0;
    unit_ = -1;
  }
  void end_pass(Clock::time_point t1) {
    if (!pass_) return;
    piece(t1);
    pass_ = nullptr;
  }

 private:
  offload::Engine& engine_;
  std::vector<std::size_t> unit_params_;
  double wait_ = 0;
  Trace* trace_ = nullptr;
  int track_ = 0;
  const char* pass_ = nullptr;  // the pass being cut into spans, if any
  Clock::time_point piece_from_{};
  std::int64_t unit_ = -1;
};

// Everything a run holds, in the order it is built (and destroyed in reverse: the engine, which
// synchronises the device, goes before the model and the backend whose work it waits for).
class Run {
 public:
  Run(const Config& cfg, const TrainHooks& h, Comm& cm, int local_rank)
      : config(cfg),
        hooks(h),
        comm(cm),
        W(cm.size()),
        rank(cm.rank()),
        shape(model_shape(cfg.model)),
        micro_batch(static_cast<int>(cfg.micro_batch_size)),
        seq_len(shape.seq_len),
        grad_accum(cfg.gradient_accumulation_steps),
        data(TokenData::load(cfg.data, shape.vocab_size, seq_len)),
        threads(cfg.device.threads > 0 ? cfg.device.threads : cpu_adam::physical_cores()),
        device_backend_(device_backend(cfg)),
        trace(cm.rank() == 0 && !cfg.train.trace_file.empty() && cfg.train.steps > 0
                  ? std::make_unique<Trace>(cfg.train.trace_steps)
                  : nullptr),
        dev(make_device(cfg, device_backend_, local_rank, trace.get())),
        device_comm(make_device_comm(local_rank)),
        backend(make_ops(cfg, device_backend_, *dev, threads,
                         h.profile || (cfg.flops_profiler.enabled && cm.rank() == 0) ? &profile : nullptr, shape)),
        layer_major(cfg.zero.offload_optimizer.layer_major && cfg.gradient_accumulation_steps > 1),
        model(make_model(shape, micro_batch, cfg.model.activation_checkpointing, *dev, *backend,
                         cfg.model.cpu_checkpointing, pin_memory(cfg), layer_major ? static_cast<int>(grad_accum) : 1)),
        batches(*dev, static_cast<std::size_t>(micro_batch) * seq_len, layer_major ? static_cast<int>(grad_accum) : 2),
        losses(*dev, model->rows(), static_cast<int>(std::max<std::int64_t>(grad_accum, 8))),
        engine(make_engine()),
        units(*engine, engine_units),
        scaler(cfg.fp16),
        rng(cfg.train.seed),
        metrics(cm.rank() == 0 ? cfg.train.metrics_file : std::string()),
        monitor(cfg, cm.rank() == 0) {
    // The flops_profiler times its one step only (TrainHooks::profile, every step).
    if (profile && !h.profile) profile->set_active(false);
    if (trace) {
      trace->name_this_thread("trainer");
      if (!dev->ops_stream_ordered()) units.trace_to(trace.get());  // else the device traces compute
    }
    // From here a stop signal waits for the end of the current evaluation batch or step (with a
    // checkpoint when a step ran); while the model was being built it ended the process at once.
    // The "model:" line below tells a watcher that the run is stoppable.
    if (hooks.stoppable) hooks.stoppable->store(true);
    log("offload: " + engine->describe());
    log("model: " + format_count(count_params(shape)) + " parameters in " + std::to_string(shape.n_layer + 2) +
        " layer units; device memory " + format_bytes(dev->in_use()) + " of " + format_bytes(dev->budget()));
  }

  void log(const std::string& s) const {
    if (hooks.log && rank == 0) hooks.log(s);
  }

  // A stop asked for on any rank: signals reach the ranks at different moments (mpirun sends them
  // one by one, a launcher may signal one rank only), so the ranks agree here, at the same point of
  // every step, and all stop after the same step and write one checkpoint together.
  // Also sets stop_signal: the signal behind the stop, from the lowest rank that knows one.
  bool stop_asked() {
    const bool mine = hooks.stop && hooks.stop->load();
    const int sig = mine && hooks.stop_signal ? hooks.stop_signal->load() : 0;
    if (W == 1) {
      stop_signal = sig;
      return mine;
    }
    const double parts[2] = {mine ? 1.0 : 0.0, static_cast<double>(sig)};
    const std::vector<double> all = comm.allgather(parts, 2);
    bool any = false;
    stop_signal = 0;
    for (std::size_t r = 0; r < all.size(); r += 2) {
      any = any || all[r] > 0;
      if (stop_signal == 0) stop_signal = static_cast<int>(all[r + 1]);
    }
    return any;
  }

  // Mean validation loss over train.eval_batches fixed windows, dealt round-robin over the ranks and
  // summed in window order (one rank: over the batches done, when a stop is asked for in the middle —
  // the run stops after the current batch).
  double evaluate() {
    const int K = config.train.eval_batches;
    std::vector<double> mine(static_cast<std::size_t>(K), 0.0);
    std::vector<int> pending;  // batches whose row losses sit in `losses`, read a slot-full at a time
    auto read = [&] {
      for (std::size_t i = 0; i < pending.size(); ++i)
        mine[static_cast<std::size_t>(pending[i])] = data.masked() ? losses.sum(i) : losses.mean(i);
      pending.clear();
    };
    int k = K;  // the windows in the mean
    // Every rank runs the same number of forwards — ⌈K/W⌉, the ranks short of a window repeating
    // their last one (or the first) and dropping its loss — because a forward may gather partitioned
    // parameters (stage 3), a collective every rank must join.
    const int rounds = (K + W - 1) / W;
    for (int j = 0; j < rounds; ++j) {
      const bool real = j * W + rank < K;
      const int window = real ? j * W + rank : (j > 0 ? (j - 1) * W + rank : 0);
      Batch& b = batches.next([&](int* tok, int* tgt) { data.val_batch(window, K, micro_batch, seq_len, tok, tgt); });
      engine->begin_forward();
      model->forward(units, b.tokens(), b.targets());
      if (real) {
        losses.take(pending.size(), model->row_losses());
        pending.push_back(window);
      }
      batches.done_with(b);
      if (pending.size() == losses.slots()) read();
      if (W == 1 && stop_asked()) {
        k = window + 1;
        break;
      }
    }
    read();
    units.take_wait();
    engine->take_times();
    if (trace) trace->drop();  // an evaluation is in no step's busy time
    const std::vector<double> all = W > 1 ? comm.allgather(mine.data(), mine.size()) : mine;
    double sum = 0;
    for (int i = 0; i < k; ++i) sum += all[static_cast<std::size_t>((i % W) * K + i)];
    if (!data.masked()) return sum / k;
    std::size_t count = 0;  // masked data: the mean over the unmasked targets of the k batches
    for (int i = 0; i < k; ++i) count += data.val_targets(i, K, micro_batch, seq_len);
    return sum / static_cast<double>(count);
  }

  // Forward and backward of every micro batch of one step (their losses are read by step_loss()).
  // Sets step_targets: the step's unmasked targets, over every rank.
  void forward_backward(double scale) {
    const auto rows =
        static_cast<std::size_t>(micro_batch) * static_cast<std::size_t>(grad_accum) * static_cast<std::size_t>(W);
    step_targets = data.train_targets(rng, rows, seq_len);  // draws from a copy: rng stays where it is
    const float dscale = data.masked() ? static_cast<float>(scale / static_cast<double>(step_targets))
                                       : static_cast<float>(scale / (static_cast<double>(micro_batch) * seq_len *
                                                                     static_cast<double>(grad_accum) * W));
    auto next_batch = [&]() -> Batch& {
      Batch& b = batches.next([&](int* tok, int* tgt) {
        rng.discard(static_cast<unsigned long long>(micro_batch) *
                    static_cast<unsigned long long>(rank));  // the rows of lower ranks
        data.sample_train(rng, micro_batch, seq_len, tok, tgt);
        rng.discard(static_cast<unsigned long long>(micro_batch) * static_cast<unsigned long long>(W - 1 - rank));
      });
      rows_drawn += static_cast<std::int64_t>(micro_batch) * W;
      return b;
    };
    if (layer_major) {  // every micro batch through a unit before the next unit: one forward, one backward
      std::vector<Batch*> bs;
      std::vector<const int*> tokens, targets;
      for (std::int64_t micro = 0; micro < grad_accum; ++micro) {
        bs.push_back(&next_batch());
        tokens.push_back(bs.back()->tokens());
        targets.push_back(bs.back()->targets());
      }
      const int n = static_cast<int>(grad_accum);
      engine->begin_micro_batches();
      engine->begin_forward();
      t_fwd += model_time("forward", [&] { model->forward_layers(units, n, tokens.data()); });
      engine->begin_backward();
      t_bwd += model_time("backward", [&] {
        model->backward_layers(units, n, tokens.data(), targets.data(), dscale, [&](int micro) {
          losses.take(static_cast<std::size_t>(micro), model->row_losses());
        });
      });
      for (Batch* b : bs) batches.done_with(*b);
      return;
    }
    for (std::int64_t micro = 0; micro < grad_accum; ++micro) {
      Batch& b = next_batch();
      engine->begin_micro_batch(micro);
      engine->begin_forward();
      t_fwd += model_time("forward", [&] {
        model->forward(units, b.tokens(), b.targets());
        losses.take(static_cast<std::size_t>(micro), model->row_losses());
      });
      engine->begin_backward();
      t_bwd += model_time("backward", [&] { model->backward(units, b.tokens(), b.targets(), dscale); });
      batches.done_with(b);
    }
  }

  // The step's mean loss over every rank's micro batches, summed in their global order (waits for
  // the compute stream: called once the Update is under way).
  double step_loss() {
    std::vector<double> mine(static_cast<std::size_t>(grad_accum));
    for (std::int64_t micro = 0; micro < grad_accum; ++micro)
      mine[static_cast<std::size_t>(micro)] =
          data.masked() ? losses.sum(static_cast<std::size_t>(micro)) : losses.mean(static_cast<std::size_t>(micro));
    const std::vector<double> all = W > 1 ? comm.allgather(mine.data(), mine.size()) : mine;
    double loss_sum = 0;
    for (std::int64_t micro = 0; micro < grad_accum; ++micro)
      for (int r = 0; r < W; ++r) loss_sum += all[static_cast<std::size_t>(r * grad_accum + micro)];
    if (data.masked()) return loss_sum / static_cast<double>(step_targets);
    return loss_sum / (static_cast<double>(grad_accum) * W);
  }

  offload::StepOptions step_options(double scale, double lr) const {
    offload::StepOptions so;
    so.loss_scale = scale;
    so.gradient_clipping = config.gradient_clipping;
    so.hyper = cpu_adam::AdamHyper{static_cast<float>(lr),
                                   static_cast<float>(config.optimizer.beta1),
                                   static_cast<float>(config.optimizer.beta2),
                                   static_cast<float>(config.optimizer.eps),
                                   static_cast<float>(config.optimizer.weight_decay),
                                   config.optimizer.decoupled_weight_decay,
                                   config.optimizer.bias_correction};
    so.step = opt_steps + 1;
    return so;
  }

  // DeepSpeed's policy for the step's outcome: a finite step advances the optimizer and the scaler's
  // window; a non-finite one is skipped — fp16 with a dynamic scale halves it, anything else stops
  // after 50 in a row. Returns whether the step was skipped.
  bool account(const offload::StepOutcome& out, std::int64_t step, double loss) {
    if (out.finite) {
      nonfinite_run = 0;
      scaler.update(false);
      ++opt_steps;
      return false;
    }
    ++skipped;
    if (config.precision() == Precision::fp16 && scaler.dynamic()) {
      const double before = scaler.scale();
      scaler.update(true);
      log("step " + std::to_string(step) + ": OVERFLOW, skipping step; loss scale " + std::to_string(before) + " -> " +
          std::to_string(scaler.scale()));
    } else {
      log("step " + std::to_string(step) + ": non-finite gradients, skipping step");
      if (++nonfinite_run >= 50)
        throw Error("gradients were NaN/Inf for 50 consecutive steps (last loss " + std::to_string(loss) +
                        "): the run has diverged",
                    "lower optimizer.params.lr or check the data");
    }
    return true;
  }

  void checkpoint(std::int64_t step, TrainResult& res) {
    const auto t0 = Clock::now();
    CheckpointState st;
    st.step = step;
    st.opt_steps = opt_steps;
    st.rows_drawn = rows_drawn;
    st.skipped = skipped;
    st.loss_scale = scaler.scale();
    st.scaler_iter = scaler.cur_iter;
    st.scaler_last_overflow = scaler.last_overflow_iter;
    st.scaler_hysteresis = scaler.cur_hysteresis;
    if (rank != 0) {  // rank 0 writes; the others hand over their shards, unit by unit in the same order
      if (!engine->states_partitioned()) return;  // rank 0 holds every state itself
      std::vector<float> ma, mm, vv;
      for (std::size_t u = 0; u < engine_units.size(); ++u) {
        for (auto* b : {&ma, &mm, &vv}) b->resize(engine_units[u]);
        engine->read_states(u, ma.data(), mm.data(), vv.data());
      }
      return;
    }
    if (!checkpoints) return;  // (train.steps 0 writes none)
    const std::string path = checkpoints->save(
        config, st, [&](std::size_t u, float* ma, float* mm, float* vv) { engine->read_states(u, ma, mm, vv); });
    const double dt = since(t0);
    res.checkpoint_seconds += dt;
    log("checkpoint: " + path + " written in " + std::to_string(dt).substr(0, 5) + " s");
  }

  // Loads the checkpoint rank 0 chose and verified (plan_checkpoints); returns its step (0: none,
  // starting fresh). Every checksum is still checked as the states stream in.
  std::int64_t resume(const std::string& path) {
    if (path.empty()) return 0;
    const auto t0 = Clock::now();
    const CheckpointState st = load_checkpoint(
        path, shape,
        [&](std::size_t u, const float* ma, const float* mm, const float* vv) { engine->write_states(u, ma, mm, vv); },
        /*verify_first=*/false);
    // The fp32 masters and Adam moments carry over to any precision; the loss scaler's state belongs
    // to the precision it was kept for (an fp16 scale means nothing to bf16, and a bf16 run's static
    // scale of 1 would start fp16 far below its configured scale).
    if (st.precision == config.precision())
      scaler.restore(st.loss_scale, st.scaler_iter, st.scaler_last_overflow, st.scaler_hysteresis);
    else
      log("resume: the checkpoint was trained in " + std::string(to_string(st.precision)) + ", this run is " +
          std::string(to_string(config.precision())) +
          ": its fp32 master parameters and Adam states carry over, the loss scaler starts "
          "from this config");
    // The checkpoint holds m and v in fp32 (decoded exactly): write_states encoded them in this run's
    // format, so the same format resumes bit for bit and another one converts.
    if (st.optimizer_states != config.zero.optimizer_states)
      log("resume: the checkpoint's Adam states were kept as " +
          std::string(cpu_adam::state_format_name(st.optimizer_states)) + ", this run keeps them as " +
          cpu_adam::state_format_name(config.zero.optimizer_states) + ": m and v are converted");
    opt_steps = st.opt_steps;
    rows_drawn = st.rows_drawn;
    rng.discard(static_cast<unsigned long long>(rows_drawn));
    skipped = st.skipped;
    log("resume: " + path + " (step " + std::to_string(st.step) + ", loaded and verified in " +
        std::to_string(since(t0)).substr(0, 5) + " s)");
    return st.step;
  }

  const Config& config;
  const TrainHooks& hooks;
  Comm& comm;
  const int W;     // ranks in the job (W in the formulas above)
  const int rank;  // this one
  const ModelShape shape;
  const int micro_batch, seq_len;  // sequences per micro batch, and their length
  const std::int64_t grad_accum;
  TokenData data;
  const int threads;
  const backends::Backend& device_backend_;  // everything device-specific comes from here
  // train.trace_file (rank 0): the busy spans of the first train.trace_steps steps; attached to the
  // device, the engine and the model's units, which record into it (zinf/trace.h).
  std::unique_ptr<Trace> trace;
  std::unique_ptr<Device> dev;
  std::unique_ptr<Comm> device_comm;   // NCCL for the CUDA device's memory (several ranks)
  std::shared_ptr<OpProfile> profile;  // TrainHooks::profile: the op profiler's times
  std::unique_ptr<OpsBackend> backend;
  // offload_optimizer.layer_major with GA > 1: a step's micro batches go through the model together,
  // unit by unit (LanguageModel::forward_layers / backward_layers), in GA batch slots.
  const bool layer_major;
  std::unique_ptr<LanguageModel> model;
  BatchSlots batches;
  LossRows losses;                        // each micro batch's row losses, read at the step's end
  std::vector<std::size_t> engine_units;  // parameters per layer unit (filled by make_engine)
  std::unique_ptr<offload::Engine> engine;
  EngineUnits units;
  LossScaler scaler;
  std::mt19937_64 rng;
  MetricsFile metrics;
  Monitor monitor;                             // tensorboard / csv_monitor (rank 0)
  std::unique_ptr<CheckpointDir> checkpoints;  // rank 0, when the run writes checkpoints
  std::int64_t opt_steps = 0, nonfinite_run = 0, rows_drawn = 0, skipped = 0;
  int stop_signal = 0;          // set by stop_asked()
  double t_fwd = 0, t_bwd = 0;  // the model's own time since the last progress line
  // The last step's target tokens over every rank (the unmasked ones, for chat data).
  std::size_t step_targets = 0;

 private:
  // Host time in the model, waits for the engine excluded; charged to compute when the device does
  // not measure its compute stream itself (the synchronous CPU device).
  template <class F>
  double model_time(const char* pass, F f) {
    const auto t0 = Clock::now();
    units.begin_pass(pass, t0);
    f();
    const auto t1 = Clock::now();
    units.end_pass(t1);
    const double busy = std::chrono::duration<double>(t1 - t0).count() - units.take_wait();
    if (!dev->ops_stream_ordered()) engine->add_compute_time(busy);
    return busy;
  }

  std::unique_ptr<Comm> make_device_comm(int local_rank) {
    if (W == 1) return nullptr;
    if (config.device.comm == "mpi" && run_device_type(config) == DeviceType::cuda)
      throw ConfigError(
          config.source + ": device.comm: mpi cannot move CUDA device memory (Debian's Open MPI is not CUDA-aware)",
          "use device.comm nccl (the default for the CUDA device)");
    return device_backend_.make_device_comm(comm, local_rank);
  }

  std::unique_ptr<offload::Engine> make_engine() {
    log("data: " + data.description() + "; train " + std::to_string(data.train_tokens()) + " / val " +
        std::to_string(data.val_tokens()) + (data.masked() ? " target tokens" : " tokens"));
    for (const std::string& note : data.notes()) log("data: " + note);
    log("device: " + dev->name() + ", " + std::to_string(threads) + " threads, cpu_adam " +
        std::string(cpu_adam::to_string(cpu_adam::active_simd())) + ", " + std::string(to_string(config.precision())));
    std::unique_ptr<StFile> init_file;
    std::unique_ptr<HfModelReader> hf;
    if (is_hf_folder(config.model.init_from)) {  // tensor by tensor, as each unit is placed in its tier
      hf = std::make_unique<HfModelReader>(config.model.init_from);
      hf->check(shape);
      log("init: parameters from the Hugging Face folder " + config.model.init_from + " (" + hf->weights() + ")");
    } else if (!config.model.init_from.empty()) {
      if (shape.family != ModelFamily::gpt2)
        throw ConfigError(
            "model.init_from: a llama-family model loads from a Hugging Face folder (config.json and safetensors), "
            "not from " +
            config.model.init_from);
      init_file = std::make_unique<StFile>(read_safetensors(config.model.init_from, "model.init_from"));
      check_gpt2_tensor_set(*init_file, config.model.init_from, shape);
      log("init: parameters from " + config.model.init_from + " (" + std::to_string(init_file->tensors.size()) +
          " tensors)");
    }
    offload::EngineConfig ec = engine_config(config, threads, W, rank);
    engine_units.assign(ec.plan.unit_params.begin(), ec.plan.unit_params.end());
    if (W > 1) {
      ec.comm = &comm;
      ec.device_comm = device_comm ? device_comm.get() : &comm;
      log("data parallel: " + std::to_string(W) + " ranks over " + comm.backend() +
          (device_comm ? " (device memory: " + device_comm->backend() + ")" : std::string()) + ", ZeRO stage " +
          std::to_string(config.zero.stage));
    }
    ec.trace = trace.get();
    ec.kernels = [&be = device_backend_](Device& d, cpu_adam::HostThreads& pool) {
      return be.make_engine_kernels(d, pool);
    };
    return std::make_unique<offload::Engine>(ec, *dev, [&](std::size_t u, float* master) {
      if (hf)
        hf->load_unit(shape, u, master);
      else if (init_file)
        load_gpt2_unit(*init_file, config.model.init_from, shape, u, master);
      else
        init_model_unit(master, u, shape, config.train.seed);
    });
  }
};

// The communicator of the job's ranks: hooks.comm, or one for the launcher's world, kept in *owned.
Comm& join_world(const TrainHooks& hooks, std::unique_ptr<Comm>& owned, int& local_rank) {
  local_rank = 0;
  if (hooks.comm) return *hooks.comm;
  const World w = detect_world();
  owned = make_world_comm(w);
  local_rank = w.local_rank;
  return *owned;
}

// Every rank must train the same thing: the batch sizes resolved for this job's size, and one config.
void check_world(const Config& c, Comm& comm) {
  if (c.world_size != comm.size())
    throw ConfigError(c.source + ": the batch sizes were resolved for " + std::to_string(c.world_size) +
                      " rank(s), this job has " + std::to_string(comm.size()));
  if (comm.size() == 1) return;
  const std::uint64_t h = fnv1a64(c.resolved_json.data(), c.resolved_json.size());
  const double parts[2] = {static_cast<double>(h >> 32), static_cast<double>(h & 0xffffffffu)};
  const auto all = comm.allgather(parts, 2);
  std::string differ;
  for (std::size_t r = 1; r < all.size() / 2; ++r)
    if (all[2 * r] != all[0] || all[2 * r + 1] != all[1]) differ += (differ.empty() ? "" : ", ") + std::to_string(r);
  if (!differ.empty())
    throw ConfigError(c.source +
                          ": the ranks of this job were given different configs: the resolved config of rank(s) " +
                          differ + " differs from rank 0's",
                      "start every rank with the same config file and --set overrides");
}

// Rank 0 settles the checkpoint to start from and prepares the directories the run writes; the
// others learn whether that worked (a refusal ends every rank the same way) and which checkpoint
// to load. Nothing is written before every check has passed.
CheckpointPlan prepare_outputs(const Config& c, const TrainHooks& hooks, const ModelShape& shape, Comm& comm) {
  CheckpointPlan plan;
  std::exception_ptr prepared;
  if (comm.rank() == 0) try {
      check_nvme_space(c, shape);
      plan = plan_checkpoints(c, hooks.resume, shape, hooks);
      check_output_paths(c, hooks);
      for (const auto& p : plan.corrupt) {  // kept for inspection, out of latest's and keep_last's way
        const std::string to = move_corrupt_aside(p);
        if (hooks.log) hooks.log("resume: moved the corrupt " + p + " aside to " + to);
      }
      if (plan.lock) plan.lock->announce();  // the folder is this run's: its PID and command in the lock file
    } catch (...) {
      prepared = std::current_exception();
    }
  if (comm.size() > 1 && comm.any(prepared != nullptr) && !prepared)
    throw ConfigError("rank 0 refused to start the run (its error says why)");
  if (prepared) std::rethrow_exception(prepared);
  if (comm.size() > 1) plan.load = broadcast_string(comm, plan.load);
  return plan;
}

// Rank 0's checkpoint folder, when the run writes checkpoints.
void open_checkpoints(Run& run, const CheckpointPlan& plan) {
  const Config& c = run.config;
  if (run.comm.rank() != 0 || c.train.checkpoint_dir.empty() || c.train.steps == 0) return;
  run.checkpoints = std::make_unique<CheckpointDir>(c.train.checkpoint_dir, c.train.keep_last, run.shape,
                                                    [&run](const std::string& s) { run.log(s); });
  if (!plan.load.empty()) run.checkpoints->mark_verified(plan.load);
  run.checkpoints->replace_on_first_save(plan.replace);
}

// One optimizer step: forward and backward of every micro batch, the Update, and what happened.
StepReport train_step(Run& run, std::int64_t step) {
  const Config& c = run.config;
  const auto t0 = Clock::now();
  StepReport r;
  r.step = step, r.steps = c.train.steps;
  r.loss_scale = run.scaler.scale();
  r.lr = lr_at(c.scheduler, c.optimizer.lr, run.opt_steps);
  const offload::StepOptions so = run.step_options(r.loss_scale, r.lr);
  const double fwd0 = run.t_fwd, bwd0 = run.t_bwd;
  run.engine->expect_step(so);  // what a speculative Update assumes (unclipped, finite)
  run.forward_backward(r.loss_scale);
  const offload::StepOutcome out = run.engine->step(so);
  r.loss = run.step_loss();  // (the host has waited for the compute stream)
  r.checkpoints = run.model->take_checkpoint_times();
  r.fwd_s = run.t_fwd - fwd0, r.bwd_s = run.t_bwd - bwd0;
  r.grad_norm = out.norm;
  r.skipped = run.account(out, step, r.loss);
  r.step_s = since(t0);
  // Target tokens: every position of token data, the unmasked ones of chat data.
  r.tokens_per_s = run.data.masked() ? static_cast<double>(run.step_targets) / r.step_s
                                     : static_cast<double>(c.train_batch_size) * run.seq_len / r.step_s;
  r.busy = run.engine->take_times();
  if (run.trace) run.trace->keep(step);   // the spans counted in r.busy are this step's
  r.rollbacks = run.engine->rollbacks();  // step() gave the verdict: a rollback of this step is counted
  r.speculative = c.zero.offload_optimizer.speculative;
  return r;
}

// A measured step's busy times and op times, added to the run's sums.
void add_measured(TrainResult& res, const StepReport& r, const std::vector<OpTime>& ops_times) {
  res.busy += r.busy;
  res.checkpoints += r.checkpoints;
  res.measured_steps++;
  for (const auto& o : ops_times) {
    auto it = std::find_if(res.profile.begin(), res.profile.end(), [&](const OpTime& x) { return x.name == o.name; });
    if (it == res.profile.end()) {
      res.profile.push_back(o);
    } else {
      it->calls += o.calls, it->seconds += o.seconds, it->flops += o.flops;
    }
  }
}

// After a step: the progress line, an evaluation, a checkpoint, as their intervals (or a stop) ask.
// Returns whether the run stops here.
bool after_step(Run& run, std::int64_t step, const StepReport& r, TrainResult& res) {
  const Config& c = run.config;
  run.metrics.step(r);
  run.monitor.step(r);
  if (step % c.steps_per_print == 0 || step == c.train.steps) {
    run.log(progress_line(c, r, 1e3 * run.t_fwd / c.steps_per_print, 1e3 * run.t_bwd / c.steps_per_print));
    run.t_fwd = run.t_bwd = 0;
  }
  const bool stop = run.stop_asked();
  if (((c.train.eval_interval > 0 && step % c.train.eval_interval == 0) || step == c.train.steps) && !stop) {
    res.val_loss = run.evaluate();
    run.metrics.validation(step, res.val_loss);
    run.monitor.validation(step, res.val_loss);
    run.log("step " + std::to_string(step) + ": val_loss " + four_decimals(res.val_loss));
  }
  if (!c.train.checkpoint_dir.empty() &&
      ((c.train.checkpoint_interval > 0 && step % c.train.checkpoint_interval == 0) || step == c.train.steps || stop))
    run.checkpoint(step, res);
  return stop;
}

// DeepSpeed's flops_profiler: the op table of one step, to the log or to flops_profiler.output_file.
void report_flops_profile(Run& run, const StepReport& r, const std::vector<OpTime>& ops_times) {
  const FlopsProfilerConfig& f = run.config.flops_profiler;
  char head[160];
  std::snprintf(head, sizeof head, "flops_profiler: step %lld (after %lld completed steps), %.1f ms\n",
                static_cast<long long>(r.step), static_cast<long long>(f.profile_step), 1e3 * r.step_s);
  const std::string table = head + op_table(ops_times, 1, r.step_s, r.busy, op_timing(run.config));
  if (f.output_file.empty()) {
    run.log(table.substr(0, table.size() - 1));  // (the log adds the line end)
    return;
  }
  OutputFile out(f.output_file, "flops_profiler.output_file");
  out.write(table.data(), table.size());
  out.commit();
  run.log("flops_profiler: the op table of step " + std::to_string(r.step) + " is in " + f.output_file);
}

// The result's figures once the last step has landed.
void finish_result(Run& run, double t_measured, TrainResult& res) {
  run.engine->synchronize();
  res.skipped = run.skipped;
  res.params_digest = params_digest(*run.engine, run.shape);
  res.rollbacks = run.engine->rollbacks();  // after the digest's synchronize: every verdict is in
  res.device = run.device_backend_.type();
  res.peak_device_bytes = run.dev->peak();
  res.device_budget = run.dev->budget();
  res.pinned_capacity = run.engine->pinned_capacity();
  res.pinned_peak = run.engine->pinned_peak();
  res.step_seconds = res.measured_steps ? t_measured / static_cast<double>(res.measured_steps) : 0;
  std::sort(res.profile.begin(), res.profile.end(),
            [](const OpTime& a, const OpTime& b) { return a.seconds > b.seconds; });
}

}  // namespace

TrainResult train(const Config& c, const TrainHooks& hooks) {
  if (c.device.type == DeviceType::automatic) {  // the device `zinf plan` plans for (app/config/device_choice.h)
    Config resolved = c;
    resolve_device(resolved);
    return train(resolved, hooks);
  }
  if (c.device.simd != "auto") cpu_adam::set_simd_cap(cpu_adam::parse_simd_level(c.device.simd));
  std::unique_ptr<Comm> world_comm;
  int local_rank = 0;
  Comm& comm = join_world(hooks, world_comm, local_rank);
  check_world(c, comm);
  const CheckpointPlan plan = prepare_outputs(c, hooks, model_shape(c.model), comm);
  Run run(c, hooks, comm, local_rank);
  open_checkpoints(run, plan);
  TrainResult res;
  res.resumed_from = run.resume(plan.load);
  const std::int64_t first_step = res.resumed_from + 1;
  res.first_val_loss = res.val_loss = run.evaluate();
  run.log("step " + std::to_string(first_step - 1) + ": val_loss " + four_decimals(res.first_val_loss));
  run.metrics.validation(first_step - 1, res.first_val_loss);  // as the event file and the log have it
  run.monitor.validation(first_step - 1, res.first_val_loss);
  if (run.stop_asked()) {  // stopped during the first evaluation: nothing was trained, nothing to save
    res.interrupted = true;
    res.stop_signal = run.stop_signal;
    run.log("interrupted: stopping before the first step");
  }
  const std::int64_t measure_from = std::min<std::int64_t>(first_step + 1, c.train.steps);  // the first step warms up
  double t_measured = 0;

  res.steps = first_step - 1;
  for (std::int64_t step = first_step; step <= c.train.steps && !res.interrupted; ++step) {
    const bool flops_step = c.flops_profiler.enabled && step == c.flops_profiler.profile_step + 1 && run.rank == 0;
    if (flops_step && !hooks.profile) run.profile->set_active(true);
    const StepReport r = train_step(run, step);
    std::vector<OpTime> ops_times;
    if (run.profile) ops_times = run.profile->take();
    if (flops_step) {
      if (!hooks.profile) run.profile->set_active(false);
      report_flops_profile(run, r, ops_times);
    }
    res.steps = step;
    res.loss = r.loss;
    res.tokens_per_s = r.tokens_per_s;
    if (step >= measure_from) {
      t_measured += r.step_s;
      add_measured(res, r, ops_times);
    }
    if (after_step(run, step, r, res)) {
      res.interrupted = true;
      res.stop_signal = run.stop_signal;
      run.log("interrupted: stopping after step " + std::to_string(step));
      break;
    }
  }
  finish_result(run, t_measured, res);
  if (run.trace) {
    const std::vector<std::int64_t> steps = run.trace->kept_steps();
    write_trace_file(*run.trace, c.train.trace_file,
                     {{"config", c.source}, {"device", run.dev->name()}, {"measured_from", measure_from}});
    run.log("trace: " +
            (steps.empty() ? std::string("no steps")
                           : "steps " + std::to_string(steps.front()) + "-" + std::to_string(steps.back())) +
            " in " + c.train.trace_file);
  }
  return res;
}

}  // namespace zinf
