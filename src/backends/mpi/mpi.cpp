// mpi.cpp — the MPI communicator (zinf/comm.h) on host-visible buffers, and make_world_comm.
//
// MPI is initialised once, with MPI_THREAD_MULTIPLE (the engine's workers each run collectives on
// their own communicator), only when the launcher started more than one rank; it is finalised at exit.
// Errors return (MPI_ERRORS_RETURN) and become zinf errors naming the call and the rank.
#include <mpi.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "zinf/backends/world.h"
#include "zinf/comm.h"
#include "zinf/error.h"
#include "zinf/nvme/store.h"

namespace zinf {
namespace {

void check(int rc, const char* what, int rank) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw Error(std::string("MPI ") + what + " failed on rank " + std::to_string(rank) + ": " +
              std::string(msg, static_cast<std::size_t>(len)));
}

MPI_Datatype type_of(std::size_t elem) {
  switch (elem) {
    case 1: return MPI_BYTE;
    case 2: return MPI_UINT16_T;
    case 4: return MPI_UINT32_T;  // moved as bits: no MPI arithmetic is ever applied
    case 8: return MPI_UINT64_T;
  }
  throw Error("comm: element size " + std::to_string(elem) + " is not 1, 2, 4 or 8");
}

// MPI counts and displacements are ints: larger transfers are refused with the reason.
std::vector<int> ints(const std::vector<std::size_t>& v, std::vector<int>* displs) {
  std::vector<int> out(v.size());
  std::size_t off = 0;
  if (displs) displs->resize(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (v[i] > INT_MAX || off > INT_MAX)
      throw Error("comm: a transfer of " + std::to_string(v[i]) + " elements at offset " + std::to_string(off) +
                      " is beyond MPI's int counts",
                  "lower reduce_bucket_size or sub_group_size");
    out[i] = static_cast<int>(v[i]);
    if (displs) (*displs)[i] = static_cast<int>(off);
    off += v[i];
  }
  return out;
}

class MpiComm final : public Comm {
 public:
  explicit MpiComm(MPI_Comm c) : comm_(c) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  }
  ~MpiComm() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm_ != MPI_COMM_WORLD) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }

  void alltoallv(const void* send, const std::vector<std::size_t>& sc, void* recv, const std::vector<std::size_t>& rc,
                 std::size_t elem, void*) override {
    ZINF_CHECK(sc.size() == static_cast<std::size_t>(size_) && rc.size() == sc.size());
    std::vector<int> sd, rd;
    const auto s = ints(sc, &sd), r = ints(rc, &rd);
    check(MPI_Alltoallv(send, s.data(), sd.data(), type_of(elem), recv, r.data(), rd.data(), type_of(elem), comm_),
          "Alltoallv", rank_);
  }
  void allgatherv(void* buf, const std::vector<std::size_t>& counts, std::size_t elem, void*) override {
    ZINF_CHECK(counts.size() == static_cast<std::size_t>(size_));
    std::vector<int> d;
    const auto c = ints(counts, &d);
    check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, c.data(), d.data(), type_of(elem), comm_),
          "Allgatherv", rank_);
  }
  void allgatherv(const void* part, void* buf, const std::vector<std::size_t>& counts, std::size_t elem,
                  void*) override {
    ZINF_CHECK(counts.size() == static_cast<std::size_t>(size_));
    std::vector<int> d;
    const auto c = ints(counts, &d);
    check(MPI_Allgatherv(part, c[static_cast<std::size_t>(rank_)], type_of(elem), buf, c.data(), d.data(),
                         type_of(elem), comm_),
          "Allgatherv", rank_);
  }
  void broadcast(void* buf, std::size_t bytes, int root, void*) override {
    auto* p = static_cast<char*>(buf);
    for (std::size_t o = 0; o < bytes; o += INT_MAX / 2) {
      const std::size_t len = std::min<std::size_t>(INT_MAX / 2, bytes - o);
      check(MPI_Bcast(p + o, static_cast<int>(len), MPI_BYTE, root, comm_), "Bcast", rank_);
    }
  }
  void barrier() override { check(MPI_Barrier(comm_), "Barrier", rank_); }
  std::unique_ptr<Comm> dup() override {
    MPI_Comm d;
    check(MPI_Comm_dup(comm_, &d), "Comm_dup", rank_);
    return std::make_unique<MpiComm>(d);
  }
  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }

 private:
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
};

MPI_Comm g_job = MPI_COMM_NULL;       // the job's communicator: MPI_COMM_WORLD, or the ranks joined by rendezvous
std::atomic<pid_t> g_name_server{0};  // rank 0 of an environment launch: the ompi-server it started
std::string g_rendezvous_dir;         // an environment launch: where this process keeps the server's address
// The same folder and its one file as plain characters, for remove_world_files() in a signal handler.
constexpr std::size_t kPathMax = 512;
char g_rdv_dir_c[kPathMax], g_rdv_file_c[kPathMax];
bool g_mpi_connected = false;        // an environment launch has begun to connect through MPI
std::atomic<bool> g_failing{false};  // mark_world_failing(): this rank reports its own error
bool g_watching = false;             // the lifelines' watcher runs
// An environment launch has no mpirun to end the job when a rank dies, so the rendezvous connections
// stay open as lifelines (rank 0 ⇄ every other rank). Until the ranks have all finished (a barrier in
// leave_world), a line that closes means its rank died, and the watcher ends this rank too — each in
// turn, so no rank waits forever in a collective. After that barrier every rank says "BYE", shuts its
// side and reads the other side to its end before closing: a socket closed with unread data would
// reset the connection, and the peer could not tell that from a death. A rank that fails says "FAIL"
// instead (end_world_job): it has printed its own error, so a peer that is failing too stays quiet, and
// one that is not says which rank failed and ends.
std::mutex g_lines_mu;
std::condition_variable g_lines_cv;
struct Lifeline {
  int fd, rank;
  bool bye = false;     // it said goodbye: it has passed the final barrier, so this rank has finished too
  bool failed = false;  // it said it failed, and printed why
};
std::vector<Lifeline> g_lifelines;
bool g_leaving = false;  // every rank has finished: closing lines are goodbyes
bool g_left = false;     // leave_world ran
int g_my_rank = 0;

void send_all(int fd, const std::string& s) {
  for (std::size_t o = 0; o < s.size();) {
    const ssize_t n = ::send(fd, s.data() + o, s.size() - o, MSG_NOSIGNAL);  // a closed peer is an error, not SIGPIPE
    if (n <= 0) return;
    o += static_cast<std::size_t>(n);
  }
}

// Ends this rank because another one left: its scratch first (the main thread may be blocked in a
// collective and never unwind), then the process.
[[noreturn]] void end_this_rank() {
  std::fflush(stderr);
  for (const auto& l : g_lifelines) ::close(l.fd);  // the next rank in line sees this one leave
  nvme::remove_live_swap_dirs();
  remove_world_files();
  ::_exit(1);
}

void watch_lifelines() {
  g_watching = true;
  std::thread([] {
    while (true) {
      std::vector<pollfd> fds;
      {
        std::lock_guard<std::mutex> lk(g_lines_mu);
        if (g_lifelines.empty()) return;
        for (const auto& l : g_lifelines) fds.push_back({l.fd, POLLIN, 0});
      }
      if (::poll(fds.data(), fds.size(), -1) <= 0) continue;
      for (std::size_t i = 0; i < fds.size(); ++i) {
        if (!fds[i].revents) continue;
        char buf[64];
        const ssize_t n = ::recv(fds[i].fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        std::unique_lock<std::mutex> lk(g_lines_mu);
        auto& v = g_lifelines;
        const auto it = std::find_if(v.begin(), v.end(), [&](const Lifeline& l) { return l.fd == fds[i].fd; });
        if (it == v.end()) continue;
        if (n > 0) {  // a rank writes nothing but its goodbye ("BYE") or that it failed ("FAIL")
          (std::memchr(buf, 'F', static_cast<std::size_t>(n)) ? it->failed : it->bye) = true;
          continue;  // read on to the end of the line
        }
        const bool bye = (it->bye && !it->failed) || g_leaving;
        const bool failed = it->failed;
        const int who = it->rank;
        v.erase(it);
        ::close(fds[i].fd);
        g_lines_cv.notify_all();
        if (bye || g_failing.load()) continue;  // finished; or this rank is failing and reports that itself
        if (failed) {
          // It failed with its own error line. When this rank fails too (the same bad input often
          // fails every rank), its own line is the one to print: give it a moment to get there.
          g_lines_cv.wait_for(lk, std::chrono::seconds(5), [] { return g_failing.load(); });
          if (g_failing.load()) continue;  // the main thread reports and ends this rank
          std::fprintf(stderr, "zinf: rank %d: rank %d failed (its own error says why); ending this rank\n", g_my_rank,
                       who);
        } else {
          std::fprintf(
              stderr,
              "zinf: rank %d: rank %d left the job without finishing (it died or was killed); ending this rank\n",
              g_my_rank, who);
        }
        end_this_rank();
      }
    }
  }).detach();
}

// Rank 0 of an environment launch: ends the ompi-server it started.
void stop_name_server() {
  const pid_t pid = g_name_server.exchange(0);
  if (pid <= 0) return;
  ::kill(pid, SIGTERM);
  ::waitpid(pid, nullptr, 0);
}

void finalize_at_exit() {
  leave_world();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
  stop_name_server();
  remove_world_files();
}

void init_mpi() {
  int provided = 0;
  if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
    throw Error("MPI_Init_thread failed");
  if (provided < MPI_THREAD_MULTIPLE)
    throw Error("this MPI library does not provide MPI_THREAD_MULTIPLE, which zinf's workers need",
                "use Debian's Open MPI (openmpi-bin, libopenmpi-dev)");
  std::atexit(finalize_at_exit);
}

// ---- the rendezvous of an environment launch (RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT) ----

using Clock = std::chrono::steady_clock;

[[noreturn]] void rdv_fail(const World& w, const std::string& what) {
  throw ConfigError(
      "rendezvous at " + w.master_addr + ":" + std::to_string(w.master_port) + " (rank " + std::to_string(w.rank) +
          " of " + std::to_string(w.size) + "): " + what,
      "start every rank with the same WORLD_SIZE, MASTER_ADDR and MASTER_PORT (rank 0's host and a free port), or "
      "launch with mpirun");
}

int poll_ms(Clock::time_point deadline) {
  return static_cast<int>(
      std::max<long long>(0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count()));
}

std::string read_line(int fd, Clock::time_point deadline, const World& w) {
  std::string line;
  char c;
  while (true) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, poll_ms(deadline)) <= 0) rdv_fail(w, "timed out waiting for the other side");
    const ssize_t n = ::read(fd, &c, 1);
    if (n <= 0) rdv_fail(w, "the connection closed early");
    if (c == '\n') return line;
    line += c;
  }
}

// Open MPI's name server, which lets separately started MPI processes connect; returns the file
// holding its address.
// This process's private folder for the server's address (removed at exit).
std::string rendezvous_file() {
  const auto dir = std::filesystem::temp_directory_path() / ("zinf-rendezvous-" + std::to_string(::getpid()));
  const std::string file = (dir / "ompi-server.uri").string();
  if (file.size() >= kPathMax)
    throw ConfigError("the temporary folder's path is too long: " + dir.string(), "set TMPDIR to a shorter path");
  std::filesystem::create_directories(dir);
  g_rendezvous_dir = dir.string();
  std::memcpy(g_rdv_file_c, file.c_str(), file.size() + 1);
  std::memcpy(g_rdv_dir_c, g_rendezvous_dir.c_str(), g_rendezvous_dir.size() + 1);
  return file;
}

std::string start_name_server(const World& w, Clock::time_point deadline) {
  const std::string uri = rendezvous_file();
  const pid_t pid = ::fork();
  if (pid < 0) rdv_fail(w, std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);  // it ends with this process
    if (!std::freopen("/dev/null", "w", stdout) || !std::freopen("/dev/null", "w", stderr)) ::_exit(126);
    ::execlp("ompi-server", "ompi-server", "--no-daemonize", "-r", uri.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  g_name_server = pid;
  while (Clock::now() < deadline) {
    std::ifstream f(uri);
    std::string line;
    if (std::getline(f, line) && !line.empty()) return uri;
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      g_name_server = 0;
      rdv_fail(w, "ompi-server (from openmpi-bin) could not start");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  rdv_fail(w, "ompi-server did not report its address");
}

int tcp_socket(const World& w, bool listen_side, Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = listen_side ? AI_PASSIVE : 0;
  const std::string port = std::to_string(w.master_port);
  while (true) {
    addrinfo* res = nullptr;
    const int rc = ::getaddrinfo(listen_side ? nullptr : w.master_addr.c_str(), port.c_str(), &hints, &res);
    if (rc != 0) rdv_fail(w, std::string("MASTER_ADDR: ") + ::gai_strerror(rc));
    std::string why;
    for (addrinfo* a = res; a; a = a->ai_next) {
      const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      if (listen_side) {
        const int one = 1;
        ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 256) == 0) {
          ::freeaddrinfo(res);
          return fd;
        }
      } else if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
        ::freeaddrinfo(res);
        return fd;
      }
      why = std::strerror(errno);
      ::close(fd);
    }
    ::freeaddrinfo(res);
    if (listen_side) rdv_fail(w, "cannot listen on port " + port + ": " + why);
    if (Clock::now() >= deadline) rdv_fail(w, "rank 0 could not be reached: " + why);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // rank 0 may not be listening yet
  }
}

// Rank 0's side of the meeting: every other rank calls in once on the TCP port with its RANK and
// WORLD_SIZE and is answered with where to meet (the name server's address and the MPI port);
// its connection stays open as the lifeline that tells each side when the other has gone.
void admit_ranks(const World& w, Clock::time_point deadline, const std::string& reply) {
  const int lfd = tcp_socket(w, true, deadline);
  std::vector<bool> seen(static_cast<std::size_t>(w.size), false);
  seen[0] = true;
  for (int k = 1; k < w.size; ++k) {
    pollfd p{lfd, POLLIN, 0};
    if (::poll(&p, 1, poll_ms(deadline)) <= 0) {
      std::string missing;
      for (std::size_t r = 1; r < seen.size(); ++r)
        if (!seen[r]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      ::close(lfd);
      rdv_fail(w, "rank(s) " + missing + " did not arrive");
    }
    const int fd = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      --k;
      continue;
    }
    std::istringstream in(read_line(fd, deadline, w));
    int r = -1, n = -1;
    in >> r >> n;
    std::string err;
    if (n != w.size)
      err = "a rank says WORLD_SIZE=" + std::to_string(n) + ", rank 0 has " + std::to_string(w.size);
    else if (r < 1 || r >= w.size || seen[static_cast<std::size_t>(r)])
      err = "RANK=" + std::to_string(r) + " arrived twice or is out of range";
    send_all(fd, err.empty() ? reply : "ERR " + err + "\n");
    if (!err.empty()) {
      ::close(fd);
      ::close(lfd);
      rdv_fail(w, err);
    }
    seen[static_cast<std::size_t>(r)] = true;
    std::lock_guard<std::mutex> lk(g_lines_mu);
    g_lifelines.push_back({fd, r});
  }
  ::close(lfd);
}

// Rank 0: starts the name server and MPI, opens the port the others connect to, admits them.
// Returns a group of rank 0 alone; the others join it in rendezvous().
MPI_Comm host_meeting(const World& w, Clock::time_point deadline, std::string& port_name) {
  const std::string uri = start_name_server(w, deadline);
  ::setenv("OMPI_MCA_pmix_server_uri", ("file:" + uri).c_str(), 1);
  init_mpi();
  char port[MPI_MAX_PORT_NAME];
  check(MPI_Open_port(MPI_INFO_NULL, port), "Open_port", 0);
  port_name = port;
  std::string uri_text;
  std::getline(std::ifstream(uri), uri_text);
  admit_ranks(w, deadline, "OK\n" + uri_text + "\n" + port_name + "\n");
  watch_lifelines();  // from here on a rank that goes away ends the others, even while they connect
  g_mpi_connected = true;
  MPI_Comm group = MPI_COMM_NULL;
  check(MPI_Comm_dup(MPI_COMM_SELF, &group), "Comm_dup", 0);
  return group;
}

// Every other rank: calls rank 0, learns where to meet, starts MPI against rank 0's name server and
// connects to the port. Returns the group of the ranks that have met so far.
MPI_Comm join_meeting(const World& w, Clock::time_point deadline, std::string& port_name) {
  const int fd = tcp_socket(w, false, deadline);
  send_all(fd, std::to_string(w.rank) + " " + std::to_string(w.size) + "\n");
  const std::string status = read_line(fd, deadline, w);
  if (status.rfind("ERR ", 0) == 0) {
    ::close(fd);
    rdv_fail(w, status.substr(4));
  }
  const std::string uri_text = read_line(fd, deadline, w);
  port_name = read_line(fd, deadline, w);
  {
    std::lock_guard<std::mutex> lk(g_lines_mu);
    g_lifelines.push_back({fd, 0});
  }
  watch_lifelines();
  const std::string uri = rendezvous_file();
  std::ofstream(uri) << uri_text << "\n";
  ::setenv("OMPI_MCA_pmix_server_uri", ("file:" + uri).c_str(), 1);
  init_mpi();
  g_mpi_connected = true;
  MPI_Comm inter, group;
  check(MPI_Comm_connect(port_name.c_str(), MPI_INFO_NULL, 0, MPI_COMM_SELF, &inter), "Comm_connect", w.rank);
  check(MPI_Intercomm_merge(inter, 1, &group), "Intercomm_merge", w.rank);
  MPI_Comm_free(&inter);
  return group;
}

// Every rank: the job's communicator, ordered by RANK.
MPI_Comm rendezvous(const World& w) {
  const char* t = std::getenv("ZINF_RENDEZVOUS_TIMEOUT");
  const auto deadline = Clock::now() + std::chrono::seconds(t && std::atoi(t) > 0 ? std::atoi(t) : 120);
  std::string port_name;
  g_my_rank = w.rank;
  MPI_Comm group = w.rank == 0 ? host_meeting(w, deadline, port_name) : join_meeting(w, deadline, port_name);
  // The group grows by one rank at a time, in arrival order; everyone already in takes part.
  for (int size = 0; MPI_Comm_size(group, &size), size < w.size;) {
    MPI_Comm inter, bigger;
    check(MPI_Comm_accept(port_name.c_str(), MPI_INFO_NULL, 0, group, &inter), "Comm_accept", w.rank);
    check(MPI_Intercomm_merge(inter, 0, &bigger), "Intercomm_merge", w.rank);
    MPI_Comm_free(&inter);
    MPI_Comm_free(&group);
    group = bigger;
  }
  if (w.rank == 0) MPI_Close_port(port_name.c_str());
  MPI_Comm job;
  check(MPI_Comm_split(group, 0, w.rank, &job), "Comm_split", w.rank);  // ranks ordered by RANK
  MPI_Comm_free(&group);
  return job;
}

}  // namespace

void mark_world_failing() {
  std::lock_guard<std::mutex> lk(g_lines_mu);
  g_failing = true;
  g_lines_cv.notify_all();
}

void end_world_job(int code) {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (!g_rendezvous_dir.empty()) {
    // An environment launch: MPI_Abort would print Open MPI's banner under this rank's error line
    // and skip the exit's cleanup. The rendezvous lines tell the others instead.
    {
      std::unique_lock<std::mutex> lk(g_lines_mu);
      g_failing = true;
      g_left = true;  // no goodbye barrier at exit
      for (const auto& l : g_lifelines) {
        send_all(l.fd, "FAIL\n");
        ::shutdown(l.fd, SHUT_WR);
      }
      // The watcher reads each line to its end before it is closed (a peer that fails too says
      // "FAIL" as well: left unread, the connection would be reset, and the peer might lose this
      // rank's message); a peer that is not failing ends itself within seconds of reading ours.
      if (g_watching) g_lines_cv.wait_for(lk, std::chrono::seconds(10), [] { return g_lifelines.empty(); });
    }
    stop_name_server();
    remove_world_files();
    std::fflush(nullptr);
    // Before any MPI connection MPI ends cleanly; after one, MPI_Finalize would wait for the ranks
    // this one is connected to, so the process ends here (its run has unwound: nothing else to do).
    if (!g_mpi_connected) {
      if (init && !fin) MPI_Finalize();
      return;
    }
    nvme::remove_live_swap_dirs();
    ::_exit(code);
  }
  stop_name_server();  // first: MPI_Abort does not return
  if (init && !fin) MPI_Abort(g_job != MPI_COMM_NULL ? g_job : MPI_COMM_WORLD, code);
}

void remove_world_files() {
  const pid_t server = g_name_server.load();
  if (server > 0) ::kill(server, SIGTERM);
  if (g_rdv_file_c[0]) ::unlink(g_rdv_file_c);
  if (g_rdv_dir_c[0]) ::rmdir(g_rdv_dir_c);
}

void leave_world() {
  {
    std::lock_guard<std::mutex> lk(g_lines_mu);
    if (g_left) return;
    g_left = true;
  }
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (!init || fin || g_job == MPI_COMM_NULL) return;
  // Every rank has finished once all are here: from now on a rank that goes away is saying goodbye.
  // (A rank that dies during the barrier is still caught by the watcher.)
  if (MPI_Barrier(g_job) != MPI_SUCCESS) return;
  std::unique_lock<std::mutex> lk(g_lines_mu);
  g_leaving = true;
  for (const auto& l : g_lifelines) {
    send_all(l.fd, "BYE\n");
    ::shutdown(l.fd, SHUT_WR);
  }
  // The watcher reads each line to its end and closes it; a peer that never closes is left after 30 s.
  g_lines_cv.wait_for(lk, std::chrono::seconds(30), [] { return g_lifelines.empty(); });
}

std::unique_ptr<Comm> make_world_comm(const World& w) {
  if (w.size <= 1) return make_solo_comm();
  static std::once_flag once;
  std::call_once(once, [&] {
    if (w.launcher == "env") {
      g_job = rendezvous(w);
    } else {
      init_mpi();
      g_job = MPI_COMM_WORLD;
    }
  });
  MPI_Comm mine;
  check(MPI_Comm_dup(g_job, &mine), "Comm_dup", w.rank);
  auto c = std::make_unique<MpiComm>(mine);
  if (c->size() != w.size || c->rank() != w.rank)
    throw Error("MPI reports rank " + std::to_string(c->rank()) + " of " + std::to_string(c->size()) +
                ", the launcher said " + std::to_string(w.rank) + " of " + std::to_string(w.size));
  return c;
}

}  // namespace zinf
