// zinf/error.h — how zinf fails.
//
// Two kinds of failure, kept apart on purpose (docs/design.md, "Errors"):
//  * a broken invariant is a bug: ZINF_CHECK aborts with file, line and the failed expression;
//  * a bad environment (config, file, disk, io_uring, CUDA) is the user's problem to fix: it is an
//    exception carrying what failed, where and why, plus an optional hint. Only main() turns it into
//    one line on stderr and an exit code.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <utility>

namespace zinf {

// A failure the user can act on. `what()` is the full one-line message; `hint()` may be empty.
class Error : public std::runtime_error {
 public:
  explicit Error(std::string message, std::string hint = {})
      : std::runtime_error(std::move(message)), hint_(std::move(hint)) {}
  const std::string& hint() const noexcept { return hint_; }

 private:
  std::string hint_;
};

// Bad config or command line: exit code 2.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// An I/O failure: the message names file, offset, length and errno text; `err` keeps the errno.
class IoError : public Error {
 public:
  IoError(std::string message, int err, std::string hint = {})
      : Error(std::move(message), std::move(hint)), errno_(err) {}
  int error_number() const noexcept { return errno_; }

 private:
  int errno_;
};

namespace detail {
[[noreturn]] inline void check_failed(const char* file, int line, const char* expr) {
  std::fprintf(stderr, "zinf: internal check failed: %s at %s:%d\n", expr, file, line);
  std::fflush(stderr);
  std::abort();
}
}  // namespace detail

// A library's exception text without its leading "[tag] " (nlohmann's "[json.exception.type_error.302] "):
// the part a user's one error line needs.
inline std::string library_message(const std::exception& e) {
  const std::string m = e.what();
  const auto p = m.find("] ");
  return p == std::string::npos ? m : m.substr(p + 2);
}

}  // namespace zinf

// Always on, also in release builds: invariants are cheap next to what they protect.
#define ZINF_CHECK(cond)                                                  \
  do {                                                                    \
    if (!(cond)) ::zinf::detail::check_failed(__FILE__, __LINE__, #cond); \
  } while (0)
