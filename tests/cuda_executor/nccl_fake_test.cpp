// nccl_fake_test.cpp — tests of the executor's NCCL (nccl.cpp) against NCCL's documented semantics:
// ranks as threads of this process, and ranks as separate processes (this binary re-executed, as
// mpirun would start it) to prove the cross-process transport. Buffers are executor device memory
// (cudaMalloc); work goes on created streams unless a test says otherwise.
#include <gtest/gtest.h>
#include <nccl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cudax/runtime.h"

extern char** environ;

namespace zinf::cudax {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

// cudaFree synchronizes the whole device, as CUDA's does: from a rank thread it would wait for the
// peers' streams, which may be waiting for this very rank. So what rank threads allocate is freed
// once every rank is done (run_ranks).
thread_local bool t_rank_thread = false;
std::mutex g_deferred_mu;
std::vector<void*> g_deferred_frees;

void free_deferred() {
  std::lock_guard lk(g_deferred_mu);
  for (void* p : g_deferred_frees) cudaFree(p);
  g_deferred_frees.clear();
}

// A device allocation holding n elements of T.
template <class T>
class DevBuf {
 public:
  explicit DevBuf(std::size_t n) : n_(n) { EXPECT_EQ(cudaMalloc(&p_, bytes() ? bytes() : 1), cudaSuccess); }
  ~DevBuf() {
    if (!t_rank_thread) {
      cudaFree(p_);
      return;
    }
    std::lock_guard lk(g_deferred_mu);
    g_deferred_frees.push_back(p_);
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  T* get() const { return static_cast<T*>(p_); }
  std::size_t bytes() const { return n_ * sizeof(T); }
  void upload(const std::vector<T>& v) {
    ASSERT_EQ(v.size(), n_);
    ASSERT_EQ(cudaMemcpy(p_, v.data(), bytes(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<T> download() const {
    std::vector<T> v(n_);
    EXPECT_EQ(cudaMemcpy(v.data(), p_, bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }

 private:
  std::size_t n_;
  void* p_ = nullptr;
};

// A recognizable byte for (who sent it, to whom, where).
unsigned char pattern(int from, int to, std::size_t i) {
  return static_cast<unsigned char>((i * 131u + static_cast<unsigned>(from) * 17u + static_cast<unsigned>(to) * 7u) ^
                                    (i >> 13));
}

std::vector<unsigned char> pattern_vec(int from, int to, std::size_t n) {
  std::vector<unsigned char> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = pattern(from, to, i);
  return v;
}

// Index of the first difference, or -1.
template <class T>
long long first_diff(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!(a[i] == b[i])) return static_cast<long long>(i);
  return -1;
}

// Ranks that are threads of one process share one context, so their streams must be non-blocking:
// the legacy stream (cudaMemcpy, stream 0) waits for every blocking stream, a peer's stuck in a
// transfer with this very rank included.
cudaStream_t make_stream() {
  cudaStream_t s = nullptr;
  EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  return s;
}

// A failed stream item is sticky for the whole context, as on a GPU: a test that fails on purpose
// ends it once its ranks are done.
void end_sticky_error() { cudaDeviceReset(); }

struct Rank {
  int rank = 0, nranks = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
};

// Runs body on nranks threads, each with an initialized communicator and its own stream, then
// destroys them. `fails`: the body fails on purpose, so the context's sticky error is ended after.
void run_ranks(int nranks, const std::function<void(Rank&)>& body, bool fails = false) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::vector<std::thread> threads;
  for (int r = 0; r < nranks; ++r)
    threads.emplace_back([&, r] {
      t_rank_thread = true;
      Rank me;
      me.rank = r;
      me.nranks = nranks;
      me.stream = make_stream();
      ASSERT_EQ(ncclCommInitRank(&me.comm, nranks, id, r), ncclSuccess) << "rank " << r;
      body(me);
      EXPECT_EQ(ncclCommDestroy(me.comm), ncclSuccess);
      cudaStreamDestroy(me.stream);
    });
  for (auto& t : threads) t.join();
  if (fails) end_sticky_error();
  free_deferred();
}

// Sets an environment variable for the life of the object.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_)
      setenv(name_.c_str(), old_.c_str(), 1);
    else
      unsetenv(name_.c_str());
  }

 private:
  std::string name_, old_;
  bool had_ = false;
};

// ------------------------------------------------------------------------------------------------

TEST(NcclFake, VersionErrorStringsAndUniqueIds) {
  int v = 0;
  ASSERT_EQ(ncclGetVersion(&v), ncclSuccess);
  EXPECT_EQ(v, NCCL_VERSION_CODE);
  EXPECT_EQ(ncclGetVersion(nullptr), ncclInvalidArgument);
  for (int r = ncclSuccess; r < ncclNumResults; ++r)
    EXPECT_GT(std::strlen(ncclGetErrorString(static_cast<ncclResult_t>(r))), 0u);
  ncclUniqueId a, b;
  ASSERT_EQ(ncclGetUniqueId(&a), ncclSuccess);
  ASSERT_EQ(ncclGetUniqueId(&b), ncclSuccess);
  EXPECT_NE(std::memcmp(&a, &b, sizeof a), 0) << "two ids must differ";
  EXPECT_EQ(ncclGetUniqueId(nullptr), ncclInvalidArgument);
}

TEST(NcclFake, InitRankRejectsBadArguments) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t c = nullptr;
  EXPECT_EQ(ncclCommInitRank(nullptr, 1, id, 0), ncclInvalidArgument);
  EXPECT_EQ(ncclCommInitRank(&c, 0, id, 0), ncclInvalidArgument);
  EXPECT_EQ(ncclCommInitRank(&c, 2, id, 2), ncclInvalidArgument);
  EXPECT_EQ(ncclCommInitRank(&c, 2, id, -1), ncclInvalidArgument);
  ncclUniqueId junk;
  std::memset(&junk, 0x5a, sizeof junk);
  EXPECT_EQ(ncclCommInitRank(&c, 1, junk, 0), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("ncclGetUniqueId"), std::string::npos);
  ncclConfig_t bad{};
  EXPECT_EQ(ncclCommInitRankConfig(&c, 1, id, 0, &bad), ncclInvalidArgument);
}

TEST(NcclFake, SingleRankCommunicator) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t c = nullptr;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  ASSERT_EQ(ncclCommInitRankConfig(&c, 1, id, 0, &cfg), ncclSuccess);
  int n = 0, r = -1;
  EXPECT_EQ(ncclCommCount(c, &n), ncclSuccess);
  EXPECT_EQ(ncclCommUserRank(c, &r), ncclSuccess);
  EXPECT_EQ(n, 1);
  EXPECT_EQ(r, 0);
  cudaStream_t s = make_stream();
  DevBuf<float> a(1000), b(1000);
  std::vector<float> v(1000);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) * 0.5f;
  a.upload(v);
  EXPECT_EQ(ncclAllReduce(a.get(), b.get(), 1000, ncclFloat32, ncclSum, c, s), ncclSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(b.download(), v);
  // A rank may send to itself, grouped with the receive.
  DevBuf<float> d(1000);
  EXPECT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclSend(a.get(), 1000, ncclFloat32, 0, c, s), ncclSuccess);
  EXPECT_EQ(ncclRecv(d.get(), 1000, ncclFloat32, 0, c, s), ncclSuccess);
  EXPECT_EQ(ncclGroupEnd(), ncclSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(d.download(), v);
  EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  cudaStreamDestroy(s);
}

TEST(NcclFake, UniqueIdServesExactlyTheRanksItWasMadeFor) {
  std::atomic<int> seen{0};
  run_ranks(3, [&](Rank& me) {
    int n = 0, r = -1;
    EXPECT_EQ(ncclCommCount(me.comm, &n), ncclSuccess);
    EXPECT_EQ(ncclCommUserRank(me.comm, &r), ncclSuccess);
    EXPECT_EQ(n, 3);
    EXPECT_EQ(r, me.rank);
    ncclResult_t async = ncclInternalError;
    EXPECT_EQ(ncclCommGetAsyncError(me.comm, &async), ncclSuccess);
    EXPECT_EQ(async, ncclSuccess);
    ++seen;
  });
  EXPECT_EQ(seen, 3);
}

TEST(NcclFake, MissingRankTimesOutInsteadOfHanging) {
  ScopedEnv env("ZINF_CUDAX_NCCL_TIMEOUT_S", "1");
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclResult_t res[2];
  std::vector<std::thread> t;
  for (int r = 0; r < 2; ++r)  // rank 2 of 3 never comes
    t.emplace_back([&, r] {
      ncclComm_t c = nullptr;
      res[r] = ncclCommInitRank(&c, 3, id, r);
      if (res[r] == ncclSuccess) ncclCommDestroy(c);
    });
  for (auto& x : t) x.join();
  EXPECT_EQ(res[0], ncclSystemError);
  EXPECT_EQ(res[1], ncclSystemError);
}

TEST(NcclFake, DuplicateRankIsInvalidUsage) {
  ScopedEnv env("ZINF_CUDAX_NCCL_TIMEOUT_S", "5");
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  const int ranks[3] = {0, 0, 1};
  ncclResult_t res[3];
  ncclComm_t comms[3] = {};
  std::vector<std::thread> t;
  for (int i = 0; i < 3; ++i) t.emplace_back([&, i] { res[i] = ncclCommInitRank(&comms[i], 2, id, ranks[i]); });
  for (auto& x : t) x.join();
  // One of the two rank-0 callers gets the rank; the other is refused at once.
  EXPECT_TRUE((res[0] == ncclSuccess) != (res[1] == ncclSuccess));
  EXPECT_TRUE(res[0] == ncclInvalidUsage || res[1] == ncclInvalidUsage);
  EXPECT_EQ(res[2], ncclSuccess);
  for (int i = 0; i < 3; ++i)
    if (res[i] == ncclSuccess) {
      EXPECT_EQ(ncclCommDestroy(comms[i]), ncclSuccess);
    }
}

TEST(NcclFake, DisagreeingRankCountsAreInvalidUsage) {
  ScopedEnv env("ZINF_CUDAX_NCCL_TIMEOUT_S", "5");
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclResult_t res[2];
  std::vector<std::thread> t;
  for (int r = 0; r < 2; ++r)
    t.emplace_back([&, r] {
      ncclComm_t c = nullptr;
      res[r] = ncclCommInitRank(&c, r == 0 ? 2 : 3, id, r);
      if (res[r] == ncclSuccess) ncclCommDestroy(c);
    });
  for (auto& x : t) x.join();
  EXPECT_EQ(res[0], ncclInvalidUsage);
  EXPECT_EQ(res[1], ncclInvalidUsage);
}

// Both ranks send and receive several MiB in one group: far beyond a socket buffer, so a blocking
// send-then-receive would deadlock.
TEST(NcclFake, SendRecvBothWaysInOneGroup) {
  const std::size_t n = 8 * kMiB + 123;
  run_ranks(2, [&](Rank& me) {
    const int peer = 1 - me.rank;
    DevBuf<unsigned char> out(n), in(n);
    out.upload(pattern_vec(me.rank, peer, n));
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    ASSERT_EQ(ncclSend(out.get(), n, ncclUint8, peer, me.comm, me.stream), ncclSuccess);
    ASSERT_EQ(ncclRecv(in.get(), n, ncclUint8, peer, me.comm, me.stream), ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
    ASSERT_EQ(cudaStreamSynchronize(me.stream), cudaSuccess);
    EXPECT_EQ(first_diff(in.download(), pattern_vec(peer, me.rank, n)), -1);
  });
}

// Receive first, then send, in the group: order inside a group does not matter.
TEST(NcclFake, NeighborExchangeFourRanks) {
  const std::size_t n = 3 * kMiB + 5;
  run_ranks(4, [&](Rank& me) {
    const int next = (me.rank + 1) % 4, prev = (me.rank + 3) % 4;
    DevBuf<unsigned char> to_next(n), to_prev(n), from_next(n), from_prev(n);
    to_next.upload(pattern_vec(me.rank, next, n));
    to_prev.upload(pattern_vec(me.rank, prev, n));
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    ASSERT_EQ(ncclRecv(from_prev.get(), n, ncclUint8, prev, me.comm, me.stream), ncclSuccess);
    ASSERT_EQ(ncclRecv(from_next.get(), n, ncclUint8, next, me.comm, me.stream), ncclSuccess);
    ASSERT_EQ(ncclSend(to_next.get(), n, ncclUint8, next, me.comm, me.stream), ncclSuccess);
    ASSERT_EQ(ncclSend(to_prev.get(), n, ncclUint8, prev, me.comm, me.stream), ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
    ASSERT_EQ(cudaStreamSynchronize(me.stream), cudaSuccess);
    EXPECT_EQ(first_diff(from_prev.download(), pattern_vec(prev, me.rank, n)), -1);
    EXPECT_EQ(first_diff(from_next.download(), pattern_vec(next, me.rank, n)), -1);
  });
}

// Transfers to one peer match in issue order, across ungrouped calls and inside a group.
TEST(NcclFake, TransfersToOnePeerMatchInOrder) {
  run_ranks(2, [&](Rank& me) {
    const std::size_t sizes[3] = {10, 2 * kMiB, 77};
    std::vector<std::unique_ptr<DevBuf<unsigned char>>> bufs;
    for (int k = 0; k < 3; ++k) bufs.push_back(std::make_unique<DevBuf<unsigned char>>(sizes[k]));
    if (me.rank == 0) {
      for (int k = 0; k < 3; ++k) {
        bufs[static_cast<std::size_t>(k)]->upload(pattern_vec(k, 9, sizes[k]));
        ASSERT_EQ(ncclSend(bufs[static_cast<std::size_t>(k)]->get(), sizes[k], ncclUint8, 1, me.comm, me.stream),
                  ncclSuccess);
      }
    } else {
      ASSERT_EQ(ncclGroupStart(), ncclSuccess);
      for (int k = 0; k < 3; ++k)
        ASSERT_EQ(ncclRecv(bufs[static_cast<std::size_t>(k)]->get(), sizes[k], ncclUint8, 0, me.comm, me.stream),
                  ncclSuccess);
      ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
    }
    ASSERT_EQ(cudaStreamSynchronize(me.stream), cudaSuccess);
    if (me.rank == 1) {
      for (int k = 0; k < 3; ++k)
        EXPECT_EQ(first_diff(bufs[static_cast<std::size_t>(k)]->download(), pattern_vec(k, 9, sizes[k])), -1);
    }
  });
}

// A call is stream work: it returns before the peer has even issued its side.
TEST(NcclFake, CallsReturnBeforeThePeerArrives) {
  std::atomic<bool> sent_returned{false};
  run_ranks(2, [&](Rank& me) {
    DevBuf<int> buf(1 << 18);
    if (me.rank == 0) {
      buf.upload(std::vector<int>(1 << 18, 42));
      ASSERT_EQ(ncclSend(buf.get(), 1 << 18, ncclInt32, 1, me.comm, me.stream), ncclSuccess);
      sent_returned = true;
    } else {
      while (!sent_returned) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      ASSERT_EQ(ncclRecv(buf.get(), 1 << 18, ncclInt32, 0, me.comm, me.stream), ncclSuccess);
    }
    ASSERT_EQ(cudaStreamSynchronize(me.stream), cudaSuccess);
    if (me.rank == 1) {
      EXPECT_EQ(buf.download(), std::vector<int>(1 << 18, 42));
    }
  });
}

// Work on one communicator runs in issue order even when it is spread over streams: the first send
// is held up behind other work on its stream, yet the second (another stream) does not overtake it.
TEST(NcclFake, IssueOrderHoldsAcrossStreams) {
  run_ranks(2, [&](Rank& me) {
    DevBuf<unsigned char> x(100), y(200);
    if (me.rank == 0) {
      cudaStream_t other = make_stream();
      x.upload(pattern_vec(0, 1, 100));
      y.upload(pattern_vec(0, 2, 200));
      ASSERT_EQ(enqueue(me.stream,
                        [] {
                          std::this_thread::sleep_for(std::chrono::milliseconds(100));
                          return cudaSuccess;
                        }),
                cudaSuccess);
      ASSERT_EQ(ncclSend(x.get(), 100, ncclUint8, 1, me.comm, me.stream), ncclSuccess);
      ASSERT_EQ(ncclSend(y.get(), 200, ncclUint8, 1, me.comm, other), ncclSuccess);
      EXPECT_EQ(cudaStreamSynchronize(other), cudaSuccess);
      cudaStreamDestroy(other);
    } else {
      ASSERT_EQ(ncclRecv(x.get(), 100, ncclUint8, 0, me.comm, me.stream), ncclSuccess);
      ASSERT_EQ(ncclRecv(y.get(), 200, ncclUint8, 0, me.comm, me.stream), ncclSuccess);
    }
    ASSERT_EQ(cudaStreamSynchronize(me.stream), cudaSuccess);
    if (me.rank == 1) {
      EXPECT_EQ(x.download(), pattern_vec(0, 1, 100));
      EXPECT_EQ(y.download(), pattern_vec(0, 2, 200));
    }
  });
}

// A group naming two streams joins them: work queued on either after ncclGroupEnd sees the whole
// group done.
TEST(NcclFake, GroupOverTwoStreamsJoinsThem) {
  const std::size_t n = 2 * kMiB;
  run_ranks(2, [&](Rank& me) {
    const int peer = 1 - me.rank;
    cudaStream_t other = make_stream();
    DevBuf<unsigned char> out(n), in(n);
    out.upload(pattern_vec(me.rank, peer, n));
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    ASSERT_EQ(ncclSend(out.get(), n, ncclUint8, peer, me.comm, me.stream), ncclSuccess);
    ASSERT_EQ(ncclRecv(in.get(), n, ncclUint8, peer, me.comm, other), ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
    std::atomic<bool> saw_data{false};
    const unsigned char* p = in.get();
    const unsigned char want = pattern(peer, me.rank, n - 1);
    ASSERT_EQ(enqueue(me.stream,
                      [&] {
                        saw_data = p[n - 1] == want;  // the receive was on the other stream
                        return cudaSuccess;
                      }),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(me.stream), cudaSuccess);
    EXPECT_TRUE(saw_data);
    ASSERT_EQ(cudaStreamSynchronize(other), cudaSuccess);
    EXPECT_EQ(first_diff(in.download(), pattern_vec(peer, me.rank, n)), -1);
    cudaStreamDestroy(other);
  });
}

TEST(NcclFake, BroadcastFromEachRootInAndOutOfPlace) {
  const std::size_t n = 5 * kMiB + 3;
  run_ranks(3, [&](Rank& me) {
    DevBuf<unsigned char> src(n), dst(n);
    for (int root = 0; root < 3; ++root) {
      const auto want = pattern_vec(root, 100, n);
      // Out of place: only the root's sendbuff is read.
      src.upload(me.rank == root ? want : std::vector<unsigned char>(n, 0xee));
      dst.upload(std::vector<unsigned char>(n, 0));
      ASSERT_EQ(ncclBroadcast(src.get(), dst.get(), n, ncclUint8, root, me.comm, me.stream), ncclSuccess);
      ASSERT_EQ(cudaStreamSynchronize(me.stream), cudaSuccess);
      EXPECT_EQ(first_diff(dst.download(), want), -1) << "root " << root << " rank " << me.rank;
      // In place, as nccl.cu calls it.
      const auto want2 = pattern_vec(root, 200, n);
      dst.upload(me.rank == root ? want2 : std::vector<unsigned char>(n, 0x11));
      ASSERT_EQ(ncclBroadcast(dst.get(), dst.get(), n, ncclUint8, root, me.comm, me.stream), ncclSuccess);
      ASSERT_EQ(cudaStreamSynchronize(me.stream), cudaSuccess);
      EXPECT_EQ(first_diff(dst.download(), want2), -1) << "in place, root " << root << " rank " << me.rank;
    }
    // The deprecated in-place form.
    DevBuf<float> f(1000);
    f.upload(std::vector<float>(1000, me.rank == 2 ? 3.5f : 0.f));
    ASSERT_EQ(ncclBcast(f.get(), 1000, ncclFloat32, 2, me.comm, me.stream), ncclSuccess);
    ASSERT_EQ(cudaStreamSynchronize(me.stream), cudaSuccess);
    EXPECT_EQ(f.download(), std::vector<float>(1000, 3.5f));
  });
}

// The variable all-to-all of nccl.cu: sends and receives to every rank, oneself included, in one
// group, with different counts per pair (some zero).
TEST(NcclFake, AlltoallvPatternIncludingSelf) {
  const int n = 3;
  auto count = [](int from, int to) -> std::size_t {
    return from == 1 && to == 2 ? 0 : static_cast<std::size_t>(1000 * (from + 1) + 300 * to + 1);
  };
  run_ranks(n, [&](Rank& me) {
    std::size_t send_total = 0, recv_total = 0;
    for (int p = 0; p < n; ++p) send_total += count(me.rank, p), recv_total += count(p, me.rank);
    std::vector<unsigned char> send_host;
    for (int p = 0; p < n; ++p) {
      auto part = pattern_vec(me.rank, p, count(me.rank, p));
      send_host.insert(send_host.end(), part.begin(), part.end());
    }
    DevBuf<unsigned char> send(send_total), recv(recv_total);
    send.upload(send_host);
    std::size_t so = 0, ro = 0;
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int p = 0; p < n; ++p) {
      if (count(me.rank, p)) {
        ASSERT_EQ(ncclSend(send.get() + so, count(me.rank, p), ncclUint8, p, me.comm, me.stream), ncclSuccess);
      }
      if (count(p, me.rank)) {
        ASSERT_EQ(ncclRecv(recv.get() + ro, count(p, me.rank), ncclUint8, p, me.comm, me.stream), ncclSuccess);
      }
      so += count(me.rank, p);
      ro += count(p, me.rank);
    }
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
    ASSERT_EQ(cudaStreamSynchronize(me.stream), cudaSuccess);
    std::vector<unsigned char> want;
    for (int p = 0; p < n; ++p) {
      auto part = pattern_vec(p, me.rank, count(p, me.rank));
      want.insert(want.end(), part.begin(), part.end());
    }
    EXPECT_EQ(first_diff(recv.download(), want), -1);
  });
}

TEST(NcclFake, BadArgumentsAreReportedAtTheCall) {
  run_ranks(2, [&](Rank& me) {
    DevBuf<float> d(256);
    std::vector<float> host(256);
    EXPECT_EQ(ncclSend(d.get(), 256, ncclFloat32, 2, me.comm, me.stream), ncclInvalidArgument);
    EXPECT_EQ(ncclRecv(d.get(), 256, ncclFloat32, -1, me.comm, me.stream), ncclInvalidArgument);
    EXPECT_EQ(ncclSend(d.get(), 256, ncclFloat32, 1 - me.rank, nullptr, me.stream), ncclInvalidArgument);
    EXPECT_EQ(ncclSend(d.get(), 256, static_cast<ncclDataType_t>(ncclNumTypes), 1 - me.rank, me.comm, me.stream),
              ncclInvalidArgument);
    // Host memory is not device memory; nor is a range running past the allocation.
    EXPECT_EQ(ncclSend(host.data(), 256, ncclFloat32, 1 - me.rank, me.comm, me.stream), ncclInvalidArgument);
    EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("device"), std::string::npos);
    EXPECT_EQ(ncclRecv(d.get(), 257, ncclFloat32, 1 - me.rank, me.comm, me.stream), ncclInvalidArgument);
    EXPECT_EQ(ncclBroadcast(d.get(), d.get(), 256, ncclFloat32, 5, me.comm, me.stream), ncclInvalidArgument);
    EXPECT_EQ(ncclAllReduce(d.get(), d.get(), 256, ncclFloat32, static_cast<ncclRedOp_t>(ncclNumOps), me.comm,
                            me.stream),
              ncclInvalidArgument);
    EXPECT_EQ(ncclAllReduce(d.get(), d.get(), 256, ncclFloat8e4m3, ncclSum, me.comm, me.stream), ncclInvalidArgument);
    // A failed call inside a group fails the group, which then issues nothing.
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    EXPECT_EQ(ncclSend(d.get(), 256, ncclFloat32, 1 - me.rank, me.comm, me.stream), ncclSuccess);
    EXPECT_EQ(ncclSend(d.get(), 256, ncclFloat32, 7, me.comm, me.stream), ncclInvalidArgument);
    EXPECT_EQ(ncclGroupEnd(), ncclInvalidArgument);
    EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage) << "no group is open";
    // Zero counts are no-ops and need no partner.
    EXPECT_EQ(ncclSend(d.get(), 0, ncclFloat32, 1 - me.rank, me.comm, me.stream), ncclSuccess);
    EXPECT_EQ(ncclAllReduce(nullptr, nullptr, 0, ncclFloat32, ncclSum, me.comm, me.stream), ncclSuccess);
    EXPECT_EQ(cudaStreamSynchronize(me.stream), cudaSuccess);
    ncclResult_t async = ncclInternalError;
    EXPECT_EQ(ncclCommGetAsyncError(me.comm, &async), ncclSuccess);
    EXPECT_EQ(async, ncclSuccess) << "argument errors are not asynchronous errors";
  });
  EXPECT_EQ(ncclCommDestroy(nullptr), ncclSuccess);
}

// Mismatched counts (or types) fail on both ranks, as the stream's error and the communicator's
// asynchronous error, without hanging or writing past the receive buffer.
void expect_mismatch_fails_both(std::size_t send_count, ncclDataType_t send_type, std::size_t recv_count,
                                ncclDataType_t recv_type) {
  const std::size_t n = 4 * kMiB;
  DevBuf<unsigned char> b0(n), b1(n);
  b0.upload(std::vector<unsigned char>(n, 0x33));
  b1.upload(std::vector<unsigned char>(n, 0x33));
  run_ranks(2, [&](Rank& me) {
    unsigned char* buf = (me.rank == 0 ? b0 : b1).get();
    if (me.rank == 0) {
      ASSERT_EQ(ncclSend(buf, send_count, send_type, 1, me.comm, me.stream), ncclSuccess);
    } else {
      ASSERT_EQ(ncclRecv(buf, recv_count, recv_type, 0, me.comm, me.stream), ncclSuccess);
    }
    EXPECT_NE(cudaStreamSynchronize(me.stream), cudaSuccess) << "rank " << me.rank;
    ncclResult_t async = ncclSuccess;
    EXPECT_EQ(ncclCommGetAsyncError(me.comm, &async), ncclSuccess);
    EXPECT_EQ(async, ncclInvalidUsage) << "rank " << me.rank;
    EXPECT_NE(std::string(ncclGetLastError(me.comm)).find("does not match"), std::string::npos)
        << ncclGetLastError(me.comm);
    // Nothing was written. (The context has failed, so no copy runs: read the host memory behind the
    // buffer, opening device memory to this thread as device work would.)
    {
      const zinf::cudax::DeviceAccess inspect;
      EXPECT_TRUE(std::all_of(buf, buf + n, [](unsigned char c) { return c == 0x33; })) << "rank " << me.rank;
    }
    // The failed communicator refuses further work.
    EXPECT_EQ(ncclSend(buf, 1, ncclUint8, 1 - me.rank, me.comm, me.stream), ncclInvalidUsage);
  }, /*fails=*/true);
}

TEST(NcclFake, MismatchedCountsFailOnBothRanks) {
  expect_mismatch_fails_both(100, ncclFloat32, 200, ncclFloat32);
  expect_mismatch_fails_both(3 * kMiB, ncclUint8, 1 * kMiB, ncclUint8);
}

TEST(NcclFake, MismatchedDatatypesFailOnBothRanks) { expect_mismatch_fails_both(400, ncclUint8, 100, ncclFloat32); }

// Ranks that disagree so that both wait to send (different broadcast roots) cannot be told apart
// from a slow peer; they wait, then fail after ZINF_CUDAX_NCCL_TIMEOUT_S instead of hanging forever:
// the first to time out closes its connections, so the other fails at once as well.
TEST(NcclFake, DisagreeingRootsTimeOut) {
  ScopedEnv env("ZINF_CUDAX_NCCL_TIMEOUT_S", "1");
  DevBuf<float> b0(1000), b1(1000);
  ncclResult_t async[2] = {ncclSuccess, ncclSuccess};
  std::string text[2];
  run_ranks(2, [&](Rank& me) {
    float* buf = (me.rank == 0 ? b0 : b1).get();
    ASSERT_EQ(ncclBroadcast(buf, buf, 1000, ncclFloat32, me.rank, me.comm, me.stream), ncclSuccess);
    EXPECT_NE(cudaStreamSynchronize(me.stream), cudaSuccess);
    EXPECT_EQ(ncclCommGetAsyncError(me.comm, &async[me.rank]), ncclSuccess);
    text[me.rank] = ncclGetLastError(me.comm);
  }, /*fails=*/true);
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(async[r] == ncclSystemError || async[r] == ncclRemoteError) << async[r];
  const int timed_out = async[0] == ncclSystemError ? 0 : 1;
  EXPECT_EQ(async[timed_out], ncclSystemError);
  EXPECT_NE(text[timed_out].find("timed out"), std::string::npos) << text[timed_out];
}

TEST(NcclFake, PeerThatLeavesIsARemoteError) {
  DevBuf<float> d(1024);
  run_ranks(2, [&](Rank& me) {
    if (me.rank == 0) {
      ASSERT_EQ(ncclRecv(d.get(), 1024, ncclFloat32, 1, me.comm, me.stream), ncclSuccess);
      EXPECT_NE(cudaStreamSynchronize(me.stream), cudaSuccess);
      ncclResult_t async = ncclSuccess;
      EXPECT_EQ(ncclCommGetAsyncError(me.comm, &async), ncclSuccess);
      EXPECT_EQ(async, ncclRemoteError);
    }
    // rank 1 destroys its communicator without sending (run_ranks does it on return).
  }, /*fails=*/true);
}

TEST(NcclFake, AbortUnblocksAStuckReceive) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::atomic<bool> aborted{false};
  DevBuf<float> d(1024);
  std::vector<std::thread> t;
  for (int r = 0; r < 2; ++r)
    t.emplace_back([&, r] {
      ncclComm_t c = nullptr;
      cudaStream_t s = make_stream();
      ASSERT_EQ(ncclCommInitRank(&c, 2, id, r), ncclSuccess);
      if (r == 0) {
        ASSERT_EQ(ncclRecv(d.get(), 1024, ncclFloat32, 1, c, s), ncclSuccess);  // rank 1 never sends
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        EXPECT_EQ(ncclCommAbort(c), ncclSuccess);
        EXPECT_NE(cudaStreamSynchronize(s), cudaSuccess);
        aborted = true;
      } else {
        while (!aborted) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
      }
      cudaStreamDestroy(s);
    });
  for (auto& x : t) x.join();
  end_sticky_error();
}

// ------------------------------------------------------------------------------------------------
// Collectives

TEST(NcclFake, AllReduceSumFp32InAndOutOfPlace) {
  const std::size_t n = 1 * kMiB + 7;
  run_ranks(4, [&](Rank& me) {
    std::vector<float> mine(n), want(n);
    for (std::size_t i = 0; i < n; ++i) {
      mine[i] = static_cast<float>((i % 97) * (me.rank + 1)) - 3.f;
      want[i] = static_cast<float>((i % 97) * (1 + 2 + 3 + 4)) - 12.f;
    }
    DevBuf<float> a(n), b(n);
    a.upload(mine);
    ASSERT_EQ(ncclAllReduce(a.get(), b.get(), n, ncclFloat32, ncclSum, me.comm, me.stream), ncclSuccess);
    ASSERT_EQ(ncclAllReduce(a.get(), a.get(), n, ncclFloat32, ncclSum, me.comm, me.stream), ncclSuccess);
    ASSERT_EQ(cudaStreamSynchronize(me.stream), cudaSuccess);
    EXPECT_EQ(first_diff(b.download(), want), -1);
    EXPECT_EQ(first_diff(a.download(), want), -1);
  });
}

// fp16/bf16 sums, including a sum that must round to nearest even in the type.
TEST(NcclFake, AllReduceSum16BitTypes) {
  struct Case {
    ncclDataType_t type;
    std::uint16_t rank0, rank1, sum;
  };
  const Case cases[] = {
      {ncclFloat16, 0x3c00, 0x4000, 0x4200},   // 1 + 2 = 3
      {ncclFloat16, 0x6800, 0x4200, 0x6802},   // 2048 + 3 = 2051 -> 2052 (ties to even)
      {ncclFloat16, 0x6800, 0x3c00, 0x6800},   // 2048 + 1 = 2049 -> 2048
      {ncclFloat16, 0xbc00, 0x3c00, 0x0000},   // -1 + 1 = 0
      {ncclBfloat16, 0x3f80, 0x4000, 0x4040},  // 1 + 2 = 3
      {ncclBfloat16, 0x4380, 0x4040, 0x4382},  // 256 + 3 = 259 -> 260
      {ncclBfloat16, 0x4380, 0x3f80, 0x4380},  // 256 + 1 = 257 -> 256
  };
  run_ranks(2, [&](Rank& me) {
    for (const Case& c : cases) {
      const std::size_t n = 4096;
      DevBuf<std::uint16_t> a(n), b(n);
      a.upload(std::vector<std::uint16_t>(n, me.rank == 0 ? c.rank0 : c.rank1));
      ASSERT_EQ(ncclAllReduce(a.get(), b.get(), n, c.type, ncclSum, me.comm, me.stream), ncclSuccess);
      ASSERT_EQ(ncclAllReduce(a.get(), a.get(), n, c.type, ncclSum, me.comm, me.stream), ncclSuccess);
      ASSERT_EQ(cudaStreamSynchronize(me.stream), cudaSuccess);
      EXPECT_EQ(b.download(), std::vector<std::uint16_t>(n, c.sum)) << std::hex << c.rank0 << " + " << c.rank1;
      EXPECT_EQ(a.download(), std::vector<std::uint16_t>(n, c.sum)) << "in place";
    }
  });
}

TEST(NcclFake, AllReduceOtherOperationsInt32) {
  run_ranks(3, [&](Rank& me) {
    const std::size_t n = 1000;
    std::vector<int> mine(n);
    for (std::size_t i = 0; i < n; ++i) mine[i] = static_cast<int>(i % 10) - me.rank * 4;  // ranks: x, x-4, x-8
    DevBuf<int> a(n), b(n);
    a.upload(mine);
    const struct {
      ncclRedOp_t op;
      int (*f)(int);
    } ops[] = {
        {ncclMax, [](int x) { return x; }},
        {ncclMin, [](int x) { return x - 8; }},
        {ncclProd, [](int x) { return x * (x - 4) * (x - 8); }},
        {ncclAvg, [](int x) { return (3 * x - 12) / 3; }},
    };
    for (const auto& o : ops) {
      ASSERT_EQ(ncclAllReduce(a.get(), b.get(), n, ncclInt32, o.op, me.comm, me.stream), ncclSuccess);
      ASSERT_EQ(cudaStreamSynchronize(me.stream), cudaSuccess);
      std::vector<int> want(n);
      for (std::size_t i = 0; i < n; ++i) want[i] = o.f(static_cast<int>(i % 10));
      EXPECT_EQ(b.download(), want) << "op " << o.op;
    }
  });
}

TEST(NcclFake, ReduceScatterAllGatherReduceAlltoAll) {
  const int nr = 3;
  const std::size_t blk = 100000;
  run_ranks(nr, [&](Rank& me) {
    const std::size_t all = blk * nr;
    // ReduceScatter: rank r gets the sum of every rank's block r; then in place.
    std::vector<float> mine(all);
    for (std::size_t i = 0; i < all; ++i) mine[i] = static_cast<float>(i % 1000) + static_cast<float>(me.rank);
    DevBuf<float> send(all), recv(blk);
    send.upload(mine);
    ASSERT_EQ(ncclReduceScatter(send.get(), recv.get(), blk, ncclFloat32, ncclSum, me.comm, me.stream), ncclSuccess);
    ASSERT_EQ(ncclReduceScatter(send.get(), send.get() + blk * static_cast<std::size_t>(me.rank), blk, ncclFloat32,
                                ncclSum, me.comm, me.stream),
              ncclSuccess);
    ASSERT_EQ(cudaStreamSynchronize(me.stream), cudaSuccess);
    std::vector<float> want(blk);
    for (std::size_t i = 0; i < blk; ++i)
      want[i] = 3.f * static_cast<float>((blk * static_cast<std::size_t>(me.rank) + i) % 1000) + 3.f;
    EXPECT_EQ(first_diff(recv.download(), want), -1);
    auto in_place = send.download();
    EXPECT_EQ(first_diff(std::vector<float>(in_place.begin() + static_cast<long>(blk) * me.rank,
                                            in_place.begin() + static_cast<long>(blk) * (me.rank + 1)),
                         want),
              -1);

    // AllGather: out of place and in place.
    DevBuf<unsigned char> part(blk), gathered(all), gathered2(all);
    part.upload(pattern_vec(me.rank, 50, blk));
    auto g2 = std::vector<unsigned char>(all, 0);
    auto p = pattern_vec(me.rank, 50, blk);
    std::copy(p.begin(), p.end(), g2.begin() + static_cast<long>(blk) * me.rank);
    gathered2.upload(g2);
    ASSERT_EQ(ncclAllGather(part.get(), gathered.get(), blk, ncclUint8, me.comm, me.stream), ncclSuccess);
    ASSERT_EQ(ncclAllGather(gathered2.get() + blk * static_cast<std::size_t>(me.rank), gathered2.get(), blk, ncclUint8,
                            me.comm, me.stream),
              ncclSuccess);
    ASSERT_EQ(cudaStreamSynchronize(me.stream), cudaSuccess);
    std::vector<unsigned char> want_all;
    for (int r = 0; r < nr; ++r) {
      auto q = pattern_vec(r, 50, blk);
      want_all.insert(want_all.end(), q.begin(), q.end());
    }
    EXPECT_EQ(first_diff(gathered.download(), want_all), -1);
    EXPECT_EQ(first_diff(gathered2.download(), want_all), -1);

    // Reduce to root 1 (max), out of place.
    DevBuf<double> rs(blk), rr(blk);
    rs.upload(std::vector<double>(blk, 1.5 * me.rank));
    rr.upload(std::vector<double>(blk, -1.0));
    ASSERT_EQ(ncclReduce(rs.get(), rr.get(), blk, ncclFloat64, ncclMax, 1, me.comm, me.stream), ncclSuccess);
    ASSERT_EQ(cudaStreamSynchronize(me.stream), cudaSuccess);
    EXPECT_EQ(rr.download(), std::vector<double>(blk, me.rank == 1 ? 3.0 : -1.0));

    // AlltoAll: block p of rank r's input lands in block r of rank p's output.
    DevBuf<unsigned char> as(all), ar(all);
    std::vector<unsigned char> ain;
    for (int q = 0; q < nr; ++q) {
      auto x = pattern_vec(me.rank, q, blk);
      ain.insert(ain.end(), x.begin(), x.end());
    }
    as.upload(ain);
    ASSERT_EQ(ncclAlltoAll(as.get(), ar.get(), blk, ncclUint8, me.comm, me.stream), ncclSuccess);
    ASSERT_EQ(cudaStreamSynchronize(me.stream), cudaSuccess);
    std::vector<unsigned char> aw;
    for (int q = 0; q < nr; ++q) {
      auto x = pattern_vec(q, me.rank, blk);
      aw.insert(aw.end(), x.begin(), x.end());
    }
    EXPECT_EQ(first_diff(ar.download(), aw), -1);
  });
}

// NCCL's "several GPUs from one thread": one thread creates every rank (ncclCommInitAll, i.e.
// ncclCommInitRank in a group) and drives them all in one group, on one stream each and then all on
// the legacy default stream.
TEST(NcclFake, OneThreadDrivesEveryRankInAGroup) {
  const int n = 4;
  const std::size_t count = 300000;
  ncclComm_t comms[n];
  ASSERT_EQ(ncclCommInitAll(comms, n, nullptr), ncclSuccess);
  std::vector<cudaStream_t> streams(n);
  std::vector<std::unique_ptr<DevBuf<float>>> bufs;
  for (int r = 0; r < n; ++r) {
    streams[static_cast<std::size_t>(r)] = make_stream();
    bufs.push_back(std::make_unique<DevBuf<float>>(count));
  }
  for (cudaStream_t* on : {static_cast<cudaStream_t*>(nullptr), streams.data()}) {
    for (int r = 0; r < n; ++r) bufs[static_cast<std::size_t>(r)]->upload(std::vector<float>(count, float(r + 1)));
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < n; ++r)
      ASSERT_EQ(ncclAllReduce(bufs[static_cast<std::size_t>(r)]->get(), bufs[static_cast<std::size_t>(r)]->get(),
                              count, ncclFloat32, ncclSum, comms[r], on ? on[r] : nullptr),
                ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(cudaStreamSynchronize(on ? on[r] : nullptr), cudaSuccess);
      EXPECT_EQ(bufs[static_cast<std::size_t>(r)]->download(), std::vector<float>(count, 10.f));
    }
  }
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(ncclCommDestroy(comms[r]), ncclSuccess);
    cudaStreamDestroy(streams[static_cast<std::size_t>(r)]);
  }
}

// ------------------------------------------------------------------------------------------------
// Ranks as processes: this binary re-executed with the id, rank and scenario in its environment.

std::string id_to_hex(const ncclUniqueId& id) {
  static const char d[] = "0123456789abcdef";
  std::string s;
  for (char ch : id.internal) {
    const auto b = static_cast<unsigned char>(ch);
    s += d[b >> 4];
    s += d[b & 15];
  }
  return s;
}

ncclUniqueId id_from_hex(const std::string& s) {
  ncclUniqueId id{};
  for (std::size_t i = 0; i < sizeof id.internal && 2 * i + 1 < s.size(); ++i)
    id.internal[i] = static_cast<char>(std::stoi(s.substr(2 * i, 2), nullptr, 16));
  return id;
}

// Starts nranks children running `scenario`; returns their exit statuses (-1: killed on timeout).
std::vector<int> run_processes(int nranks, const std::string& scenario, int timeout_s = 120) {
  ncclUniqueId id;
  EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  const std::string hex = id_to_hex(id);
  std::vector<pid_t> pids;
  for (int r = 0; r < nranks; ++r) {
    std::vector<std::string> env_s;
    for (char** e = environ; *e; ++e)
      if (std::strncmp(*e, "ZINF_NCCL_TEST_", 15) != 0 && std::strncmp(*e, "GTEST_", 6) != 0)
        env_s.emplace_back(*e);  // a parent's sharding or output file must not reach the children
    env_s.push_back("ZINF_NCCL_TEST_ID=" + hex);
    env_s.push_back("ZINF_NCCL_TEST_RANK=" + std::to_string(r));
    env_s.push_back("ZINF_NCCL_TEST_NRANKS=" + std::to_string(nranks));
    env_s.push_back("ZINF_NCCL_TEST_SCENARIO=" + scenario);
    env_s.push_back("ZINF_CUDAX_NCCL_TIMEOUT_S=60");
    std::vector<char*> envp;
    for (auto& s : env_s) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::string exe = "/proc/self/exe", filter = "--gtest_filter=NcclFakeChild.DISABLED_Rank",
                also = "--gtest_also_run_disabled_tests", brief = "--gtest_brief=1";
    char* argv[] = {exe.data(), filter.data(), also.data(), brief.data(), nullptr};
    pid_t pid = -1;
    EXPECT_EQ(posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp.data()), 0);
    pids.push_back(pid);
  }
  std::vector<int> status(pids.size(), -1);
  std::vector<bool> done(pids.size(), false);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  for (std::size_t left = pids.size(); left > 0;) {
    for (std::size_t i = 0; i < pids.size(); ++i) {
      if (done[i]) continue;
      int st = 0;
      if (waitpid(pids[i], &st, WNOHANG) == pids[i]) {
        done[i] = true;
        --left;
        status[i] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
    }
    if (left > 0 && std::chrono::steady_clock::now() > deadline) {
      for (std::size_t i = 0; i < pids.size(); ++i)
        if (!done[i]) {
          kill(pids[i], SIGKILL);
          waitpid(pids[i], nullptr, 0);
          done[i] = true;
        }
      ADD_FAILURE() << "scenario " << scenario << " timed out";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return status;
}

// What each child rank runs.
void child_exchange(Rank& me) {
  const int n = me.nranks;
  // Every pair exchanges several MiB both ways in one group.
  const std::size_t big = 6 * kMiB + 11;
  std::vector<std::unique_ptr<DevBuf<unsigned char>>> out, in;
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int p = 0; p < n; ++p) {
    out.push_back(std::make_unique<DevBuf<unsigned char>>(big));
    in.push_back(std::make_unique<DevBuf<unsigned char>>(big));
    if (p == me.rank) continue;
    out.back()->upload(pattern_vec(me.rank, p, big));
    ASSERT_EQ(ncclSend(out.back()->get(), big, ncclUint8, p, me.comm, me.stream), ncclSuccess);
    ASSERT_EQ(ncclRecv(in.back()->get(), big, ncclUint8, p, me.comm, me.stream), ncclSuccess);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  ASSERT_EQ(cudaStreamSynchronize(me.stream), cudaSuccess);
  for (int p = 0; p < n; ++p)
    if (p != me.rank) {
      EXPECT_EQ(first_diff(in[static_cast<std::size_t>(p)]->download(), pattern_vec(p, me.rank, big)), -1)
          << "from " << p;
    }
  // In-place broadcast from each root.
  const std::size_t bn = 3 * kMiB + 1;
  DevBuf<unsigned char> b(bn);
  for (int root = 0; root < n; ++root) {
    b.upload(me.rank == root ? pattern_vec(root, 77, bn) : std::vector<unsigned char>(bn, 0));
    ASSERT_EQ(ncclBroadcast(b.get(), b.get(), bn, ncclUint8, root, me.comm, me.stream), ncclSuccess);
    ASSERT_EQ(cudaStreamSynchronize(me.stream), cudaSuccess);
    EXPECT_EQ(first_diff(b.download(), pattern_vec(root, 77, bn)), -1) << "root " << root;
  }
  // All-reduce.
  const std::size_t an = kMiB;
  DevBuf<float> a(an);
  a.upload(std::vector<float>(an, static_cast<float>(me.rank + 1)));
  ASSERT_EQ(ncclAllReduce(a.get(), a.get(), an, ncclFloat32, ncclSum, me.comm, me.stream), ncclSuccess);
  ASSERT_EQ(cudaStreamSynchronize(me.stream), cudaSuccess);
  EXPECT_EQ(a.download(), std::vector<float>(an, static_cast<float>(n * (n + 1) / 2)));
}

TEST(NcclFakeChild, DISABLED_Rank) {
  const char* id_hex = std::getenv("ZINF_NCCL_TEST_ID");
  ASSERT_NE(id_hex, nullptr) << "run by NcclFakeProcesses only";
  Rank me;
  me.rank = std::atoi(std::getenv("ZINF_NCCL_TEST_RANK"));
  me.nranks = std::atoi(std::getenv("ZINF_NCCL_TEST_NRANKS"));
  const std::string scenario = std::getenv("ZINF_NCCL_TEST_SCENARIO");
  me.stream = make_stream();
  ASSERT_EQ(ncclCommInitRank(&me.comm, me.nranks, id_from_hex(id_hex), me.rank), ncclSuccess);
  if (scenario == "exchange") {
    child_exchange(me);
  } else if (scenario == "peer_exits") {
    if (me.rank == 1) std::_Exit(0);  // gone without a word, as a crashed rank
    DevBuf<float> d(1 << 20);
    ASSERT_EQ(ncclRecv(d.get(), 1 << 20, ncclFloat32, 1, me.comm, me.stream), ncclSuccess);
    EXPECT_NE(cudaStreamSynchronize(me.stream), cudaSuccess);
    ncclResult_t async = ncclSuccess;
    EXPECT_EQ(ncclCommGetAsyncError(me.comm, &async), ncclSuccess);
    EXPECT_EQ(async, ncclRemoteError);
    end_sticky_error();  // before d is freed
  } else {
    FAIL() << "unknown scenario " << scenario;
  }
  EXPECT_EQ(ncclCommDestroy(me.comm), ncclSuccess);
  cudaStreamDestroy(me.stream);
}

TEST(NcclFakeProcesses, ExchangeBroadcastAllReduceTwoRanks) {
  EXPECT_EQ(run_processes(2, "exchange"), std::vector<int>(2, 0));
}

TEST(NcclFakeProcesses, ExchangeBroadcastAllReduceFourRanks) {
  EXPECT_EQ(run_processes(4, "exchange"), std::vector<int>(4, 0));
}

TEST(NcclFakeProcesses, RankThatExitsIsARemoteErrorNotAHang) {
  EXPECT_EQ(run_processes(2, "peer_exits"), std::vector<int>(2, 0));
}

}  // namespace
}  // namespace zinf::cudax
