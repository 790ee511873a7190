// train.cpp — `zinf train --config C [--set k=v]... [--json]`.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <signal.h>

#include <atomic>
#include <cstdio>

#include "commands.h"
#include "zinf/config.h"
#include "zinf/train.h"

namespace zinf::cli {
namespace {

std::atomic<bool> g_stop{false};
extern "C" void on_sigint(int) {
  if (g_stop.exchange(true)) ::signal(SIGINT, SIG_DFL);  // a second Ctrl-C stops at once
}

struct TrainArgs {
  ConfigArgs config;
  bool json = false;
  std::string resume;
};

void flatten(const nlohmann::json& j, const std::string& prefix, std::vector<std::pair<std::string, std::string>>& out) {
  if (j.is_object() && !j.empty()) {
    for (auto it = j.begin(); it != j.end(); ++it) flatten(it.value(), prefix.empty() ? it.key() : prefix + "." + it.key(), out);
  } else {
    out.emplace_back(prefix, j.dump());
  }
}

int run_train(const TrainArgs& a) {
  Config c = load_config(a.config.path, a.config.overrides);
  FILE* out = a.json ? stderr : stdout;  // with --json, stdout carries only the summary object
  for (const auto& n : c.notes) std::fprintf(stderr, "note: %s\n", n.c_str());
  std::vector<std::pair<std::string, std::string>> rows;
  flatten(nlohmann::json::parse(c.resolved_json), "", rows);
  std::fprintf(out, "zinf train — %s (resolved config)\n", c.source.c_str());
  for (const auto& [k, v] : rows) std::fprintf(out, "  %-58s %s\n", k.c_str(), v.c_str());
  std::fflush(out);

  g_stop = false;
  struct sigaction sa {}, old {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old);
  TrainHooks hooks;
  hooks.stop = &g_stop;
  hooks.resume = a.resume;
  hooks.log = [out](const std::string& s) {
    std::fprintf(out, "%s\n", s.c_str());
    std::fflush(out);
  };
  TrainResult r;
  try {
    r = train(c, hooks);
  } catch (...) {
    sigaction(SIGINT, &old, nullptr);
    throw;
  }
  sigaction(SIGINT, &old, nullptr);
  std::fprintf(out, "final step=%lld loss=%.6f val_loss=%.6f params_digest=%s\n", static_cast<long long>(r.steps), r.loss,
               r.val_loss, r.params_digest.c_str());
  if (a.json) {
    nlohmann::json j = {{"steps", r.steps},        {"skipped", r.skipped},         {"loss", r.loss},
                        {"resumed_from", r.resumed_from}, {"checkpoint_seconds", r.checkpoint_seconds},
                        {"val_loss", r.val_loss},  {"first_val_loss", r.first_val_loss},
                        {"params_digest", r.params_digest}, {"tokens_per_s", r.tokens_per_s},
                        {"peak_device_bytes", r.peak_device_bytes}, {"interrupted", r.interrupted}};
    std::printf("%s\n", j.dump(2).c_str());
  }
  return r.interrupted ? 130 : 0;
}

}  // namespace

Command add_train(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  CLI::App* sub = app.add_subcommand(
      "train",
      "Train the configured GPT model: prints the resolved config, a progress line every steps_per_print steps "
      "(loss, lr, loss scale, grad norm, tokens/s; fwd/bwd/update times with wall_clock_breakdown), validation loss "
      "every train.eval_interval steps, and a final line `final step=N loss=X val_loss=Y params_digest=HEX` (a hash "
      "of every fp32 master parameter: equal digests mean bit-identical runs). Checkpoints go to train.checkpoint_dir "
      "every train.checkpoint_interval steps, at the end, and on Ctrl-C, which stops after the current step");
  add_config_options(*sub, args->config, true);
  sub->add_flag("--json", args->json, "Print a JSON summary on stdout (progress goes to stderr)");
  sub->add_option("--resume", args->resume,
                  "Resume from a checkpoint directory, or `latest`: the newest valid one under train.checkpoint_dir "
                  "(invalid newer ones are passed over with a note; with none, training starts fresh)")
      ->type_name("DIR|latest")
      ->expected(0, 1)
      ->default_str("latest");
  return {sub, [args] { return run_train(*args); }};
}

}  // namespace zinf::cli
