// swapdir.cpp — the private swap directory and its cleanup on every exit path (zinf/nvme/store.h).
//
// The signal handler may only use async-signal-safe calls, so live directories and their files are
// kept in a fixed table of plain char arrays that the handler walks with unlink/rmdir.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>

#include "zinf/error.h"
#include "zinf/nvme/store.h"

namespace zinf::nvme {
namespace {

constexpr int kSlots = 16, kFiles = 32, kPath = 512;
struct Slot {
  std::atomic<bool> used{false};
  char dir[kPath];
  char files[kFiles][kPath];
  std::atomic<int> nfiles{0};
};
Slot g_slots[kSlots];
std::mutex g_slots_mu;
const char kMarker[] = ".zinf-swap";
const char kMagic[] = "zinf swap directory";

void remove_slot(Slot& s) {  // async-signal-safe
  const int n = s.nfiles.load();
  for (int i = 0; i < n; ++i) ::unlink(s.files[i]);
  ::rmdir(s.dir);
}

// The signals whose default action ends the process and that a user or a scheduler sends to end a
// run: with no handler of the program's, the directories go first.
constexpr int kEndingSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};

void on_signal(int sig) {
  for (auto& s : g_slots)
    if (s.used.load()) remove_slot(s);
  ::signal(sig, SIG_DFL);
  ::raise(sig);  // delivered when this handler returns: the process ends as the signal says
}

bool copy_path(char* dst, const std::string& src) {
  if (src.size() + 1 > static_cast<std::size_t>(kPath)) return false;
  std::memcpy(dst, src.c_str(), src.size() + 1);
  return true;
}

std::string boot_id() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string s;
  std::getline(f, s);
  return s;
}

}  // namespace

void remove_live_swap_dirs() {
  for (auto& s : g_slots)
    if (s.used.load()) remove_slot(s);
}

void install_swap_cleanup_handlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    // A signal the program handles itself (e.g. `zinf train`'s graceful stop, which removes the
    // directories on the paths that end at once) or ignores (nohup) is left as it is.
    for (const int sig : kEndingSignals) {
      struct sigaction cur {};
      if (sigaction(sig, nullptr, &cur) != 0 || (cur.sa_flags & SA_SIGINFO) || cur.sa_handler != SIG_DFL) continue;
      struct sigaction sa {};
      sa.sa_handler = on_signal;
      sigemptyset(&sa.sa_mask);
      sigaction(sig, &sa, nullptr);
    }
  });
}

SwapDir::SwapDir(const std::string& parent, bool create_parent) {
  struct stat st {};
  if (create_parent && ::stat(parent.c_str(), &st) != 0 && errno == ENOENT) {
    std::error_code ec;
    std::filesystem::create_directories(parent, ec);
    if (ec)
      throw IoError("swap path " + parent + ": cannot create it: " + ec.message(), ec.value(),
                    "set nvme_path to a directory on the NVMe drive that you can write to");
    created_parent_ = true;
  }
  if (::stat(parent.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    const int e = S_ISDIR(st.st_mode) || errno ? errno : ENOTDIR;
    throw IoError("swap path " + parent + ": " + std::strerror(e ? e : ENOTDIR), e ? e : ENOTDIR,
                  "set nvme_path to a directory on the NVMe drive");
  }
  std::random_device rd;
  char name[64];
  std::snprintf(name, sizeof name, "zinf-%d-%08x", static_cast<int>(::getpid()), rd());
  path_ = parent + (parent.back() == '/' ? "" : "/") + name;
  if (::mkdir(path_.c_str(), 0700) != 0) {
    const int e = errno;
    throw IoError("swap path " + path_ + ": mkdir: " + std::strerror(e), e);
  }
  {
    std::lock_guard<std::mutex> lk(g_slots_mu);
    for (int i = 0; i < kSlots; ++i) {
      if (!g_slots[i].used.load() && copy_path(g_slots[i].dir, path_)) {
        g_slots[i].nfiles = 0;
        g_slots[i].used = true;
        slot_ = i;
        break;
      }
    }
  }
  const std::string marker = file(kMarker);
  std::ofstream m(marker);
  m << kMagic << "\npid " << ::getpid() << "\nboot " << boot_id() << "\n";
  if (!m) {
    const int e = errno ? errno : EIO;
    remove();
    throw IoError("swap path " + marker + ": cannot write the marker: " + std::strerror(e), e);
  }
  ::chmod(marker.c_str(), 0600);
}

std::string SwapDir::file(const std::string& name) {
  std::string p = path_ + "/" + name;
  if (slot_ >= 0) {
    std::lock_guard<std::mutex> lk(g_slots_mu);
    Slot& s = g_slots[slot_];
    const int n = s.nfiles.load();
    if (n < kFiles && copy_path(s.files[n], p)) s.nfiles = n + 1;
  }
  return p;
}

SwapDir::~SwapDir() { remove(); }

void SwapDir::remove() {
  if (path_.empty()) return;
  if (slot_ >= 0) {
    std::lock_guard<std::mutex> lk(g_slots_mu);
    remove_slot(g_slots[slot_]);
    g_slots[slot_].used = false;
    slot_ = -1;
  }
  ::rmdir(path_.c_str());
  path_.clear();
}

namespace {

// The leftover directories under `parent` that clean_stale_swap_dirs removes: removed (dry_run
// false), or only their files' allocated bytes summed into *bytes (dry_run true).
std::vector<std::string> scan_stale_swap_dirs(const std::string& parent, bool dry_run, std::uint64_t* bytes) {
  // Provably zinf's and stale: the name is zinf-<pid>-<tag>, every entry is zinf's (the marker or
  // store.N), the owner process is gone, and either the marker names that owner or — a run killed
  // between mkdir and the marker — there is no data in it at all.
  std::vector<std::string> report;
  DIR* d = ::opendir(parent.c_str());
  if (!d) return report;
  const std::string my_boot = boot_id();
  while (dirent* e = ::readdir(d)) {
    int pid = 0;
    unsigned tag = 0;
    if (std::sscanf(e->d_name, "zinf-%d-%8x", &pid, &tag) != 2) continue;
    if (pid == ::getpid()) continue;  // this run's own (e.g. the optimizer's store beside the parameters')
    const std::string dir = parent + "/" + e->d_name;
    // Never through a symbolic link: the folder is opened without following one, and everything in
    // it is read and removed relative to that descriptor.
    struct stat dst {};
    if (::lstat(dir.c_str(), &dst) != 0 || !S_ISDIR(dst.st_mode)) {
      if (S_ISLNK(dst.st_mode)) report.push_back(dir + ": kept (a symbolic link, not followed)");
      continue;
    }
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0) continue;
    std::string marker_text;
    const int mfd = ::openat(dfd, kMarker, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    struct stat mst {};
    if (mfd >= 0 && ::fstat(mfd, &mst) == 0 && S_ISREG(mst.st_mode)) {
      char buf[512];
      const ssize_t n = ::read(mfd, buf, sizeof buf);
      if (n > 0) marker_text.assign(buf, static_cast<std::size_t>(n));
    }
    if (mfd >= 0) ::close(mfd);
    std::istringstream m(marker_text);
    std::string magic, key, boot;
    int mpid = 0;
    std::getline(m, magic);
    m >> key >> mpid >> key >> boot;
    const bool marked = magic == kMagic && mpid == pid;
    std::vector<std::string> files;
    bool foreign = false, data = false;
    std::uint64_t allocated = 0;  // the files' blocks on the disk
    if (DIR* sub = ::fdopendir(::fcntl(dfd, F_DUPFD_CLOEXEC, 0))) {
      while (dirent* f = ::readdir(sub)) {
        const std::string n = f->d_name;
        if (n == "." || n == "..") continue;
        struct stat fst {};
        const bool regular = ::fstatat(dfd, n.c_str(), &fst, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(fst.st_mode);
        if (regular && (n == kMarker || n.rfind("store.", 0) == 0)) {
          files.push_back(n);
          allocated += static_cast<std::uint64_t>(fst.st_blocks) * 512u;
          data = data || n != kMarker;
        } else {
          foreign = true;
        }
      }
      ::closedir(sub);
    }
    if (foreign) {
      ::close(dfd);
      report.push_back(dir + ": kept (holds files zinf did not write)");
      continue;
    }
    const bool same_boot = !marked || boot == my_boot;
    if (same_boot && (::kill(pid, 0) == 0 || errno == EPERM)) {
      ::close(dfd);
      report.push_back(dir + ": kept (process " + std::to_string(pid) + " is running)");
      continue;
    }
    if (!marked && data) {
      ::close(dfd);
      report.push_back(dir + ": kept (no zinf marker)");
      continue;
    }
    if (dry_run) {
      ::close(dfd);
      if (bytes) *bytes += allocated;
      report.push_back(dir + ": would be removed (left by process " + std::to_string(pid) + ", which is gone)");
      continue;
    }
    for (const auto& f : files) ::unlinkat(dfd, f.c_str(), 0);
    ::close(dfd);
    if (::rmdir(dir.c_str()) == 0)
      report.push_back(dir + ": removed (left by process " + std::to_string(pid) + ", which is gone)");
    else
      report.push_back(dir + ": could not be removed: " + std::strerror(errno));
  }
  ::closedir(d);
  return report;
}

}  // namespace

std::vector<std::string> clean_stale_swap_dirs(const std::string& parent) {
  return scan_stale_swap_dirs(parent, false, nullptr);
}

std::uint64_t stale_swap_bytes(const std::string& parent) {
  std::uint64_t bytes = 0;
  scan_stale_swap_dirs(parent, true, &bytes);
  return bytes;
}

}  // namespace zinf::nvme
