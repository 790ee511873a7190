// child.h — a command started by a test as a child process, for the tests that signal a run: its
// stdout is read as it comes, through a pipe of one page, so that the child cannot run far ahead of
// what the test has read (it blocks writing); its stderr goes to a file.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "shell.h"

namespace zinf::test {

class Child {
 public:
  // Starts argv[0] (a path) with argv, and `env` ("NAME=value") added to this process's environment.
  Child(const std::vector<std::string>& argv, const std::vector<std::string>& env = {}) {
    static int serial = 0;
    err_path_ = std::filesystem::temp_directory_path() /
                ("zinf-child-" + std::to_string(::getpid()) + "-" + std::to_string(serial++) + ".err");
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return;
    ::fcntl(fds[1], F_SETPIPE_SZ, 4096);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setpgid(0, 0);  // its own group: a test that fails can end it and everything it started
      for (int sig = 1; sig < NSIG; ++sig) ::signal(sig, SIG_DFL);  // not what the test runner ignores
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      const rlimit no_core{0, 0};
      ::setrlimit(RLIMIT_CORE, &no_core);  // SIGQUIT dumps core by default
      ::dup2(fds[1], STDOUT_FILENO);
      const int e = ::open(err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      ::dup2(e, STDERR_FILENO);
      for (const auto& kv : env) ::putenv(const_cast<char*>(kv.c_str()));
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    out_ = fds[0];
  }
  ~Child() {
    if (pid_ > 0 && !reaped_) {  // a test that failed half way: end it all
      ::kill(-pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (out_ >= 0) ::close(out_);
    std::filesystem::remove(err_path_);
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& out() const { return text_; }
  std::string err() const { return slurp(err_path_); }

  // Reads stdout until `what` has appeared; false at its end (or when nothing came for two minutes:
  // a hang, which the caller reports).
  bool read_until(const std::string& what) {
    while (text_.find(what) == std::string::npos)
      if (!read_some()) return false;
    return true;
  }

  // Waits until `what` appears in stderr (which the test does not hold back), polling; false when
  // the child ends first.
  bool wait_err(const std::string& what) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(2);
    while (err().find(what) == std::string::npos) {
      if (std::chrono::steady_clock::now() > deadline || ended()) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return true;
  }

  // Waits until the child's main thread is blocked writing its stdout: it is in write(1, …) with more
  // bytes than the pipe has room for, so the run can make no progress until the test reads on.
  bool wait_blocked_on_stdout() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(2);
    const int capacity = ::fcntl(out_, F_GETPIPE_SZ);
    while (std::chrono::steady_clock::now() < deadline) {
      std::istringstream sc(slurp("/proc/" + std::to_string(pid_) + "/syscall"));
      std::string nr, fd, buf, count;
      sc >> nr >> fd >> buf >> count;
      int unread = 0;
      ::ioctl(out_, FIONREAD, &unread);
      if (nr == "1" && fd == "0x1" && !count.empty() && unread + std::stol(count, nullptr, 16) > capacity) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return false;
  }

  // Whether the child has ended (a zombie until finish() reaps it).
  bool ended() const {
    const std::string stat = slurp("/proc/" + std::to_string(pid_) + "/stat");
    const auto close = stat.rfind(')');
    return close == std::string::npos || stat.compare(close + 2, 1, "Z") == 0;
  }

  // Waits until the child ends by itself, without reading its stdout.
  bool wait_ended() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(2);
    while (!ended()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return true;
  }

  // Closes the read end of the child's stdout, as `zinf train | head` does once head has its lines:
  // the child's next write gets SIGPIPE (EPIPE where it ignores the signal).
  void close_stdout() {
    if (out_ >= 0) ::close(out_);
    out_ = -1;
  }

  // Reads what stdout holds now, without waiting for more.
  void read_available() {
    for (pollfd p{out_, POLLIN, 0}; out_ >= 0 && ::poll(&p, 1, 0) == 1 && (p.revents & POLLIN);) {
      char buf[4096];
      const ssize_t n = ::read(out_, buf, sizeof buf);
      if (n <= 0) return;
      text_.append(buf, static_cast<std::size_t>(n));
    }
  }

  // Reads stdout to its end and reaps the child; returns its wait status.
  int finish() {
    while (read_some()) {
    }
    int status = 0;
    ::waitpid(pid_, &status, 0);
    reaped_ = true;
    return status;
  }

 private:
  bool read_some() {
    if (out_ < 0) return false;
    pollfd p{out_, POLLIN, 0};
    if (::poll(&p, 1, 120'000) <= 0) return false;
    char buf[4096];
    const ssize_t n = ::read(out_, buf, sizeof buf);
    if (n <= 0) return false;
    text_.append(buf, static_cast<std::size_t>(n));
    return true;
  }

  pid_t pid_ = -1;
  int out_ = -1;
  bool reaped_ = false;
  std::string text_;
  std::string err_path_;
};

// The step named by a stopped run's "interrupted: stopping after step K" (−1 when absent).
inline long stopped_after(const std::string& out) {
  const std::string key = "interrupted: stopping after step ";
  const auto p = out.find(key);
  return p == std::string::npos ? -1 : std::stol(out.substr(p + key.size()));
}

// The folder name of the checkpoint of `step` in train.checkpoint_dir.
inline std::string checkpoint_name(long step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08ld", step);
  return name;
}

}  // namespace zinf::test
