// shell.h — running a command line as a user would, for the command-line tests: its exit code,
// stdout and stderr.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace zinf::test {

struct Result {
  int rc = -1;
  std::string out, err;
};

// The repository's tiny GPT config, which the command-line tests shrink further with --set.
inline const std::string kTinyConfig = std::string(ZINF_SOURCE_DIR) + "/configs/tiny.json";

// How often `what` occurs in `s`.
inline std::size_t count(const std::string& s, const std::string& what) {
  std::size_t n = 0;
  for (auto p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

// The lines of `s` (its newlines).
inline std::size_t lines(const std::string& s) {
  return static_cast<std::size_t>(std::count(s.begin(), s.end(), '\n'));
}

// The error lines on stderr (notes about the config aside).
inline int count_errors(const std::string& err) {
  int n = 0;
  std::istringstream in(err);
  for (std::string l; std::getline(in, l);) n += l.rfind("note: ", 0) != 0;
  return n;
}

// Whether any line of `log` holds `what`.
inline bool said(const std::vector<std::string>& log, const std::string& what) {
  for (const auto& l : log)
    if (l.find(what) != std::string::npos) return true;
  return false;
}

inline std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Every entry under `dir` (none when it does not exist) with its size and a hash of its bytes
// (directories as "<dir>"): equal snapshots mean nothing was written, renamed or deleted, and a failed
// comparison prints a line per file, not the files.
inline std::map<std::string, std::string> snapshot(const std::filesystem::path& dir) {
  std::map<std::string, std::string> m;
  if (!std::filesystem::exists(dir)) return m;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    std::string v = "<dir>";
    if (e.is_regular_file()) {
      const std::string bytes = slurp(e.path().string());
      v = std::to_string(bytes.size()) + " bytes, hash " + std::to_string(std::hash<std::string>{}(bytes));
    }
    m[std::filesystem::relative(e.path(), dir).string()] = v;
  }
  return m;
}

// Runs `cmd` with /bin/sh; rc is its exit status (−1 when it did not exit normally).
inline Result sh(const std::string& cmd) {
  const std::string base = std::filesystem::temp_directory_path() / ("zinf-sh-" + std::to_string(::getpid()));
  const int status = std::system((cmd + " >" + base + ".out 2>" + base + ".err").c_str());
  Result r;
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(base + ".out");
  r.err = slurp(base + ".err");
  std::filesystem::remove(base + ".out");
  std::filesystem::remove(base + ".err");
  return r;
}

}  // namespace zinf::test
