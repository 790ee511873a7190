// checkers.h — the independent checkers (scripts/install-checkers.sh: Hugging Face tokenizers,
// tensorboard, safetensors, numpy in .venv-check/) for tests that compare zinf against them.
//
//   const std::string py = zinf::test::checker_python("tokenizers");
//   if (py.empty()) GTEST_SKIP() << zinf::test::checker_missing("tokenizers");
//   const auto r = zinf::test::run_python(py, script_path, {args...});
#pragma once

#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

namespace zinf::test {

#ifndef ZINF_CHECK_PYTHON
#define ZINF_CHECK_PYTHON ""
#endif

inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

struct PythonRun {
  int status = -1;     // the exit status (-1: it did not run)
  std::string output;  // stdout and stderr together
};

// Runs `python -c code args...` (or a script file when `code` names one: pass it as the first arg
// with code empty), capturing stdout and stderr.
inline PythonRun run_python(const std::string& python, const std::string& code, const std::vector<std::string>& args) {
  std::string cmd = shell_quote(python);
  if (!code.empty()) cmd += " -c " + shell_quote(code);
  for (const auto& a : args) cmd += " " + shell_quote(a);
  cmd += " 2>&1";
  PythonRun r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf{};
  std::size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

// The checkers' python when it exists and imports `module`; "" otherwise.
inline std::string checker_python(const std::string& module) {
  const char* env = std::getenv("ZINF_CHECK_PYTHON");
  const std::string py = env && *env ? env : ZINF_CHECK_PYTHON;
  if (py.empty() || access(py.c_str(), X_OK) != 0) return "";
  return run_python(py, "import " + module, {}).status == 0 ? py : "";
}

// The skip reason when checker_python(module) is "".
inline std::string checker_missing(const std::string& module) {
  return "the independent checker '" + module + "' is not installed (scripts/install-checkers.sh puts it in " +
         std::string(ZINF_CHECK_PYTHON) + "; ZINF_CHECK_PYTHON names another python)";
}

}  // namespace zinf::test
