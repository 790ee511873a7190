// commands.h — the `zinf` subcommands. Each registers its options on a CLI11 subcommand and
// returns the function that runs it; only main() turns results and exceptions into exit codes.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace CLI {
class App;
}

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
Command add_bench(CLI::App& app);  // registers `bench adam` (returned) and `bench nvme`
Command bench_nvme_command();      // valid after add_bench
Command bench_step_command();
Command bench_pcie_command();
Command bench_comm_command();

// Shared: --config / --set handling and the "note:" lines a config produced.
struct ConfigArgs {
  std::string path;
  std::vector<std::string> overrides;
};
void add_config_options(CLI::App& sub, ConfigArgs& args, bool required);

}  // namespace zinf::cli
