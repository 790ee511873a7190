// bench.cpp — `zinf bench <what>`: the command line of the measurements (adam, nvme, pcie, comm, tokenize,
// attention)
// and of `bench step` (training runs through train()), each as a ratio against a limit measured in
// the same run.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <tbb/task_arena.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "app/config/config.h"
#include "app/train/report.h"
#include "app/train/trace_file.h"
#include "app/train/train.h"
#include "bench/adam_bench.h"
#include "bench/comm_bench.h"
#include "bench/nvme_sweep.h"
#include "commands.h"
#include "io/bpe.h"
#include "io/files.h"
#include "model/shape.h"
#include "zinf/backends/backend.h"
#include "zinf/backends/gpu.h"
#include "zinf/backends/world.h"
#include "zinf/comm.h"
#include "zinf/cpu_adam/host_threads.h"
#include "zinf/cpu_adam/spec.h"
#include "zinf/cpu_adam/simd.h"
#include "zinf/device.h"
#include "zinf/error.h"
#include "zinf/offload/engine_kernels.h"
#include "zinf/backends/sysinfo.h"

namespace zinf::cli {
namespace {

// `zinf bench adam --help`.
constexpr const char* kBenchAdamAbout =
    "The fused host Update (Adam/AdamW, fp16 gradients in, fp16 parameter copy out; m and v stored as fp32, bf16 "
    "or 8-bit: 28, 20 or 16.06 bytes per parameter) against (b) a kernel with the same loads and stores but "
    "trivial math — the memory-movement limit of the pass — and (c) Adam written as a plain C++ loop (fp32 "
    "states only). Reports params/s, GB/s and the ratio (a)/(b); the fused path is checked against the scalar "
    "reference before timing";

struct AdamArgs {
  std::string params = "256M";
  int threads = 0;
  int reps = 5;
  std::string simd = "auto";
  std::string states = "fp32";
  bool json = false;
};

// "fp32" | "bf16" | "8bit" (the words of zero_optimization.optimizer_states).
cpu_adam::StateFormat parse_states(const std::string& word) {
  std::string best;
  std::size_t best_d = 99;
  for (auto f : {cpu_adam::StateFormat::fp32, cpu_adam::StateFormat::bf16, cpu_adam::StateFormat::q8}) {
    if (word == cpu_adam::state_format_name(f)) return f;
    const std::size_t d = edit_distance(word, cpu_adam::state_format_name(f));
    if (d < best_d) best_d = d, best = cpu_adam::state_format_name(f);
  }
  throw zinf::ConfigError("--states: '" + word + "' is not one of fp32, bf16, 8bit" +
                          (best_d <= 2 ? " (did you mean " + best + "?)" : ""));
}

// "256M" → 256,000,000 parameters (K, M, G are powers of 1000 for counts).
std::int64_t parse_count(const std::string& s) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::logic_error&) {
    throw zinf::ConfigError("--params: '" + s + "' is not a count (e.g. 64M, 1.5G, 1000000)");
  }
  std::string unit = s.substr(used);
  double mult = unit.empty()                 ? 1
                : unit == "K" || unit == "k" ? 1e3
                : unit == "M" || unit == "m" ? 1e6
                : unit == "G" || unit == "g" ? 1e9
                                             : 0;
  if (mult == 0 || v <= 0) throw zinf::ConfigError("--params: '" + s + "' is not a count (e.g. 64M, 1.5G, 1000000)");
  return static_cast<std::int64_t>(v * mult);
}

int run_adam(const AdamArgs& a) {
  if (a.simd != "auto") cpu_adam::set_simd_cap(cpu_adam::parse_simd_level(a.simd));
  AdamBenchOptions o;
  o.params = parse_count(a.params);
  o.threads = a.threads;
  o.reps = a.reps;
  o.states = parse_states(a.states);
  AdamBenchResult r = run_adam_bench(o, [&](const std::string& line) {
    if (!a.json) std::fprintf(stderr, "bench adam: %s\n", line.c_str());
  });
  if (a.json) {
    nlohmann::json j = {{"params", r.params},
                        {"threads", r.threads},
                        {"simd", r.simd},
                        {"states", cpu_adam::state_format_name(r.states)},
                        {"bytes_per_param", r.bytes_per_param},
                        {"ratio", r.ratio}};
    if (r.speedup_vs_naive > 0) j["speedup_vs_naive"] = r.speedup_vs_naive;
    auto row = [](const AdamBenchRow& x) {
      return nlohmann::json{{"seconds", x.seconds}, {"params_per_s", x.params_per_s}, {"gb_per_s", x.gb_per_s}};
    };
    j["fused"] = row(r.fused);
    j["memory_limit"] = row(r.traffic);
    if (r.naive.seconds > 0) j["naive"] = row(r.naive);
    print_json(j);
    return 0;
  }
  std::printf("zinf bench adam — %lld params, %d threads, %s path, %s states, %.2f B/param, best of %d\n",
              static_cast<long long>(r.params), r.threads, r.simd.c_str(), cpu_adam::state_format_name(r.states),
              r.bytes_per_param, a.reps);
  std::printf("  %-38s %10s %12s %10s\n", "", "Gparam/s", "GB/s", "s");
  auto line = [](const char* name, const AdamBenchRow& x) {
    std::printf("  %-38s %10.3f %12.2f %10.4f\n", name, x.params_per_s / 1e9, x.gb_per_s, x.seconds);
  };
  line("(a) fused Update (fp16 grad in/out)", r.fused);
  line("(b) memory limit (same streams)", r.traffic);
  if (r.naive.seconds > 0) {
    line("(c) plain C++ Adam loop", r.naive);
    std::printf("  ratio (a)/(b) = %.3f   speedup (a)/(c) = %.2fx\n", r.ratio, r.speedup_vs_naive);
  } else {
    std::printf("  ratio (a)/(b) = %.3f\n", r.ratio);
  }
  return 0;
}

// `zinf bench nvme --help`.
constexpr const char* kBenchNvmeAbout =
    "Sweep request size x queue depth x I/O threads, for read and for write, on an O_DIRECT file in a private "
    "directory under --path (removed afterwards); measure a plain sequential O_DIRECT pread/pwrite pass in the "
    "same run as the reference; then stream the optimizer pattern (read sub-group g+1 | touch g | write g-1) "
    "through the pipelined swapper and report it against the best raw cells. Prints a table per direction, the "
    "best cells and a paste-ready \"aio\" block";

struct NvmeArgs {
  std::string path;
  std::string size = "4G", cell = "256M", swap_item = "64M";
  std::vector<std::string> blocks = {"128K", "512K", "1M", "4M", "8M"};
  std::vector<int> depths = {1, 4, 16, 64};
  std::vector<int> threads = {1, 2};
  std::string engine = "auto";
  bool json = false;
};

int run_nvme(const NvmeArgs& a) {
  nvme::SweepOptions o;
  o.dir = a.path;
  o.file_bytes = parse_bytes(a.size, "--size");
  o.cell_bytes = parse_bytes(a.cell, "--cell");
  o.swap_item = static_cast<std::size_t>(parse_bytes(a.swap_item, "--swap-item"));
  if (o.file_bytes < (1 << 20) || o.cell_bytes < (1 << 20) || o.swap_item < (1 << 20))
    throw ConfigError("--size, --cell and --swap-item must each be at least 1M");
  o.block_sizes.clear();
  for (const auto& b : a.blocks) {
    const std::uint64_t v = parse_bytes(b, "--blocks");
    if (v < 4096 || v % 4096) throw ConfigError("--blocks: " + b + " is not a multiple of 4K");
    o.block_sizes.push_back(static_cast<std::size_t>(v));
  }
  o.depths = a.depths;
  o.threads = a.threads;
  o.engine = a.engine == "uring"   ? nvme::AsyncIoKind::uring
             : a.engine == "posix" ? nvme::AsyncIoKind::posix
                                   : nvme::AsyncIoKind::automatic;
  nvme::SweepResult r =
      nvme::run_sweep(o, [](const std::string& line) { std::fprintf(stderr, "bench nvme: %s\n", line.c_str()); });
  auto cell = [](const nvme::SweepCell& c) {
    return nlohmann::json{
        {"block_size", c.block}, {"queue_depth", c.depth}, {"threads", c.threads}, {"gb_per_s", c.gbps}};
  };
  nlohmann::json aio = {{"block_size", r.best_combined_read.block},
                        {"queue_depth", r.best_combined_read.depth},
                        {"intra_op_parallelism", r.best_combined_read.threads},
                        {"single_submit", false},
                        {"overlap_events", true}};
  if (a.json) {
    nlohmann::json j = {{"path", a.path},
                        {"engine", r.engine},
                        {"best_read", cell(r.best_read)},
                        {"best_write", cell(r.best_write)},
                        {"best_read_gb_per_s", r.best_read.gbps},
                        {"best_write_gb_per_s", r.best_write.gbps},
                        {"plain", {{"read_gb_per_s", r.plain_read_gbps}, {"write_gb_per_s", r.plain_write_gbps}}},
                        {"swap_gb_per_s", r.swap_gbps},
                        {"swap_ratio", r.swap_ratio},
                        {"aio", aio}};
    j["cells"] = nlohmann::json::array();
    for (const auto& c : r.cells) {
      auto x = cell(c);
      x["direction"] = c.write ? "write" : "read";
      j["cells"].push_back(x);
    }
    print_json(j);
    return 0;
  }
  std::printf("zinf bench nvme — %s (%s)\n", a.path.c_str(), r.engine.c_str());
  for (bool write : {false, true}) {
    std::printf("\n%s GB/s    ", write ? "write" : "read ");
    for (int th : o.threads)
      for (int qd : o.depths) std::printf(" t%d/qd%-4d", th, qd);
    std::printf("\n");
    for (std::size_t bs : o.block_sizes) {
      std::printf("  %6zuK    ", bs >> 10);
      for (int th : o.threads)
        for (int qd : o.depths)
          for (const auto& c : r.cells)
            if (c.write == write && c.block == bs && c.depth == qd && c.threads == th) std::printf(" %9.2f", c.gbps);
      std::printf("\n");
    }
  }
  std::printf("\nplain sequential O_DIRECT (1 MiB, QD 1): read %.2f GB/s, write %.2f GB/s\n", r.plain_read_gbps,
              r.plain_write_gbps);
  std::printf("best read  %.2f GB/s at block %zuK, depth %d, threads %d (%.2fx the plain pass)\n", r.best_read.gbps,
              r.best_read.block >> 10, r.best_read.depth, r.best_read.threads, r.best_read.gbps / r.plain_read_gbps);
  std::printf("best write %.2f GB/s at block %zuK, depth %d, threads %d (%.2fx the plain pass)\n", r.best_write.gbps,
              r.best_write.block >> 10, r.best_write.depth, r.best_write.threads,
              r.best_write.gbps / r.plain_write_gbps);
  std::printf("swap mode  %.2f GB/s (read + write) = %.2f of the best raw cells\n", r.swap_gbps, r.swap_ratio);
  std::printf("\npaste into ds_config.json (best read + write):\n\"aio\": %s\n", aio.dump().c_str());
  return 0;
}

// `zinf bench step --help`.
constexpr const char* kBenchStepAbout =
    "Run a few training steps with the config's placement and report each resource's busy time (compute, h2d, "
    "d2h, host update, and each disk under the NVMe tiers, busy while any read or write to it is in flight), the "
    "busiest resource, the step time divided by its busy time (overlap_ratio; 1.0 is perfect overlap), NVMe bytes "
    "read and written per step, and the step time relative to the same model with no offload. Where the placement "
    "runs the speculative Update, the same placement without it too, for the two ratios. The first step is a "
    "warm-up and is not measured. --trace FILE writes the configured placement's run as a Chrome-trace / Perfetto "
    "timeline: every step, the warm-up included (the file's zinf.measured_from says where the measured steps "
    "start; docs/trace.md)";

struct StepArgs {
  ConfigArgs config;
  int steps = 6;
  bool json = false;
  bool profile = false;
  bool baseline = true;  // also run the same model with no offload
  std::string trace;     // --trace: the configured placement's timeline (train.trace_file), every step
};

// The runs of `bench step`: the config's placement, and the same model with no offload; with the
// speculative Update, the placement without it as well.
struct StepRuns {
  Config config;
  TrainResult offload, baseline, unspeculated;
  bool baseline_fits = false;  // the baseline ran (asked for, and the model fit the device without offload)
  bool speculative = false;    // the placement speculates: `unspeculated` ran
  // With activation_checkpointing.cpu_checkpointing: the same placement with the checkpoints kept on
  // the device, to show what moving them costs and saves.
  TrainResult checkpoints_on_device;
  bool checkpoints_compared = false;
};

double overlap_of(const TrainResult& r) {
  const BusyTimes b = r.busy.per(static_cast<double>(std::max<std::int64_t>(1, r.measured_steps)));
  return b.busiest() > 0 ? r.step_seconds / b.busiest() : 0;
}

// The per-step figures `bench step` reports, from the runs' sums over their measured steps.
struct StepFigures {
  double steps = 1;  // measured steps (at least 1, to divide by)
  BusyTimes busy;    // per step
  double overlap_ratio = 0, relative_to_no_offload = 0, tflops = 0, device_busy = 0;
  // cpu_checkpointing, per step: the checkpoint copies on d2h and h2d and the compute stream's waits
  // for them (as measured in the run), the share of the copy time hidden behind the compute (1 - wait /
  // copies), and against the run with the checkpoints on the device the step time added and the
  // device memory saved.
  CheckpointTimes checkpoints;
  double checkpoint_step_added = 0, checkpoint_hidden = 0;
  std::int64_t checkpoint_device_saved = 0;
};

StepRuns run_step_pair(const StepArgs& a, const World& world) {
  std::vector<std::string> common = {"train.eval_interval=0", "train.eval_batches=1", "train.metrics_file=\"\"",
                                     "steps_per_print=1000000"};
  common.push_back("train.steps=" + std::to_string(std::max(2, a.steps)));
  common.insert(common.end(), no_monitor_overrides().begin(), no_monitor_overrides().end());
  std::vector<std::string> traced = common;  // the configured placement's run alone writes the trace
  if (!a.trace.empty()) {
    traced.push_back("train.trace_file=" + nlohmann::json(a.trace).dump());
    traced.push_back("train.trace_steps=" + std::to_string(std::max(2, a.steps)));
  }
  StepRuns runs{load_run_config(a.config, world.size, traced), {}, {}, {}, a.baseline, false, {}, false};
  const Config& c = runs.config;
  if (world.rank == 0) print_notes(c);
  auto progress = [&world](const std::string& s) {
    if (world.rank == 0) std::fprintf(stderr, "bench step: %s\n", s.c_str());
  };
  TrainHooks hooks;
  hooks.log = progress;
  progress("with the configured placement (" + std::string(to_string(c.zero.offload_optimizer.device)) +
           " optimizer, " + std::string(to_string(c.zero.offload_param.device)) + " params)" +
           (a.profile ? ", ops profiled" : ""));
  hooks.profile = a.profile;
  runs.offload = train(c, hooks);
  hooks.profile = false;
  runs.speculative = c.zero.offload_optimizer.speculative;
  if (runs.speculative) {
    progress("the same placement without the speculative Update");
    std::vector<std::string> plain = common;
    plain.push_back("zero_optimization.offload_optimizer.speculative=false");
    runs.unspeculated = train(load_run_config(a.config, world.size, plain), hooks);
  }
  if (c.model.cpu_checkpointing) {
    std::vector<std::string> on_device = common;
    on_device.push_back("activation_checkpointing.cpu_checkpointing=false");
    progress("the same placement with the activation checkpoints on the device");
    runs.checkpoints_on_device = train(load_run_config(a.config, world.size, on_device), hooks);
    runs.checkpoints_compared = true;
  }
  if (!a.baseline) return runs;
  // Nothing offloaded: no speculation, device_grad_accumulation, layer_major or gradient streaming (they
  // need the optimizer off the device), no checkpoints moved.
  std::vector<std::string> none = common;
  for (const char* o :
       {"zero_optimization.offload_optimizer.device=none", "zero_optimization.offload_param.device=none",
        "zero_optimization.offload_optimizer.speculative=false",
        "zero_optimization.offload_optimizer.device_grad_accumulation=false",
        "zero_optimization.offload_optimizer.layer_major=false",
        "zero_optimization.offload_optimizer.gradient_streaming=false",
        "activation_checkpointing.cpu_checkpointing=false"})
    none.push_back(o);
  const Config no_offload = load_run_config(a.config, world.size, none);
  progress("the same model with no offload");
  try {
    runs.baseline = train(no_offload, hooks);
  } catch (const DeviceMemoryError& e) {  // the reason to offload: it does not fit without
    runs.baseline_fits = false;
    progress(std::string("no offload does not fit: ") + e.what());
  }
  return runs;
}

StepFigures step_figures(const StepRuns& runs) {
  const TrainResult& r = runs.offload;
  StepFigures f;
  f.steps = static_cast<double>(std::max<std::int64_t>(1, r.measured_steps));
  f.busy = r.busy.per(f.steps);
  f.overlap_ratio = f.busy.busiest() > 0 ? r.step_seconds / f.busy.busiest() : 0;
  f.relative_to_no_offload =
      runs.baseline_fits && runs.baseline.step_seconds > 0 ? r.step_seconds / runs.baseline.step_seconds : 0;
  const ModelShape shape = model_shape(runs.config.model);
  const double tokens = static_cast<double>(runs.config.train_batch_size) * runs.config.model.seq_len;
  f.tflops = r.step_seconds > 0 ? 6.0 * static_cast<double>(count_params(shape)) * tokens / r.step_seconds / 1e12 : 0;
  f.device_busy = r.step_seconds > 0 ? f.busy.compute / r.step_seconds : 0;
  if (runs.checkpoints_compared) {
    const TrainResult& k = runs.checkpoints_on_device;
    f.checkpoints = {r.checkpoints.d2h / f.steps, r.checkpoints.h2d / f.steps, r.checkpoints.wait / f.steps};
    f.checkpoint_step_added = r.step_seconds - k.step_seconds;
    const double copies = f.checkpoints.d2h + f.checkpoints.h2d;
    f.checkpoint_hidden = copies > 0 ? std::clamp(1.0 - f.checkpoints.wait / copies, 0.0, 1.0) : 1.0;
    f.checkpoint_device_saved =
        static_cast<std::int64_t>(k.peak_device_bytes) - static_cast<std::int64_t>(r.peak_device_bytes);
  }
  return f;
}

void print_step_json(const StepArgs& a, const StepRuns& runs, const StepFigures& f) {
  const TrainResult& r = runs.offload;
  const TrainResult& base = runs.baseline;
  nlohmann::json j = {{"config", runs.config.source},
                      {"steps_measured", r.measured_steps},
                      {"step_s", r.step_seconds},
                      {"busiest", f.busy.busiest_name()},
                      {"overlap_ratio", f.overlap_ratio},
                      {"tflops", f.tflops},
                      {"device_busy_fraction", f.device_busy},
                      {"no_offload_fits", a.baseline ? nlohmann::json(runs.baseline_fits) : nlohmann::json(nullptr)},
                      {"no_offload_step_s", base.step_seconds},
                      {"relative_to_no_offload", f.relative_to_no_offload},
                      {"params_digest", r.params_digest},
                      {"no_offload_params_digest", base.params_digest},
                      {"peak_device_bytes", r.peak_device_bytes},
                      {"device_budget", r.device_budget}};
  if (runs.speculative) {
    j["rollbacks"] = r.rollbacks;
    j["unspeculated_step_s"] = runs.unspeculated.step_seconds;
    j["unspeculated_overlap_ratio"] = overlap_of(runs.unspeculated);
    j["unspeculated_params_digest"] = runs.unspeculated.params_digest;
  }
  f.busy.each([&](const std::string& name, double sec) { j["busy_s"][name] = sec; });
  j["busiest_s"] = f.busy.busiest();
  j["nvme_read_bytes_per_step"] = f.busy.nvme_read_bytes();
  j["nvme_write_bytes_per_step"] = f.busy.nvme_write_bytes();
  j["disks"] = nlohmann::json::array();
  for (const auto& d : f.busy.disks)  // per step; busy counts a read and a write in flight together once
    j["disks"].push_back({{"name", d.name},
                          {"busy_s", d.busy},
                          {"read_s", d.read},
                          {"write_s", d.write},
                          {"read_plus_write_s", d.read + d.write},
                          {"read_bytes", d.read_bytes},
                          {"write_bytes", d.write_bytes}});
  if (runs.checkpoints_compared)
    j["cpu_checkpointing"] = {{"copy_d2h_s", f.checkpoints.d2h},
                              {"copy_h2d_s", f.checkpoints.h2d},
                              {"compute_wait_s", f.checkpoints.wait},
                              {"step_s_added", f.checkpoint_step_added},
                              {"hidden_fraction", f.checkpoint_hidden},
                              {"device_bytes_saved", f.checkpoint_device_saved},
                              {"on_device_step_s", runs.checkpoints_on_device.step_seconds},
                              {"on_device_params_digest", runs.checkpoints_on_device.params_digest}};
  if (!a.trace.empty()) {
    j["trace_file"] = a.trace;
    j["trace_steps"] = {1, std::max(2, a.steps)};  // the warm-up too; measured from step 2
  }
  if (a.profile) {
    j["profile"] = nlohmann::json::array();
    for (const auto& o : r.profile)
      j["profile"].push_back({{"op", o.name},
                              {"calls_per_step", static_cast<double>(o.calls) / f.steps},
                              {"seconds_per_step", o.seconds / f.steps},
                              {"share_of_step", r.step_seconds > 0 ? o.seconds / f.steps / r.step_seconds : 0.0},
                              {"tflops", o.seconds > 0 ? o.flops / o.seconds / 1e12 : 0.0}});
  }
  print_json(j);
}

// --profile: the model's ops by kind, then the engine's own busy times beside them.
void print_step_profile(const StepRuns& runs, const StepFigures& f) {
  const TrainResult& r = runs.offload;
  std::printf("\n%s", op_table(r.profile, f.steps, r.step_seconds, f.busy, op_timing(runs.config)).c_str());
}

void print_step_text(const StepArgs& a, const StepRuns& runs, const StepFigures& f) {
  const TrainResult& r = runs.offload;
  const TrainResult& base = runs.baseline;
  std::printf("zinf bench step — %s, %lld measured steps (after one warm-up)\n", runs.config.source.c_str(),
              static_cast<long long>(r.measured_steps));
  std::printf("  busy per step (ms):");
  f.busy.each([](const std::string& name, double sec) { std::printf(" %s %.1f", name.c_str(), 1e3 * sec); });
  std::printf("\n");
  for (const auto& d : f.busy.disks)  // one resource: its reads and writes overlap on it
    std::printf("  disk %s: busy %.1f ms (reads %.1f + writes %.1f = %.1f summed; busy is %.2f of the sum), "
                "read %.1f MB, wrote %.1f MB\n",
                d.name.c_str(), 1e3 * d.busy, 1e3 * d.read, 1e3 * d.write, 1e3 * (d.read + d.write),
                d.read + d.write > 0 ? d.busy / (d.read + d.write) : 0.0, d.read_bytes / 1e6, d.write_bytes / 1e6);
  std::printf("  step time %.1f ms; busiest resource: %s (%.1f ms)\n", 1e3 * r.step_seconds,
              f.busy.busiest_name().c_str(), 1e3 * f.busy.busiest());
  std::printf(
      "  overlap ratio (step time / busiest resource): %.3f   (1.0 = perfect overlap; the busiest sets the pace)\n",
      f.overlap_ratio);
  std::printf(
      "  %.2f TFLOPS (6 x params x tokens / step time), device busy %.0f%% of the step, peak device memory %s of %s\n",
      f.tflops, 100 * f.device_busy, format_bytes(r.peak_device_bytes).c_str(), format_bytes(r.device_budget).c_str());
  if (runs.speculative) {
    const TrainResult& u = runs.unspeculated;
    std::printf(
        "  speculative Update: overlap ratio %.3f, step %.1f ms, %lld rollbacks; without it: overlap ratio %.3f, "
        "step %.1f ms (digests %s)\n",
        f.overlap_ratio, 1e3 * r.step_seconds, static_cast<long long>(r.rollbacks), overlap_of(u), 1e3 * u.step_seconds,
        r.params_digest == u.params_digest ? "bit-identical" : "DIFFERENT");
  }
  if (runs.checkpoints_compared) {
    const TrainResult& k = runs.checkpoints_on_device;
    std::printf(
        "  activation checkpoints in host memory: copies %.2f ms per step (d2h %.2f, h2d %.2f), compute waited %.2f ms "
        "for them: %.0f%% of the copy time hidden\n",
        1e3 * (f.checkpoints.d2h + f.checkpoints.h2d), 1e3 * f.checkpoints.d2h, 1e3 * f.checkpoints.h2d,
        1e3 * f.checkpoints.wait, 100 * f.checkpoint_hidden);
    std::printf(
        "  against the checkpoints on the device (%.1f ms per step): step time %+.2f ms, device memory %s less, "
        "digest %s\n",
        1e3 * k.step_seconds, 1e3 * f.checkpoint_step_added,
        format_bytes(static_cast<std::uint64_t>(std::max<std::int64_t>(0, f.checkpoint_device_saved))).c_str(),
        k.params_digest == r.params_digest ? "bit-identical" : "DIFFERENT");
  }
  if (runs.baseline_fits) {
    std::printf("  relative to no offload (%.1f ms per step): %.3f\n", 1e3 * base.step_seconds,
                f.relative_to_no_offload);
    std::printf("  params digests: offload %s, no offload %s (%s)\n", r.params_digest.c_str(),
                base.params_digest.c_str(), r.params_digest == base.params_digest ? "bit-identical" : "DIFFERENT");
  } else if (a.baseline) {
    std::printf("  without offload the model does not fit the device budget\n");
  }
  if (!a.trace.empty())
    std::printf("  trace: steps 1-%d in %s (step 1 is the warm-up, outside the figures above)\n", std::max(2, a.steps),
                a.trace.c_str());
  if (a.profile) print_step_profile(runs, f);
}

int run_step(const StepArgs& a) {
  if (!a.trace.empty()) check_trace_path(a.trace, "--trace");  // before any run
  const World world = detect_world();  // under mpirun: every rank trains, rank 0 reports (its own busy times)
  const StepRuns runs = run_step_pair(a, world);
  const StepFigures figures = step_figures(runs);
  if (world.rank != 0) return 0;
  if (a.json)
    print_step_json(a, runs, figures);
  else
    print_step_text(a, runs, figures);
  return 0;
}

// `zinf bench pcie --help`.
constexpr const char* kBenchPcieAbout =
    "Pinned host-to-device, device-to-host, and both at once, on dedicated CUDA streams timed with events, "
    "against the nominal per-direction rate of the GPU's PCIe link (generation x width, read from the device)";

struct PcieArgs {
  int device = 0;
  std::string size = "256M";
  int reps = 5;
  bool json = false;
};

int run_pcie(const PcieArgs& a) {
  const std::uint64_t bytes = parse_bytes(a.size, "--size");
  if (bytes < (1 << 20)) throw ConfigError("--size must be at least 1M");
  const cuda::PcieResult r = cuda::bench_pcie(a.device, bytes, a.reps, [&](const std::string& l) {
    if (!a.json) std::fprintf(stderr, "bench pcie: %s\n", l.c_str());
  });
  auto ratio = [&](double g) { return r.nominal_gbps > 0 ? g / r.nominal_gbps : 0.0; };
  // One JSON object of named fields per command, as `zinf train --json` prints its result.
  if (a.json) {
    nlohmann::json j = {{"gpu", r.gpu},
                        {"pcie_gen", r.pcie_gen},
                        {"pcie_width", r.pcie_width},
                        {"nominal_gb_per_s", r.nominal_gbps},
                        {"bytes", r.bytes},
                        {"h2d_gb_per_s", r.h2d_gbps},
                        {"d2h_gb_per_s", r.d2h_gbps},
                        {"both_gb_per_s", r.both_gbps},
                        {"h2d_ratio", ratio(r.h2d_gbps)},
                        {"d2h_ratio", ratio(r.d2h_gbps)},
                        {"both_ratio", r.nominal_gbps > 0 ? r.both_gbps / (2 * r.nominal_gbps) : 0.0}};
    print_json(j);
    return 0;
  }
  std::printf("zinf bench pcie — %s, PCIe gen%d x%d (nominal %.1f GB/s per direction), %s per copy, best of %d\n",
              r.gpu.c_str(), r.pcie_gen, r.pcie_width, r.nominal_gbps, a.size.c_str(), a.reps);
  std::printf("  H2D  %7.2f GB/s  (%.2f of nominal)\n", r.h2d_gbps, ratio(r.h2d_gbps));
  std::printf("  D2H  %7.2f GB/s  (%.2f of nominal)\n", r.d2h_gbps, ratio(r.d2h_gbps));
  std::printf("  both %7.2f GB/s  (%.2f of twice nominal)\n", r.both_gbps,
              r.nominal_gbps > 0 ? r.both_gbps / (2 * r.nominal_gbps) : 0.0);
  return 0;
}

// `zinf bench attention --help`.
constexpr const char* kBenchAttentionAbout =
    "The CUDA fast kernels' causal attention, forward then backward, on one shape: cuDNN's fused flash attention "
    "(--attention cudnn) or the project's wmma flash kernel (wmma), Llama's layout (q [B·T, H·D], k and v "
    "[B·T, KV·D]; KV = H is GPT's heads). Reports seconds per forward+backward (median of --iters after one "
    "untimed call, which builds cuDNN's plans) and TFLOPS counting the products causal attention needs: "
    "7·B·H·T²·D (forward 2, backward 5 of B·H·T²·D each: S, O; S again, dV, dP, dQ, dK; half of every T×T product "
    "is masked). Correctness is the GPU check's (scripts/gpu-check.sh correctness, its attention section)";

struct AttentionArgs {
  std::string shape = "4,1024,25,25,64";
  std::string attention = "cudnn";
  std::string dtype = "bf16";
  int iters = 10;
  bool json = false;
};

int run_attention(const AttentionArgs& a) {
  int B = 0, T = 0, H = 0, KV = 0, D = 0;
  if (std::sscanf(a.shape.c_str(), "%d,%d,%d,%d,%d", &B, &T, &H, &KV, &D) != 5 || B < 1 || T < 1 || H < 1 ||
      KV < 1 || D < 1 || H % KV != 0)
    throw ConfigError("--shape: expected B,T,H,KV,D with positive sizes and KV dividing H, got '" + a.shape + "'");
  const Precision p = a.dtype == "fp16" ? Precision::fp16 : Precision::bf16;
  const Attention attention = a.attention == "wmma" ? Attention::wmma : Attention::cudnn;
  const backends::Backend& be = backends::backend_for(DeviceType::cuda);
  backends::DeviceSpec spec;
  auto dev = be.make_device(spec);
  auto ops = be.make_ops(*dev, p, 1, Kernels::fast, attention);
  const DType S = dtype_of(p);
  const std::size_t R = static_cast<std::size_t>(B) * static_cast<std::size_t>(T);
  const std::size_t qn = R * static_cast<std::size_t>(H) * D, kn = R * static_cast<std::size_t>(KV) * D,
                    ln = static_cast<std::size_t>(B) * H * T, e = dtype_bytes(S);
  // Inputs of magnitude about 1 (a fixed pattern: the time does not depend on the values).
  auto filled = [&](std::size_t n, unsigned salt) {
    std::vector<std::uint16_t> h(n);
    for (std::size_t i = 0; i < n; ++i) {
      const float x = static_cast<float>(static_cast<int>((i * 2654435761u + salt) % 2001u) - 1000) / 1000.0f;
      std::uint32_t b;
      std::memcpy(&b, &x, 4);
      h[i] = S == DType::bf16 ? static_cast<std::uint16_t>(b >> 16) : cpu_adam::spec::fp32_to_fp16(x);
    }
    DeviceBuffer d(*dev, n * e, "bench attention");
    dev->copy_to_device(d.as<void>(), h.data(), n * e, StreamRole::compute);
    dev->synchronize(StreamRole::compute);
    return d;
  };
  DeviceBuffer q = filled(qn, 1), k = filled(kn, 2), v = filled(kn, 3), dout = filled(qn, 4);
  DeviceBuffer out(*dev, qn * e, "bench attention"), lse(*dev, ln * 4, "bench attention"),
      dq(*dev, qn * e, "bench attention"), dk(*dev, kn * e, "bench attention"), dv(*dev, kn * e, "bench attention");
  auto view = [&](DeviceBuffer& b, std::size_t n, DType t) { return TensorView(b.as<void>(), t, n); };
  auto once = [&] {
    ops->gqa_attention_forward(view(out, qn, S), view(lse, ln, DType::fp32), view(q, qn, S), view(k, kn, S),
                               view(v, kn, S), B, T, H, KV, D, 0);
    ops->gqa_attention_backward(view(dq, qn, S), view(dk, kn, S), view(dv, kn, S), view(dout, qn, S), view(q, qn, S),
                                view(k, kn, S), view(v, kn, S), view(lse, ln, DType::fp32), view(out, qn, S), B, T, H,
                                KV, D, 0);
  };
  once();  // builds cuDNN's plans (or says the shape runs the wmma kernel)
  dev->synchronize(StreamRole::compute);
  std::vector<double> times;
  for (int i = 0; i < a.iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    once();
    dev->synchronize(StreamRole::compute);
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  const double sec = times[times.size() / 2];
  const double flops = 7.0 * B * H * static_cast<double>(T) * T * D;
  if (a.json) {
    print_json({{"shape", {{"B", B}, {"T", T}, {"H", H}, {"KV", KV}, {"D", D}}},
                {"attention", a.attention},
                {"dtype", std::string(to_string(S))},
                {"iters", a.iters},
                {"fwd_bwd_s", sec},
                {"tflops", flops / sec / 1e12}});
    return 0;
  }
  std::printf("zinf bench attention — %s, B %d T %d H %d KV %d D %d, %s: %.3f ms forward+backward, %.1f TFLOPS\n",
              a.attention.c_str(), B, T, H, KV, D, std::string(to_string(S)).c_str(), sec * 1e3, flops / sec / 1e12);
  return 0;
}

// `zinf bench comm --help`.
constexpr const char* kBenchCommAbout =
    "The data-parallel collectives as zinf's engine uses them — all-gather, all-to-all, reduce-scatter (all-to-all, "
    "then a rank-ordered sum), all-reduce, broadcast — on the device's memory through its transport (MPI on the CPU "
    "device, NCCL on CUDA), per size, with algorithm and bus bandwidth the way nccl-tests reports them, against the "
    "device's own copy rate at the same size. Launch it with mpirun -np N; every rank takes part, rank 0 prints";

struct CommArgs {
  std::vector<std::string> sizes = {"64K", "1M", "16M", "64M"};
  int iters = 10;
  std::string device = "cpu";
  bool json = false;
};

int run_comm(const CommArgs& a) {
  const World w = detect_world();
  auto host = make_world_comm(w);
  std::vector<std::uint64_t> sizes;
  for (const auto& s : a.sizes) sizes.push_back(parse_bytes(s, "--sizes"));
  std::uint64_t largest = 0;
  for (auto s : sizes) largest = std::max(largest, s);
  const std::size_t budget = static_cast<std::size_t>(largest) * 3 + (64 << 20);
  std::unique_ptr<Device> device;
  std::unique_ptr<cpu_adam::HostThreads> threads;
  std::unique_ptr<offload::EngineKernels> kernels;
  std::unique_ptr<Comm> device_comm;
  // CUDA: NCCL on GPU memory, one GPU per rank; CPU: MPI on the CPU device's memory.
  const backends::Backend& be = backends::backend_for(a.device == "cuda" ? DeviceType::cuda : DeviceType::cpu);
  backends::DeviceSpec spec;
  spec.local_rank = w.local_rank;
  spec.budget_bytes = budget;
  device = be.make_device(spec);
  threads = std::make_unique<cpu_adam::HostThreads>(0, false);
  kernels = be.make_engine_kernels(*device, *threads);
  device_comm = be.make_device_comm(*host, w.local_rank);
  Comm& comm = device_comm ? *device_comm : *host;
  const auto rows = bench_comm(comm, *device, *kernels, sizes, a.iters);
  if (comm.rank() != 0) return 0;
  const char* ref = a.device == "cuda" ? "device copy" : "memcpy";
  if (a.json) {
    nlohmann::json j = {{"backend", comm.backend()},
                        {"device", device->name()},
                        {"ranks", comm.size()},
                        {"reference", ref},
                        {"rows", nlohmann::json::array()}};
    for (const auto& r : rows)
      j["rows"].push_back({{"op", r.op},
                           {"bytes", r.bytes},
                           {"seconds", r.seconds},
                           {"algbw_gb_per_s", r.algbw},
                           {"busbw_gb_per_s", r.busbw},
                           {"copy_gb_per_s", r.copy_gbps},
                           {"busbw_to_copy", r.copy_gbps > 0 ? r.busbw / r.copy_gbps : 0.0}});
    print_json(j);
    return 0;
  }
  std::printf("zinf bench comm — %s on %s, %d rank(s), mean of %d calls, the slowest rank's time\n",
              comm.backend().c_str(), device->name().c_str(), comm.size(), a.iters);
  if (comm.size() == 1) std::printf("note: one rank moves nothing; launch with mpirun -np N\n");
  std::printf("  %-10s %-15s %12s %12s %12s %12s %8s\n", "bytes", "op", "time us", "algbw GB/s", "busbw GB/s",
              a.device == "cuda" ? "d2d GB/s" : "memcpy GB/s", "bus/copy");
  for (const auto& r : rows)
    std::printf("  %-10s %-15s %12.1f %12.2f %12.2f %12.2f %8.2f\n", format_bytes(r.bytes).c_str(), r.op.c_str(),
                r.seconds * 1e6, r.algbw, r.busbw, r.copy_gbps, r.copy_gbps > 0 ? r.busbw / r.copy_gbps : 0.0);
  return 0;
}

// `zinf bench tokenize --help`.
constexpr const char* kBenchTokenizeAbout =
    "Encode text files (concatenated) with a Hugging Face byte-level BPE tokenizer.json: one thread (serial "
    "split) against the parallel encode zinf uses (chunks of about 1 MiB on --threads threads). Reports MB/s and "
    "tokens/s of each (and MB per CPU-second: what a core does on a shared machine) and checks that both give "
    "the same ids";

struct TokenizeBenchArgs {
  std::string tokenizer;
  std::vector<std::string> inputs;
  int threads = 0;
  int reps = 1;
  bool json = false;
};

int run_bench_tokenize(const TokenizeBenchArgs& a) {
  std::string file = a.tokenizer;
  if (std::filesystem::is_directory(file)) file = (std::filesystem::path(file) / "tokenizer.json").string();
  const auto tok = open_bpe_tokenizer(file, "--tokenizer");
  std::string text;
  for (const auto& in : a.inputs) text += read_input_file(in, "--input");
  if (text.empty()) throw ConfigError("--input: the text is empty");
  const int threads = a.threads > 0 ? a.threads : tbb::info::default_concurrency();
  tbb::task_arena arena(threads);
  // CPU seconds of the whole process: on a shared machine, MB per CPU-second says what one core does
  // even when the wall clock says mostly what the neighbours do.
  const auto cpu_now = [] {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  };
  struct Run {
    double seconds = 1e300, cpu_seconds = 0;
    std::vector<std::uint32_t> ids;
  };
  const auto measure = [&](std::size_t chunk) {
    Run r;
    for (int i = 0; i < a.reps; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      const double c0 = cpu_now();
      arena.execute([&] { r.ids = bpe_encode_chunked(*tok, text, false, chunk); });
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (s < r.seconds) r.seconds = s, r.cpu_seconds = cpu_now() - c0;
    }
    return r;
  };
  const Run serial = measure(0);
  const Run parallel = measure(std::size_t{1} << 20);
  if (serial.ids != parallel.ids)
    throw Error("bench tokenize: the parallel encode gave other ids than the serial one (a bug; please report it)");
  const double mb = static_cast<double>(text.size()) / 1e6, n = static_cast<double>(serial.ids.size());
  if (a.json) {
    const auto row = [&](const Run& r) {
      return nlohmann::json{{"seconds", r.seconds},
                            {"cpu_seconds", r.cpu_seconds},
                            {"mb_per_s", mb / r.seconds},
                            {"tokens_per_s", n / r.seconds},
                            {"mb_per_cpu_s", mb / r.cpu_seconds}};
    };
    print_json({{"tokenizer", file},
                {"bytes", text.size()},
                {"tokens", serial.ids.size()},
                {"threads", threads},
                {"serial", row(serial)},
                {"parallel", row(parallel)},
                {"speedup", serial.seconds / parallel.seconds}});
    return 0;
  }
  std::printf("bench tokenize: %s, %.1f MB of text -> %zu tokens (%.2f bytes/token)\n", tok->description().c_str(),
              mb, serial.ids.size(), static_cast<double>(text.size()) / n);
  std::printf("  %-28s %10s %14s %8s %8s %12s\n", "", "MB/s", "tokens/s", "s", "CPU s", "MB/CPU-s");
  const auto line = [&](const std::string& name, const Run& r) {
    std::printf("  %-28s %10.1f %14.0f %8.2f %8.2f %12.1f\n", name.c_str(), mb / r.seconds, n / r.seconds, r.seconds,
                r.cpu_seconds, mb / r.cpu_seconds);
  };
  line("serial (1 thread)", serial);
  line("parallel (" + std::to_string(threads) + " threads)", parallel);
  return 0;
}

Command add_bench_tokenize(CLI::App& bench) {
  auto [sub, args] = add_subcommand<TokenizeBenchArgs>(bench, "tokenize", kBenchTokenizeAbout);
  sub->add_option("--tokenizer", args->tokenizer, "A tokenizer.json, or a model folder holding one")
      ->required()
      ->check(CLI::ExistingPath);
  sub->add_option("--input", args->inputs, "Text files")->required()->check(CLI::ExistingFile);
  sub->add_option("--threads", args->threads, "Threads of the parallel encode (0 = all cores)")
      ->check(CLI::Range(0, 4096))
      ->capture_default_str();
  sub->add_option("--reps", args->reps, "Repetitions; the best is reported")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  sub->add_flag("--json", args->json, "Print one JSON object");
  return command(sub, args, run_bench_tokenize);
}

Command add_bench_adam(CLI::App& bench) {
  auto [sub, args] = add_subcommand<AdamArgs>(bench, "adam", kBenchAdamAbout);
  sub->add_option("--params", args->params, "Parameters to update, e.g. 64M, 256M (K/M/G = 10^3/10^6/10^9)")
      ->capture_default_str();
  sub->add_option("--threads", args->threads, "Host threads (0 = physical cores)")->check(CLI::Range(0, 4096))->capture_default_str();
  sub->add_option("--reps", args->reps, "Repetitions; the best is reported")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  sub->add_option("--simd", args->simd, "Cap the SIMD path: auto, avx512, avx2, scalar")->capture_default_str();
  sub->add_option("--states", args->states, "How m and v are stored: fp32, bf16, 8bit")->capture_default_str();
  sub->add_flag("--json", args->json, "Print one JSON object (the ratio as `ratio`)");
  return command(sub, args, run_adam);
}

Command add_bench_nvme(CLI::App& bench) {
  auto [sub, args] = add_subcommand<NvmeArgs>(bench, "nvme", kBenchNvmeAbout);
  sub->add_option("--path", args->path, "Directory on the drive to measure")->required()->type_name("DIR");
  sub->add_option("--size", args->size, "File size")->capture_default_str();
  sub->add_option("--cell", args->cell, "Bytes moved per sweep cell")->capture_default_str();
  sub->add_option("--blocks", args->blocks, "Request sizes")->delimiter(',')->capture_default_str();
  sub->add_option("--depths", args->depths, "Queue depths per thread")->delimiter(',')->capture_default_str();
  sub->add_option("--threads", args->threads, "I/O thread counts (rings)")
      ->delimiter(',')
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  sub->add_option("--swap-item", args->swap_item, "Sub-group size in swap mode")->capture_default_str();
  sub->add_option("--engine", args->engine, "auto, uring or posix")
      ->check(CLI::IsMember({"auto", "uring", "posix"}))
      ->capture_default_str();
  sub->add_flag("--json", args->json, "Print one JSON object (best_read/best_write GB/s, swap_ratio)");
  return command(sub, args, run_nvme);
}

Command add_bench_step(CLI::App& bench) {
  auto [sub, args] = add_subcommand<StepArgs>(bench, "step", kBenchStepAbout);
  add_config_options(*sub, args->config);
  sub->add_option("--steps", args->steps, "Steps to run (the first is not measured)")->capture_default_str();
  sub->add_flag("--json", args->json,
                "Print one JSON object (busiest, overlap_ratio, busy_s, disks, NVMe bytes, relative_to_no_offload)");
  sub->add_flag("!--no-baseline", args->baseline, "Skip the run with no offload (relative_to_no_offload is then 0)");
  sub->add_flag("--profile", args->profile,
                "Also time the model's ops by kind on the compute stream (GEMM classes, attention, norms, elementwise, "
                "embeddings, "
                "LM head, copies): time per step, share of the step, calls, achieved TFLOPS");
  sub->add_option("--trace", args->trace,
                  "Write the configured placement's run as a Chrome-trace / Perfetto JSON timeline to FILE: one track "
                  "per stream, host worker and disk, a span per supernode per unit, every step (the warm-up too)")
      ->type_name("FILE");
  return command(sub, args, run_step);
}

Command add_bench_pcie(CLI::App& bench) {
  auto [sub, args] = add_subcommand<PcieArgs>(bench, "pcie", kBenchPcieAbout);
  sub->add_option("--device", args->device, "CUDA device index")->capture_default_str();
  sub->add_option("--size", args->size, "Bytes per copy")->capture_default_str();
  sub->add_option("--reps", args->reps, "Repetitions; the best is reported")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  sub->add_flag("--json", args->json, "Print one JSON object");
  return command(sub, args, run_pcie);
}

Command add_bench_attention(CLI::App& bench) {
  auto [sub, args] = add_subcommand<AttentionArgs>(bench, "attention", kBenchAttentionAbout);
  sub->add_option("--shape", args->shape, "B,T,H,KV,D (batch, sequence, heads, key/value heads, head width)")
      ->capture_default_str();
  sub->add_option("--attention", args->attention, "cudnn or wmma")
      ->check(CLI::IsMember({"cudnn", "wmma"}))
      ->capture_default_str();
  sub->add_option("--dtype", args->dtype, "bf16 or fp16")
      ->check(CLI::IsMember({"bf16", "fp16"}))
      ->capture_default_str();
  sub->add_option("--iters", args->iters, "Timed forward+backward calls; the median is reported")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();
  sub->add_flag("--json", args->json, "Print one JSON object");
  return command(sub, args, run_attention);
}

Command add_bench_comm(CLI::App& bench) {
  auto [sub, args] = add_subcommand<CommArgs>(bench, "comm", kBenchCommAbout);
  sub->add_option("--sizes", args->sizes, "Buffer sizes (every rank's parts together)")
      ->delimiter(',')
      ->capture_default_str();
  sub->add_option("--iters", args->iters, "Calls per size and collective")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  sub->add_option("--device", args->device, "cpu (MPI) or cuda (NCCL, one GPU per rank: the local rank's)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  sub->add_flag("--json", args->json, "Print one JSON object");
  return command(sub, args, run_comm);
}

}  // namespace

std::vector<Command> add_bench(CLI::App& app) {
  CLI::App* bench = app.add_subcommand(
      "bench", "Measure what this machine can do, as ratios against limits measured in the same run");
  bench->require_subcommand(1);
  return {add_bench_adam(*bench),  add_bench_nvme(*bench), add_bench_step(*bench),     add_bench_pcie(*bench),
          add_bench_comm(*bench), add_bench_tokenize(*bench), add_bench_attention(*bench)};
}

}  // namespace zinf::cli
