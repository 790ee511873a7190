// commands.h — the `zinf` subcommands. Each registers its options on a CLI11 subcommand and
// returns the function that runs it; only main() turns results and exceptions into exit codes.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json_fwd.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace zinf {
struct Config;
struct ChatFormat;
struct PromptOptions;
}  // namespace zinf

namespace zinf::cli {

struct Command {
  CLI::App* sub = nullptr;
  std::function<int()> run;
};

Command add_info(CLI::App& app);
Command add_plan(CLI::App& app);
Command add_train(CLI::App& app);
Command add_eval(CLI::App& app);
Command add_tokenize(CLI::App& app);
Command add_export(CLI::App& app);
Command add_generate(CLI::App& app);
std::vector<Command> add_bench(CLI::App& app);  // `bench adam|nvme|step|pcie|comm`, one Command each

// ---- shared by the subcommands (commands.cpp) ----

// A subcommand and the arguments its options write into; the arguments are shared with the function
// that runs it, which reads them after parsing.
template <class Args>
struct Subcommand {
  CLI::App* sub;
  std::shared_ptr<Args> args;
};

template <class Args>
Subcommand<Args> add_subcommand(CLI::App& parent, const std::string& name, const std::string& description) {
  return {parent.add_subcommand(name, description), std::make_shared<Args>()};
}

// The Command that runs `run` on `sub`'s parsed arguments.
template <class Args>
Command command(CLI::App* sub, std::shared_ptr<Args> args, int (*run)(const Args&)) {
  return {sub, [args, run] { return run(*args); }};
}

// --config (required) and --set: the run config and its overrides.
struct ConfigArgs {
  std::string path;
  std::vector<std::string> overrides;
};
void add_config_options(CLI::App& sub, ConfigArgs& args);

// The config of `args` with `extra` overrides after the user's, for a job of `world_size` ranks, with
// device.type resolved (app/config/device_choice.h).
Config load_run_config(const ConfigArgs& args, int world_size, const std::vector<std::string>& extra = {});

// Overrides that turn off what only a training run writes for its watcher (tensorboard, csv_monitor,
// the monitor section, flops_profiler): `zinf eval` and `zinf bench step` add them.
const std::vector<std::string>& no_monitor_overrides();

// The "note:" lines a config produced, on stderr.
void print_notes(const Config& config);

// `j` on stdout, indented, as the commands' --json output.
void print_json(const nlohmann::json& j);

// How `generate` and `tokenize --prompt` encode a prompt: --system's turn, --no-bos, --no-special and
// the chat format of --chat (null: a plain prompt; it must outlive the options).
PromptOptions prompt_options(const std::string& system, bool no_bos, bool no_special, const ChatFormat* chat);

}  // namespace zinf::cli
