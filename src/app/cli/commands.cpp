// commands.cpp — what the subcommands share: the config options and their notes, --json.
#include "commands.h"

#include <nlohmann/json.hpp>

#include <cstdio>

#include "app/config/config.h"
#include "app/config/device_choice.h"
#include "io/instruct.h"

namespace zinf::cli {

void add_config_options(CLI::App& sub, ConfigArgs& args) {
  sub.add_option("-c,--config", args.path, "Run config: a DeepSpeed ds_config.json with zinf's sections")
      ->type_name("FILE")
      ->required();
  sub.add_option("--set", args.overrides, "Override a config key in dotted form, e.g. --set zero_optimization.stage=3")
      ->type_name("KEY=VALUE");
}

Config load_run_config(const ConfigArgs& args, int world_size, const std::vector<std::string>& extra) {
  std::vector<std::string> overrides = args.overrides;
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  Config c = zinf::load_config(args.path, overrides, world_size);
  resolve_device(c);  // device.type auto decided once, the same way for every command
  return c;
}

const std::vector<std::string>& no_monitor_overrides() {
  static const std::vector<std::string> o = {"tensorboard.enabled=false", "csv_monitor.enabled=false",
                                             "monitor.tensorboard_dir=\"\"", "monitor.csv_dir=\"\"",
                                             "flops_profiler.enabled=false"};
  return o;
}

void print_notes(const Config& config) {
  for (const auto& n : config.notes) std::fprintf(stderr, "note: %s\n", n.c_str());
}

void print_json(const nlohmann::json& j) { std::printf("%s\n", j.dump(2).c_str()); }

PromptOptions prompt_options(const std::string& system, bool no_bos, bool no_special, const ChatFormat* chat) {
  PromptOptions po;
  po.chat = chat;
  po.system = system;
  po.bos = !no_bos;
  po.special = !no_special;
  return po;
}

}  // namespace zinf::cli
