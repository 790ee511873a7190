// train.cpp — `zinf train --config C [--set k=v]... [--json]`.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>

#include "app/config/config.h"
#include "app/config/device_choice.h"
#include "app/plan/plan.h"
#include "app/train/checkpoint.h"
#include "app/train/train.h"
#include "commands.h"
#include "signals.h"
#include "zinf/backends/world.h"
#include "zinf/error.h"
#include "zinf/offload/placement.h"
#include "zinf/backends/sysinfo.h"

namespace zinf::cli {
namespace {

// Runs train() so that SIGINT, SIGTERM or SIGUSR1 stop it after the current step or evaluation batch
// (signals.h).
TrainResult train_until_stopped(const Config& c, TrainHooks hooks) {
  hooks.stop = &stop_requested();
  hooks.stoppable = &run_stoppable();
  hooks.stop_signal = &stop_signal();
  // However train() ends — returning, or throwing on the way to its error line — a signal from then on
  // ends the process at once: no step is coming to stop after.
  struct NotStoppableAfter {
    ~NotStoppableAfter() { run_stoppable().store(false); }
  } guard;
  TrainResult r = train(c, hooks);
  note_run_finished();
  return r;
}

// `zinf train --help`.
constexpr const char* kTrainAbout =
    "Train the configured GPT model: prints the resolved config, a progress line every steps_per_print steps "
    "(loss, lr, loss scale, grad norm, tokens/s; fwd/bwd/update times with wall_clock_breakdown), validation loss "
    "every train.eval_interval steps, and a final line `final step=N loss=X val_loss=Y params_digest=HEX` (a hash "
    "of every fp32 master parameter: equal digests mean bit-identical runs). Checkpoints go to train.checkpoint_dir "
    "every train.checkpoint_interval steps, at the end, and on a stop: SIGINT (Ctrl-C), SIGTERM or SIGUSR1 stop after "
    "the current step or evaluation batch (every rank of a job after the same step) and exit with 128 + the "
    "signal's number; a second signal, SIGHUP and SIGQUIT stop at once (swap directories are still removed). "
    "train.trace_file writes a Chrome-trace / Perfetto timeline of the first train.trace_steps steps (default 8)";

struct TrainArgs {
  ConfigArgs config;
  bool json = false;
  std::string resume;
};

void flatten(const nlohmann::json& j, const std::string& prefix,
             std::vector<std::pair<std::string, std::string>>& out) {
  if (j.is_object() && !j.empty()) {
    for (auto it = j.begin(); it != j.end(); ++it)
      flatten(it.value(), prefix.empty() ? it.key() : prefix + "." + it.key(), out);
  } else {
    out.emplace_back(prefix, j.dump());
  }
}

// The other ranks of a data-parallel job train silently (rank 0 reports); their errors still print.
int run_other_rank(const Config& c, const std::string& resume) {
  TrainHooks hooks;
  hooks.resume = resume;
  const TrainResult r = train_until_stopped(c, hooks);
  return r.interrupted ? stopped_exit_code(r.stop_signal) : 0;
}

// The progress log could not be written: a log redirected to a full disk stops the run at its first
// lost line rather than at the end.
[[noreturn]] void throw_log_error(FILE* out) {
  const int e = errno;
  throw IoError(
      std::string(out == stdout ? "stdout" : "stderr") + ": cannot write the progress log (" + std::strerror(e) + ")",
      e);
}

int run_train(const TrainArgs& a) {
  const World world = detect_world();
  const Config config = load_run_config(a.config, world.size);
  if (world.rank != 0) return run_other_rank(config, a.resume);
  FILE* out = a.json ? stderr : stdout;  // with --json, stdout carries only the summary object
  print_notes(config);
  std::vector<std::pair<std::string, std::string>> rows;
  flatten(nlohmann::json::parse(config.resolved_json), "", rows);
  std::fprintf(out, "zinf train — %s (resolved config)\n", config.source.c_str());
  for (const auto& [k, v] : rows) std::fprintf(out, "  %-58s %s\n", k.c_str(), v.c_str());
  std::fprintf(out, "device.type resolved: %s\n", describe_device(config).c_str());
  if (std::fflush(out) != 0 || std::ferror(out)) throw_log_error(out);

  TrainHooks hooks;
  hooks.resume = a.resume;
  hooks.log = [out](const std::string& s) {
    if (std::fprintf(out, "%s\n", s.c_str()) < 0 || std::fflush(out) != 0) throw_log_error(out);
  };
  const TrainResult r = train_until_stopped(config, hooks);
  // The process's peak resident set beside the host memory `zinf plan` predicts for this config.
  const ModelShape shape = model_shape(config.model);
  const std::uint64_t planned_rss =
      host_footprint(config, offload::make_plan(make_plan_input(config, shape)), shape).total();
  const std::uint64_t peak_rss = peak_resident_bytes();
  std::fprintf(out, "host memory: peak RSS %s, %.3f x the %s zinf plan predicts\n", format_bytes(peak_rss).c_str(),
               planned_rss ? static_cast<double>(peak_rss) / static_cast<double>(planned_rss) : 0.0,
               format_bytes(planned_rss).c_str());
  std::fprintf(out, "final step=%lld loss=%.6f val_loss=%.6f params_digest=%s\n", static_cast<long long>(r.steps),
               r.loss, r.val_loss, r.params_digest.c_str());
  if (a.json) {
    nlohmann::json j = {{"steps", r.steps},
                        {"skipped", r.skipped},
                        {"loss", r.loss},
                        {"resumed_from", r.resumed_from},
                        {"checkpoint_seconds", r.checkpoint_seconds},
                        {"val_loss", r.val_loss},
                        {"first_val_loss", r.first_val_loss},
                        {"params_digest", r.params_digest},
                        {"tokens_per_s", r.tokens_per_s},
                        {"peak_device_bytes", r.peak_device_bytes},
                        {"peak_rss_bytes", peak_rss},
                        {"planned_rss_bytes", planned_rss},
                        {"interrupted", r.interrupted}};
    print_json(j);
  }
  return r.interrupted ? stopped_exit_code(r.stop_signal) : 0;
}

// `zinf eval --help`.
constexpr const char* kEvalAbout =
    "Evaluate a model without training: the mean loss over train.eval_batches windows of the validation split "
    "(data.path, data.val_fraction), for a checkpoint (--checkpoint), a GPT-2 safetensors file or a Hugging Face "
    "folder (--weights), or the config's initial parameters. The same as `zinf train` with train.steps=0";

struct EvalArgs {
  ConfigArgs config;
  std::string checkpoint, weights;
  bool json = false;
};

// `zinf eval --checkpoint` of a config that does not name the model (no preset, init_from or shape
// key; seq_len, if given, the checkpoint's): the model is the checkpoint's, as `zinf export` and
// `zinf generate` take it. A checkpoint that cannot be read is left for the evaluation to report.
void adopt_checkpoint_shape(Config& c, const std::string& which) {
  if (which.empty() || c.model.shape_given) return;
  std::vector<std::string> paths = {which};  // `latest`: the newest whose manifest reads
  if (which == "latest") {
    if (c.train.checkpoint_dir.empty()) return;
    paths.clear();
    for (const auto& [step, path] : list_checkpoints(c.train.checkpoint_dir)) paths.push_back(path);
  }
  std::optional<ModelShape> found;
  for (const auto& path : paths) {
    try {
      found = checkpoint_shape(path);
      break;
    } catch (const Error&) {
    }
  }
  if (!found) return;
  const ModelShape s = *found;
  if (c.model.seq_len_given && c.model.seq_len != s.seq_len) return;
  set_model_shape(c.model, s);
  c.model.preset = "";
  std::erase_if(c.notes, [](const std::string& n) { return n.rfind("model: no model section", 0) == 0; });
  c.notes.push_back("the model is the checkpoint's (" + std::to_string(s.n_layer) + " layers, d_model " +
                    std::to_string(s.d_model) + ", family " + std::string(to_string(s.family)) + ")");
}

int run_eval(const EvalArgs& a) {
  if (!a.checkpoint.empty() && !a.weights.empty())
    throw ConfigError("zinf eval: give --checkpoint or --weights, not both");
  std::vector<std::string> overrides = {"train.steps=0"};
  overrides.insert(overrides.end(), no_monitor_overrides().begin(), no_monitor_overrides().end());
  if (!a.weights.empty()) overrides.push_back("model.init_from=" + nlohmann::json(a.weights).dump());
  const World world = detect_world();
  Config c = load_run_config(a.config, world.size, overrides);
  adopt_checkpoint_shape(c, a.checkpoint);
  if (world.rank != 0) return run_other_rank(c, a.checkpoint);
  print_notes(c);
  TrainHooks hooks;
  hooks.resume = a.checkpoint;
  hooks.log = [](const std::string& s) { std::fprintf(stderr, "%s\n", s.c_str()); };
  const TrainResult r = train_until_stopped(c, hooks);
  // (A --checkpoint with no valid checkpoint behind it was refused before anything ran.)
  const std::string of = !a.checkpoint.empty() ? "checkpoint step " + std::to_string(r.resumed_from)
                         : !a.weights.empty()  ? a.weights
                                               : "the initial parameters of train.seed " + std::to_string(c.train.seed);
  if (a.json) {
    nlohmann::json j = {{"val_loss", r.val_loss},
                        {"of", of},
                        {"eval_batches", c.train.eval_batches},
                        {"micro_batch", c.micro_batch_size},
                        {"seq_len", c.model.seq_len},
                        {"params_digest", r.params_digest},
                        {"interrupted", r.interrupted}};
    print_json(j);
  } else {
    std::printf("eval: val_loss=%.6f over %d batches of %lld x %d tokens (%s) params_digest=%s\n", r.val_loss,
                c.train.eval_batches, static_cast<long long>(c.micro_batch_size), c.model.seq_len, of.c_str(),
                r.params_digest.c_str());
  }
  return r.interrupted ? stopped_exit_code(r.stop_signal) : 0;
}

}  // namespace

Command add_eval(CLI::App& app) {
  auto [sub, args] = add_subcommand<EvalArgs>(app, "eval", kEvalAbout);
  add_config_options(*sub, args->config);
  sub->add_option(
         "--checkpoint", args->checkpoint,
         "A checkpoint directory, or `latest`: the newest valid one under train.checkpoint_dir (corrupt newer ones are "
         "passed over with a note; with none, or one of another model, nothing is evaluated: exit code 2)")
      ->type_name("DIR|latest");
  sub->add_option("--weights", args->weights, "A GPT-2 safetensors file or a Hugging Face folder (as model.init_from)")
      ->type_name("PATH");
  sub->add_flag("--json", args->json, "Print a JSON summary on stdout");
  return command(sub, args, run_eval);
}

Command add_train(CLI::App& app) {
  auto [sub, args] = add_subcommand<TrainArgs>(app, "train", kTrainAbout);
  add_config_options(*sub, args->config);
  sub->add_flag("--json", args->json, "Print a JSON summary on stdout (progress goes to stderr)");
  sub->add_option(
         "--resume", args->resume,
         "Resume from a checkpoint directory, or `latest`: the newest valid one under train.checkpoint_dir "
         "(corrupt newer ones are passed over with a note and moved aside as step-N.corrupt; with none, training "
         "starts fresh; one of another model shape or family is refused). Without --resume, a train.checkpoint_dir "
         "that holds checkpoints is refused unless train.overwrite_checkpoints is true")
      ->type_name("DIR|latest")
      ->expected(0, 1)
      ->default_str("latest");
  return command(sub, args, run_train);
}

}  // namespace zinf::cli
