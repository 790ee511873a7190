// main.cpp — the `zinf` command line. Exit codes: 0 ok, 1 runtime failure, 2 usage or config
// error, 128 + N a run stopped by signal N after a step (signals.h); every error is one line on
// stderr. Under mpirun each failing rank prints its line naming the rank and ends the whole job (the
// other ranks may be waiting for it in a collective); a stopped job ends as a finished one does.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "commands.h"
#include "signals.h"
#include "zinf/backends/world.h"
#include "zinf/comm.h"
#include "zinf/error.h"
#include "zinf/nvme/store.h"
#include "zinf/backends/sysinfo.h"

namespace {

// "rank R: " when this process is one of several ranks.
std::string rank_prefix() {
  try {
    const zinf::World w = zinf::detect_world();
    return w.size > 1 ? "rank " + std::to_string(w.rank) + ": " : "";
  } catch (const std::exception&) {
    return "";
  }
}

int fail(int code) {
  zinf::mark_world_failing();
  std::fflush(stdout);
  std::fflush(stderr);
  zinf::nvme::remove_live_swap_dirs();  // gone with the run already, unless it never unwound
  zinf::end_world_job(code);            // several ranks: the others may be waiting for this one
  return code;
}

// A message as one line: control characters that came from a path or a file (a newline in a folder
// name) are written as escapes, so that the error stays one line whatever it quotes.
std::string one_line(const std::string& s) {
  std::string r;
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\n')
      r += "\\n";
    else if (c == '\r')
      r += "\\r";
    else if (c == '\t')
      r += "\\t";
    else if (u < 0x20 || u == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", u);
      r += hex;
    } else {
      r += c;
    }
  }
  return r;
}

void report(const char* kind, const zinf::Error& e) {
  zinf::mark_world_failing();  // before the line: a rank failing with it stays quiet about this one
  const std::string who = rank_prefix(), what = one_line(e.what()), hint = one_line(e.hint());
  if (hint.empty())
    std::fprintf(stderr, "zinf: %s%s%s\n", who.c_str(), kind, what.c_str());
  else
    std::fprintf(stderr, "zinf: %s%s%s ---> HINT: %s\n", who.c_str(), kind, what.c_str(), hint.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  zinf::note_startup_resident();  // the program as loaded, for the plan's host-memory prediction
  zinf::cli::install_signal_handlers();
  CLI::App app{"zinf — a ZeRO-Offload / ZeRO-Infinity training engine for models larger than their GPU", "zinf"};
  app.set_version_flag("--version", std::string("zinf ") + ZINF_VERSION);
  app.require_subcommand(1);
  app.fallthrough(false);
  namespace cli = zinf::cli;
  std::vector<cli::Command> commands = {cli::add_info(app),    cli::add_plan(app),     cli::add_train(app),
                                        cli::add_eval(app),    cli::add_tokenize(app), cli::add_export(app),
                                        cli::add_generate(app)};
  for (auto& bench : cli::add_bench(app)) commands.push_back(std::move(bench));
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "zinf: usage error: %s (see zinf --help)\n", one_line(e.what()).c_str());
    return 2;
  }
  try {
    for (const auto& command : commands)
      if (command.sub->parsed()) {
        const int rc = command.run();
        if (rc != 0 && rc < 128) return fail(rc);
        zinf::leave_world();  // several ranks: wait for the others, then close the launch's lines cleanly
        return rc;            // 0, or 128 + N: stopped by signal N after a step, as every rank was
      }
    return 2;
  } catch (const zinf::ConfigError& e) {
    report("", e);
    return fail(2);
  } catch (const zinf::Error& e) {
    report("error: ", e);
    return fail(1);
  } catch (const std::exception& e) {
    zinf::mark_world_failing();
    std::fprintf(stderr, "zinf: %serror: %s\n", rank_prefix().c_str(), one_line(e.what()).c_str());
    return fail(1);
  }
}
