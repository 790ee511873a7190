// store_test.cpp — the tensor store end to end on the machine's real disk (a temporary directory):
// integrity over many sizes and offsets with both back ends, concurrency, fault injection (ENOSPC,
// EIO, short transfers), the pinned bound of the swapper, and scratch cleanup after an exception and
// after SIGTERM.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "zinf/error.h"
#include "zinf/nvme/probe.h"
#include "zinf/nvme/store.h"
#include "zinf/nvme/swapper.h"
#include "zinf/pinned.h"

namespace zinf::nvme {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            ("zinf-store-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++));
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string str() const { return path_.string(); }
  std::size_t entries() const {
    return static_cast<std::size_t>(std::distance(fs::directory_iterator(path_), fs::directory_iterator()));
  }

 private:
  fs::path path_;
  static inline int counter_ = 0;
};

int open_fds() {
  return static_cast<int>(std::distance(fs::directory_iterator("/proc/self/fd"), fs::directory_iterator()));
}

void fill_random(void* p, std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  auto* b = static_cast<unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<unsigned char>(rng());
}

std::vector<AsyncIoKind> back_ends() {
  std::vector<AsyncIoKind> e = {AsyncIoKind::posix};
  std::string why;
  if (io_uring_available(&why)) e.push_back(AsyncIoKind::uring);
  return e;
}
const char* name(AsyncIoKind k) { return k == AsyncIoKind::uring ? "uring" : "posix"; }

StoreOptions options(const std::string& dir, AsyncIoKind k, std::size_t block = 64 << 10, int qd = 8, int threads = 2) {
  StoreOptions o;
  o.parent = dir;
  o.io_kind = k;
  o.io.block_size = block;
  o.io.queue_depth = qd;
  o.io.threads = threads;
  o.files = 2;
  return o;
}

TEST(TensorStore, IntegrityOverSizesAndOffsetsOnEveryBackEnd) {
  const std::uint64_t sizes[] = {1, 100, 4095, 4096, 4097, 65539, (1 << 20) + 17, 3 << 20};
  std::vector<std::uint64_t> checks;
  for (AsyncIoKind k : back_ends()) {
    SCOPED_TRACE(name(k));
    TempDir dir;
    PinnedPool pool(32 << 20);
    TensorStore store(options(dir.str(), k));
    EXPECT_NE(store.description().find(k == AsyncIoKind::uring ? "io_uring" : "posix"), std::string::npos);
    std::vector<TensorStore::Id> ids;
    std::vector<PinnedBuffer> src, dst;
    for (std::size_t i = 0; i < std::size(sizes); ++i) {
      ids.push_back(store.add("t" + std::to_string(i), sizes[i]));
      src.push_back(pool.acquire(store.padded(sizes[i])));
      dst.push_back(pool.acquire(store.padded(sizes[i])));
      fill_random(src.back().data(), sizes[i], static_cast<std::uint32_t>(i + 1));
    }
    std::vector<IoHandle> hs;
    for (std::size_t i = 0; i < ids.size(); ++i) hs.push_back(store.write(ids[i], src[i].data()));
    for (auto& h : hs) h->wait();
    hs.clear();
    for (std::size_t i = 0; i < ids.size(); ++i) hs.push_back(store.read(ids[i], dst[i].data()));
    for (auto& h : hs) h->wait();
    std::uint64_t sum = 0;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      ASSERT_EQ(std::memcmp(src[i].data(), dst[i].data(), sizes[i]), 0)
          << "tensor " << i << " of " << sizes[i] << " bytes";
      for (std::size_t j = 0; j < sizes[i]; ++j)
        sum = sum * 1099511628211ull + static_cast<unsigned char*>(dst[i].data())[j];
    }
    checks.push_back(sum);
    // Sub-ranges at aligned offsets of the largest tensor.
    const std::size_t last = ids.size() - 1;
    for (std::uint64_t off : {std::uint64_t{0}, std::uint64_t{4096}, std::uint64_t{1} << 20}) {
      PinnedBuffer part = pool.acquire(store.padded(100000));
      store.read(ids[last], part.data(), off, 100000)->wait();
      ASSERT_EQ(std::memcmp(part.data(), static_cast<char*>(src[last].data()) + off, 100000), 0) << off;
    }
  }
  if (checks.size() == 2) {
    EXPECT_EQ(checks[0], checks[1]);  // both back ends give the same bytes
  }
}

TEST(TensorStore, ConcurrentReadersAndWriters) {
  for (AsyncIoKind k : back_ends()) {
    SCOPED_TRACE(name(k));
    TempDir dir;
    PinnedPool pool(64 << 20);
    TensorStore store(options(dir.str(), k, 128 << 10, 16, 2));
    constexpr int kThreads = 4;
    std::vector<TensorStore::Id> ids;
    for (int t = 0; t < kThreads; ++t) ids.push_back(store.add("t" + std::to_string(t), (2 << 20) + 4096 * t + 5));
    std::atomic<int> bad{0};
    std::vector<std::thread> th;
    for (int t = 0; t < kThreads; ++t) {
      th.emplace_back([&, t] {
        const std::uint64_t n = store.size(ids[t]);
        PinnedBuffer a = pool.acquire(store.padded(n), true), b = pool.acquire(store.padded(n), true);
        for (int round = 0; round < 5; ++round) {
          fill_random(a.data(), n, static_cast<std::uint32_t>(t * 100 + round));
          store.write(ids[t], a.data())->wait();
          store.read(ids[t], b.data())->wait();
          if (std::memcmp(a.data(), b.data(), n) != 0) ++bad;
        }
      });
    }
    for (auto& x : th) x.join();
    EXPECT_EQ(bad.load(), 0);
  }
}

TEST(TensorStore, SqpollRingsWithRegisteredFilesAndBuffersMoveTheSameBytes) {
  std::string why;
  if (!io_uring_available(&why)) GTEST_SKIP() << "io_uring unavailable: " << why;
  TempDir dir;
  PinnedPool pool(8 << 20);
  StoreOptions o = options(dir.str(), AsyncIoKind::uring);
  o.io.sqpoll = true;
  o.io.fixed_buffers = {pool.slab()};
  std::unique_ptr<TensorStore> store;
  try {
    store = std::make_unique<TensorStore>(o);
  } catch (const IoError& e) {
    GTEST_SKIP() << "SQPOLL rings cannot be set up here: " << e.what();
  }
  const std::uint64_t n = (2 << 20) + 123;
  auto id = store->add("t", n);
  PinnedBuffer a = pool.acquire(store->padded(n)), b = pool.acquire(store->padded(n));
  fill_random(a.data(), n, 77);
  store->write(id, a.data())->wait();
  store->read(id, b.data())->wait();
  EXPECT_EQ(std::memcmp(a.data(), b.data(), n), 0);
}

TEST(TensorStore, ShortTransfersAreResubmitted) {
  for (AsyncIoKind k : back_ends()) {
    SCOPED_TRACE(name(k));
    TempDir dir;
    PinnedPool pool(8 << 20);
    FaultPlan faults;
    faults.short_every = 3;
    TensorStore store(options(dir.str(), k, 64 << 10), &faults);
    const std::uint64_t n = (1 << 20) + 333;
    auto id = store.add("t", n);
    PinnedBuffer a = pool.acquire(store.padded(n)), b = pool.acquire(store.padded(n));
    fill_random(a.data(), n, 9);
    store.write(id, a.data())->wait();
    store.read(id, b.data())->wait();
    EXPECT_EQ(std::memcmp(a.data(), b.data(), n), 0);
    const std::int64_t requests = 2 * static_cast<std::int64_t>(store.padded(n) / (64 << 10) + 1);
    EXPECT_GT(faults.seen.load(), requests);  // remainders were resubmitted
  }
}

TEST(TensorStore, InjectedErrorsSurfaceWithContextAndNothingPartialSucceeds) {
  for (AsyncIoKind k : back_ends()) {
    for (int err : {ENOSPC, EIO}) {
      SCOPED_TRACE(std::string(name(k)) + " " + std::strerror(err));
      TempDir dir;
      const int fds_before = open_fds();
      {
        PinnedPool pool(8 << 20);
        FaultPlan faults;
        faults.fail_errno = err;
        TensorStore store(options(dir.str(), k, 64 << 10), &faults);
        const std::uint64_t n = 1 << 20;
        auto id = store.add("t", n);
        PinnedBuffer a = pool.acquire(n);
        fill_random(a.data(), n, 1);
        faults.fail_at = faults.seen.load() + 5;  // the 5th of 16 requests
        try {
          (err == ENOSPC ? store.write(id, a.data()) : store.read(id, a.data()))->wait();
          FAIL() << "the transfer should have failed";
        } catch (const IoError& e) {
          EXPECT_EQ(e.error_number(), err);
          const std::string m = e.what();
          EXPECT_NE(m.find(dir.str()), std::string::npos) << m;
          EXPECT_NE(m.find("offset "), std::string::npos) << m;
          EXPECT_NE(m.find("length "), std::string::npos) << m;
          EXPECT_NE(m.find(std::strerror(err)), std::string::npos) << m;
        }
        // The store is still usable afterwards.
        store.write(id, a.data())->wait();
      }
      EXPECT_EQ(open_fds(), fds_before);  // no leaked files, rings or eventfds
      EXPECT_EQ(dir.entries(), 0u);       // the swap directory is gone
    }
  }
}

TEST(TensorStore, FullDiskWhenReservingIsAClearError) {
  TempDir dir;
  TensorStore store(options(dir.str(), AsyncIoKind::posix));
  try {
    store.add("huge", std::uint64_t{1} << 60);
    FAIL() << "reserving 2^60 bytes should fail";
  } catch (const IoError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("cannot reserve"), std::string::npos) << m;
    EXPECT_NE(m.find("tensor huge"), std::string::npos) << m;
  }
}

TEST(TensorStore, MissingSwapPathIsAClearError) {
  try {
    TensorStore store(options("/nonexistent/zinf-swap", AsyncIoKind::posix));
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/zinf-swap"), std::string::npos);
  }
}

TEST(TensorStore, CreatesAMissingSwapPathWhenAsked) {
  TempDir dir;
  const std::string parent = dir.str() + "/a/b";
  StoreOptions o = options(parent, AsyncIoKind::posix);
  o.create_parent = true;
  {
    TensorStore store(o);
    EXPECT_TRUE(fs::is_directory(parent));
    EXPECT_NE(store.description().find("(created " + parent + ", which did not exist)"), std::string::npos)
        << store.description();
  }
  EXPECT_TRUE(fs::is_empty(parent));  // its own directory is gone; the created path stays, as DeepSpeed's does
}

TEST(TensorStore, FilesystemWithoutODirectFallsBackToBuffered) {
  if (!fs::exists("/dev/shm")) GTEST_SKIP() << "no /dev/shm (tmpfs) to test a filesystem that refuses O_DIRECT";
  PathProbe p = probe_path("/dev/shm");
  if (p.odirect) GTEST_SKIP() << "/dev/shm accepts O_DIRECT here; nothing to fall back from";
  TensorStore store(options("/dev/shm", AsyncIoKind::automatic));
  EXPECT_NE(store.description().find("refuses O_DIRECT"), std::string::npos) << store.description();
  PinnedPool pool(1 << 20);
  auto id = store.add("t", 5000);
  PinnedBuffer a = pool.acquire(8192), b = pool.acquire(8192);
  fill_random(a.data(), 5000, 3);
  store.write(id, a.data())->wait();
  store.read(id, b.data())->wait();
  EXPECT_EQ(std::memcmp(a.data(), b.data(), 5000), 0);
}

TEST(TensorStore, SwapDirectoryIsPrivateAndRemovedAfterAnException) {
  TempDir dir;
  std::string inside;
  try {
    TensorStore store(options(dir.str(), AsyncIoKind::automatic));
    inside = store.directory();
    EXPECT_EQ(fs::status(inside).permissions() & fs::perms::all, fs::perms::owner_all);
    EXPECT_EQ(fs::status(inside + "/store.0").permissions() & fs::perms::all,
              fs::perms::owner_read | fs::perms::owner_write);
    throw std::runtime_error("training failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_FALSE(fs::exists(inside));
  EXPECT_EQ(dir.entries(), 0u);
}

TEST(TensorStore, SwapDirectoryIsRemovedOnSigterm) {
  TempDir dir;
  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {  // child: make a store, report its directory, then get killed
    ::close(pipefd[0]);
    TensorStore store(options(dir.str(), AsyncIoKind::posix));
    store.add("t", 1 << 20);
    const std::string& d = store.directory();
    [[maybe_unused]] auto w = ::write(pipefd[1], d.c_str(), d.size());
    ::close(pipefd[1]);
    ::raise(SIGTERM);
    ::_exit(0);  // not reached
  }
  ::close(pipefd[1]);
  char buf[512] = {};
  [[maybe_unused]] auto r = ::read(pipefd[0], buf, sizeof buf - 1);
  ::close(pipefd[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status)) << "child exited normally";
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
  ASSERT_GT(std::strlen(buf), 0u);
  EXPECT_FALSE(fs::exists(buf)) << buf;
  EXPECT_EQ(dir.entries(), 0u);
}

std::atomic<bool> g_graceful{false};

TEST(TensorStore, AProgramsOwnSigintHandlerKeepsTheSignal) {
  TempDir dir;
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {  // like `zinf train`: a graceful-stop handler first, then the store
    struct sigaction sa {};
    sa.sa_handler = [](int) { g_graceful = true; };
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, nullptr);
    {
      TensorStore store(options(dir.str(), AsyncIoKind::posix));
      ::raise(SIGINT);
      if (!g_graceful || !fs::exists(store.directory())) ::_exit(4);  // the run goes on; its directory too
    }
    ::_exit(fs::is_empty(dir.str()) ? 0 : 5);  // and the destructor cleaned up
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of a signal";
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(TensorStore, StaleDirectoriesAreRemovedOnlyWhenProvablyZinfs) {
  TempDir dir;
  pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ::waitpid(dead, nullptr, 0);  // a pid that no longer runs
  std::string boot;
  {
    std::ifstream f("/proc/sys/kernel/random/boot_id");
    std::getline(f, boot);
  }
  auto make = [&](const std::string& n, bool marker, bool foreign) {
    const std::string d = dir.str() + "/" + n;
    fs::create_directories(d);
    if (marker) std::ofstream(d + "/.zinf-swap") << "zinf swap directory\npid " << dead << "\nboot " << boot << "\n";
    std::ofstream(d + "/store.0") << std::string(1 << 20, 'x');  // 1 MiB each
    if (foreign) std::ofstream(d + "/notes.txt") << "mine";
    return d;
  };
  char tag[16];
  std::snprintf(tag, sizeof tag, "%d", static_cast<int>(dead));
  // A live one first: a real store of this process (its start-up sweep finds nothing yet).
  TensorStore live(options(dir.str(), AsyncIoKind::posix));
  EXPECT_TRUE(live.stale_report().empty());
  const std::string ours = make(std::string("zinf-") + tag + "-0000abcd", true, false);
  const std::string foreign = make(std::string("zinf-") + tag + "-0000abce", true, true);
  const std::string unmarked = make(std::string("zinf-") + tag + "-0000abcf", false, false);  // has data: not provable
  const std::string empty = dir.str() + "/zinf-" + tag + "-0000abc0";  // a run killed between mkdir and marker
  fs::create_directories(empty);
  const std::string other = make("not-zinf", true, false);
  // What a sweep would free, counted without removing anything: the 1 MiB of `ours` (and its marker's
  // block), not the 3 MiB of the folders it keeps, nor the live store's.
  const std::uint64_t reclaimable = stale_swap_bytes(dir.str());
  EXPECT_GE(reclaimable, 1u << 20);
  EXPECT_LT(reclaimable, (1u << 20) + (256u << 10));
  EXPECT_TRUE(fs::exists(ours) && fs::exists(empty));
  auto report = clean_stale_swap_dirs(dir.str());
  EXPECT_FALSE(fs::exists(ours));
  EXPECT_TRUE(fs::exists(foreign));
  EXPECT_TRUE(fs::exists(unmarked));
  EXPECT_FALSE(fs::exists(empty));  // empty and its owner is gone
  EXPECT_TRUE(fs::exists(other));
  EXPECT_TRUE(fs::exists(live.directory()));
  EXPECT_EQ(report.size(), 4u);  // this process's own live store is passed over in silence
  for (const auto& l : report) EXPECT_EQ(l.find(live.directory()), std::string::npos) << l;
  // A new store sweeps on its own and reports what it removed.
  const std::string again = make(std::string("zinf-") + tag + "-0000abd0", true, false);
  TensorStore next(options(dir.str(), AsyncIoKind::posix));
  EXPECT_FALSE(fs::exists(again));
  bool said = false;
  for (const auto& l : next.stale_report()) said = said || l.find("removed") != std::string::npos;
  EXPECT_TRUE(said);
}

// A stale-looking name that is a symbolic link is never followed: the folder it points to — marked,
// its owner gone, nothing but zinf's files — keeps every file, and so does the link, with a line.
TEST(TensorStore, AStaleNameThatIsASymbolicLinkIsNotFollowed) {
  TempDir dir, elsewhere;
  pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ::waitpid(dead, nullptr, 0);
  std::string boot;
  {
    std::ifstream f("/proc/sys/kernel/random/boot_id");
    std::getline(f, boot);
  }
  const std::string target = elsewhere.str() + "/precious";
  fs::create_directories(target);
  std::ofstream(target + "/.zinf-swap") << "zinf swap directory\npid " << dead << "\nboot " << boot << "\n";
  std::ofstream(target + "/store.0") << "x";
  const std::string link = dir.str() + "/zinf-" + std::to_string(dead) + "-0000abcd";
  fs::create_directory_symlink(target, link);
  const auto report = clean_stale_swap_dirs(dir.str());
  EXPECT_TRUE(fs::exists(target + "/store.0"));
  EXPECT_TRUE(fs::exists(target + "/.zinf-swap"));
  EXPECT_TRUE(fs::is_symlink(link));
  ASSERT_EQ(report.size(), 1u);
  EXPECT_NE(report[0].find("a symbolic link, not followed"), std::string::npos) << report[0];
}

TEST(Swapper, PinnedBoundHoldsUnderThousandsOfItems) {
  for (AsyncIoKind k : back_ends()) {
    SCOPED_TRACE(name(k));
    TempDir dir;
    const std::size_t item = 16 << 10;
    const int nbuf = 4, nitems = 3000;
    PinnedPool pool(nbuf * item);
    TensorStore store(options(dir.str(), k, 64 << 10, 16, 2));
    auto id = store.add("flat", static_cast<std::uint64_t>(nitems) * item);
    Swapper sw(store, pool, nbuf, item);
    std::vector<SwapItem> items;
    for (int i = 0; i < nitems; ++i) items.push_back({id, static_cast<std::uint64_t>(i) * item, item, false, true});
    // Pass 1: write item i's index into it (nothing to read first).
    std::size_t expect = 0;
    sw.run(items, [&](std::size_t i, void* buf, std::size_t len) {
      ASSERT_EQ(i, expect++);
      std::memset(buf, static_cast<int>(i % 251), len);
    });
    // Pass 2: read back, check, and increment in place (read ahead, write behind).
    for (auto& it : items) it.read = true;
    int bad = 0;
    sw.run(items, [&](std::size_t i, void* buf, std::size_t len) {
      auto* b = static_cast<unsigned char*>(buf);
      if (b[0] != i % 251 || b[len - 1] != i % 251) ++bad;
      std::memset(buf, static_cast<int>((i + 1) % 251), len);
    });
    EXPECT_EQ(bad, 0);
    EXPECT_LE(pool.peak(), pool.capacity());
    EXPECT_EQ(pool.peak(), static_cast<std::size_t>(nbuf) * store.padded(item));
    EXPECT_LE(sw.peak_buffers_in_use(), nbuf);
    EXPECT_GE(sw.peak_buffers_in_use(), 2);  // it did overlap
  }
}

TEST(Swapper, ReadFailureDuringTheUpdateFailsCleanly) {
  TempDir dir;
  const std::size_t item = 64 << 10;
  PinnedPool pool(4 * item);
  FaultPlan faults;
  faults.fail_errno = EIO;
  {
    TensorStore store(options(dir.str(), AsyncIoKind::automatic, 64 << 10), &faults);
    auto id = store.add("flat", 50 * item);
    std::vector<SwapItem> items;
    for (int i = 0; i < 50; ++i) items.push_back({id, static_cast<std::uint64_t>(i) * item, item, true, true});
    Swapper sw(store, pool, 4, item);
    faults.fail_at = faults.seen.load() + 30;
    int processed = 0;
    EXPECT_THROW(sw.run(items, [&](std::size_t, void*, std::size_t) { ++processed; }), IoError);
    EXPECT_LT(processed, 50);
    EXPECT_EQ(pool.in_use(), 4 * store.padded(item));  // the swapper still owns exactly its buffers
  }
  EXPECT_EQ(pool.in_use(), 0u);
  EXPECT_EQ(dir.entries(), 0u);
}

TEST(PinnedPool, TooSmallMemlockLimitIsAClearErrorWithTheFix) {
  // In a child: lower RLIMIT_MEMLOCK and, when root (CAP_IPC_LOCK ignores the limit), become nobody.
  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(pipefd[0]);
    rlimit rl{64 << 10, 64 << 10};
    ::setrlimit(RLIMIT_MEMLOCK, &rl);
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) ::_exit(3);
    std::string msg = "(no error)";
    try {
      PinnedPool pool(8 << 20);
    } catch (const Error& e) {
      msg = std::string(e.what()) + " | " + e.hint();
    }
    [[maybe_unused]] auto w = ::write(pipefd[1], msg.data(), msg.size());
    ::_exit(0);
  }
  ::close(pipefd[1]);
  std::string msg(1024, '\0');
  const auto n = ::read(pipefd[0], msg.data(), msg.size());
  ::close(pipefd[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 3) GTEST_SKIP() << "cannot drop privileges here";
  msg.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
  EXPECT_NE(msg.find("RLIMIT_MEMLOCK"), std::string::npos) << msg;
  EXPECT_NE(msg.find("ulimit -l"), std::string::npos) << msg;
  EXPECT_NE(msg.find("pin_memory: false"), std::string::npos) << msg;
}

TEST(PinnedPool, BoundedCoalescingAndBlocking) {
  PinnedPool pool(1 << 20);
  EXPECT_EQ(pool.capacity(), 1u << 20);
  std::vector<PinnedBuffer> bs;
  for (int i = 0; i < 16; ++i) bs.push_back(pool.acquire(60000));  // rounds to 61440
  EXPECT_THROW(pool.acquire(200000), Error);
  std::mt19937 rng(1);
  std::shuffle(bs.begin(), bs.end(), rng);
  bs.clear();  // released in random order: must coalesce back to one block
  EXPECT_EQ(pool.in_use(), 0u);
  PinnedBuffer all = pool.acquire(1 << 20);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(all.data()) % PinnedPool::kAlign, 0u);
  std::thread t([&] {
    std::this_thread::yield();
    all.reset();
  });
  PinnedBuffer again = pool.acquire(4096, /*wait=*/true);  // blocks until the thread releases
  t.join();
  EXPECT_TRUE(again);
  EXPECT_EQ(pool.peak(), 1u << 20);
}

}  // namespace
}  // namespace zinf::nvme
