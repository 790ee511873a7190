// signals.cpp — see signals.h. The handler uses async-signal-safe calls only: its messages are made
// when the handlers are installed, and the scratch removal walks fixed tables (nvme, comm).
#include "signals.h"

#include <poll.h>
#include <semaphore.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "zinf/backends/world.h"
#include "zinf/comm.h"
#include "zinf/nvme/store.h"

namespace zinf::cli {
namespace {

struct Handled {
  int sig;
  const char* name;
  bool stops;  // stops after the current step (the first time, while a run can)
};
constexpr Handled kHandled[] = {{SIGINT, "SIGINT", true},
                                {SIGTERM, "SIGTERM", true},
                                {SIGUSR1, "SIGUSR1", true},
                                {SIGHUP, "SIGHUP", false},
                                {SIGQUIT, "SIGQUIT", false},
                                {SIGPIPE, "SIGPIPE", false}};

std::atomic<bool> g_stop{false}, g_stoppable{false}, g_finished{false};
std::atomic<int> g_first{0};  // the signal that asked for the stop
bool g_report = true;         // this process prints (rank 0 alone, as for everything else)
bool g_mpirun = false;        // started by Open MPI's mpirun (its ranks are SIGKILLed after a SIGTERM)
sem_t g_mpirun_term;          // posted by the handler on mpirun's SIGTERM; the deadline thread waits on it

struct Message {
  char text[200];
  std::size_t len = 0;
};
Message g_stopping[std::size(kHandled)], g_now[std::size(kHandled)], g_pipe_other;

void set(Message& m, const std::string& s) {
  m.len = std::min(s.size(), sizeof m.text);
  std::memcpy(m.text, s.data(), m.len);
}

void say(const Message& m) {
  if (!g_report) return;
  [[maybe_unused]] const auto n = ::write(STDERR_FILENO, m.text, m.len);
}

// Ends the process by `sig` now, its scratch removed first.
void end_now(int sig) {
  nvme::remove_live_swap_dirs();
  remove_world_files();
  ::signal(sig, SIG_DFL);
  ::raise(sig);  // from a handler: delivered when it returns
}

extern "C" void on_signal(int sig, siginfo_t* info, void*) {
  const int saved_errno = errno;  // the interrupted code may be about to read it
  std::size_t k = 0;
  while (kHandled[k].sig != sig) ++k;
  if (sig == SIGPIPE) {  // nobody reads the output any more (`zinf train | head`): an error, exit 1
    pollfd out{STDOUT_FILENO, 0, 0};  // a pipe whose reader is gone polls POLLERR on its write end
    say(::poll(&out, 1, 0) == 1 && (out.revents & POLLERR) ? g_now[k] : g_pipe_other);
    nvme::remove_live_swap_dirs();
    remove_world_files();
    ::_exit(1);
  }
  int none = 0;
  if (kHandled[k].stops && g_stoppable.load() && g_first.compare_exchange_strong(none, sig)) {
    g_stop = true;
    if (!g_finished.load()) say(g_stopping[k]);
    if (sig == SIGTERM && g_mpirun && info && info->si_pid == ::getppid()) ::sem_post(&g_mpirun_term);
    errno = saved_errno;
    return;
  }
  if (!g_finished.load()) say(g_now[k]);  // after the run (e.g. mpirun ending the ranks) there is nothing to tell
  end_now(sig);
  errno = saved_errno;
}

// mpirun (Open MPI 4) ends a job on SIGINT, SIGTERM or SIGHUP by sending its ranks SIGCONT, then
// SIGTERM after odls_base_sigkill_timeout seconds and SIGKILL after as many again; mpirun passes the
// parameter to its ranks' environment when it is set there or on its command line.
double sigkill_timeout() {
  const char* v = std::getenv("OMPI_MCA_odls_base_sigkill_timeout");
  const int t = v ? std::atoi(v) : 0;
  return t > 0 ? t : 1;
}

// A SIGKILL leaves the swap directories behind (they are removed only at the next start on the same
// path, see clean_stale_swap_dirs), so a rank that is still stopping shortly before it ends itself.
void watch_mpirun_deadline() {
  std::thread([] {
    while (::sem_wait(&g_mpirun_term) != 0) {
    }
    const double t = sigkill_timeout();
    std::this_thread::sleep_for(std::chrono::duration<double>(t - std::min(t / 4, 5.0)));
    if (g_finished.load()) {  // stopped in time: only MPI's end is left, which waits for mpirun's SIGKILL
      nvme::remove_live_swap_dirs();
      remove_world_files();
      std::fflush(nullptr);
      ::_exit(stopped_exit_code());
    }
    Message m;
    char secs[32];
    std::snprintf(secs, sizeof secs, "%g", t);
    set(m, std::string("zinf: mpirun kills the ranks ") + secs +
               " s after its SIGTERM: stopping now, without a checkpoint ---> HINT: give mpirun --mca "
               "odls_base_sigkill_timeout 120 for the time to write one, or send mpirun SIGUSR1\n");
    say(m);
    end_now(SIGTERM);
  }).detach();
}

// A rank whose launcher is gone (mpirun or its daemon SIGKILLed) is reparented; MPI notices the lost
// connection only seconds later and aborts the rank without its cleanup. So a rank started by
// mpirun watches its parent and, once that changes, removes its scratch and exits 1 with one line.
void watch_launcher() {
  const pid_t parent = ::getppid();
  std::thread([parent] {
    Message m;
    set(m, "\nzinf: the launcher (mpirun, process " + std::to_string(parent) +
               ") is gone: stopping at once, without a checkpoint\n");
    while (::getppid() == parent) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    say(m);
    nvme::remove_live_swap_dirs();
    remove_world_files();
    std::fflush(nullptr);
    ::_exit(1);
  }).detach();
}

}  // namespace

void install_signal_handlers() {
  try {
    const World w = detect_world();
    g_report = w.rank == 0;
    g_mpirun = w.launcher == "mpirun" && std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr;
  } catch (...) {  // a bad launch environment is reported by the command that needs it
  }
  if (g_mpirun && ::sem_init(&g_mpirun_term, 0, 0) == 0) watch_mpirun_deadline();
  if (g_mpirun) watch_launcher();
  struct sigaction sa {};
  sa.sa_sigaction = on_signal;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  for (const auto& h : kHandled) sigaddset(&sa.sa_mask, h.sig);  // one at a time in a thread
  set(g_pipe_other, "\nzinf: SIGPIPE: a pipe or socket this process wrote to has no reader: stopping at once\n");
  for (std::size_t k = 0; k < std::size(kHandled); ++k) {
    const Handled& h = kHandled[k];
    set(g_stopping[k], std::string("\nzinf: ") + h.name +
                           ": stopping after the current step or evaluation batch (a second signal stops at once)\n");
    set(g_now[k], h.sig == SIGPIPE ? std::string("\nzinf: standard output was closed (SIGPIPE): stopping at once\n")
                                   : std::string("\nzinf: ") + h.name + ": stopping at once\n");
    struct sigaction cur {};
    if (sigaction(h.sig, nullptr, &cur) == 0 && !(cur.sa_flags & SA_SIGINFO) && cur.sa_handler == SIG_IGN) continue;
    sigaction(h.sig, &sa, nullptr);
  }
}

const std::atomic<bool>& stop_requested() { return g_stop; }

std::atomic<bool>& run_stoppable() { return g_stoppable; }

void note_run_finished() { g_finished = true; }

const std::atomic<int>& stop_signal() { return g_first; }

int stopped_exit_code(int sig) {
  if (sig <= 0) sig = g_first.load();
  return 128 + (sig > 0 ? sig : SIGINT);
}

}  // namespace zinf::cli
