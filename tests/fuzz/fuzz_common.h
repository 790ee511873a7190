// fuzz_common.h — what every libFuzzer target here shares: the rule for which outcomes are expected,
// and scratch files in memory for the parsers that read from a path.
//
// The rule: a parser given bad bytes must throw zinf::Error (ConfigError, IoError, …), which main()
// turns into one line naming the file and an exit code. Anything else is a finding and aborts the
// run so libFuzzer saves the input: a crash or sanitizer report, and also any other exception — a
// nlohmann::json exception leaking out puts the library's text ("[json.exception.type_error.302]
// type must be number…") in front of the user instead of zinf's, skips the code that catches
// zinf::Error (falling back to an older checkpoint, for one), and so is a bug in the parser.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>
#include <string_view>
#include <typeinfo>

#include "zinf/error.h"

namespace zinf::fuzz {

// Runs f; a zinf::Error is the expected answer to bad input, anything else aborts with its type and text.
template <class F>
bool expect_clean(const char* what, F&& f) {
  try {
    f();
    return true;
  } catch (const Error&) {
    return false;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "\nFINDING: %s let a %s escape instead of zinf::Error: %s\n", what, typeid(e).name(),
                 e.what());
    std::abort();
  } catch (...) {
    std::fprintf(stderr, "\nFINDING: %s threw something that is not a std::exception\n", what);
    std::abort();
  }
}

// An invariant of a parser's result that does not hold: a finding.
[[noreturn]] inline void violated(const std::string& what) {
  std::fprintf(stderr, "\nFINDING: %s\n", what.c_str());
  std::abort();
}

// Writes `n` bytes to `path` (created or truncated); aborts on failure (the scratch space is ours).
inline void write_file(const std::string& path, const void* data, std::size_t n) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) violated("cannot create scratch file " + path);
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w <= 0) violated("cannot write scratch file " + path);
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  ::close(fd);
}

// A directory for the whole run, in memory where the machine has /dev/shm (tmpfs), removed at exit.
// For parsers that take a folder (config.json, the index, a checkpoint's manifest.json). A run that
// found something ends in abort(), past atexit; the next run removes what such runs left behind.
inline const std::string& scratch_dir() {
  static std::string dir;
  if (dir.empty()) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const bool shm = fs::is_directory("/dev/shm", ec) && ::access("/dev/shm", W_OK) == 0;
    const fs::path base = shm ? fs::path("/dev/shm") : fs::temp_directory_path();
    for (const auto& e : fs::directory_iterator(base, ec)) {  // zinf-fuzz-<pid>-XXXXXX of processes gone
      const std::string n = e.path().filename().string();
      int pid = 0;
      if (std::sscanf(n.c_str(), "zinf-fuzz-%d-", &pid) == 1 && pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH)
        fs::remove_all(e.path(), ec);
    }
    std::string tmpl = (base / ("zinf-fuzz-" + std::to_string(::getpid()) + "-XXXXXX")).string();
    if (!::mkdtemp(tmpl.data())) violated("cannot create a scratch directory " + tmpl);
    dir = tmpl;
    std::atexit([] {
      std::error_code e;
      std::filesystem::remove_all(dir, e);
    });
  }
  return dir;
}

// One in-memory file (memfd) reused for every input, reachable by path as /proc/self/fd/N: for the
// parsers that open a single file by name, without touching a disk.
class MemFile {
 public:
  MemFile() {
    fd_ = ::memfd_create("zinf-fuzz", MFD_CLOEXEC);
    if (fd_ < 0) violated("memfd_create failed");
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  const std::string& set(const void* data, std::size_t n) {
    if (::ftruncate(fd_, 0) != 0 || (n > 0 && ::pwrite(fd_, data, n, 0) != static_cast<ssize_t>(n)))
      violated("cannot fill the memfd");
    return path_;
  }

 private:
  int fd_ = -1;
  std::string path_;
};

}  // namespace zinf::fuzz
