// child_run.h — runs one test of the running test binary again in a child process, with extra
// environment, and returns what it printed (stdout and stderr together). For the sanitizer tests,
// whose case ends the process that hits it: the parent reads the report.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <string>
#include <utility>

namespace zinf::testing_support {

// `env`: assignments for the shell, e.g. "ZINF_X=1 ASAN_OPTIONS='detect_leaks=0'"; `filter`: the
// gtest filter naming the case to run. Returns the child's exit status (128 when a signal ended it,
// -1 when it could not start) and what it printed.
inline std::pair<int, std::string> run_child(const std::string& env, const std::string& filter) {
  const std::string cmd = env + " /proc/" + std::to_string(getpid()) + "/exe --gtest_filter='" + filter + "' 2>&1";
  std::string out;
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return {-1, "popen failed for: " + cmd};
  std::array<char, 4096> buf{};
  while (std::size_t n = std::fread(buf.data(), 1, buf.size(), f)) out.append(buf.data(), n);
  const int st = pclose(f);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : 128, out};
}

// What the child printed (run_child without the status).
inline std::string run_in_child(const std::string& env, const std::string& filter) {
  return run_child(env, filter).second;
}

}  // namespace zinf::testing_support
