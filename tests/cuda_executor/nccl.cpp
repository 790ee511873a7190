// nccl.cpp — the executor's NCCL: the entry points of NVIDIA's <nccl.h>, implemented from NCCL's
// documented semantics over the executor's host-memory "device" (cudax/runtime.h), so that data
// parallelism across ranks runs without GPUs. Ranks are processes on one machine (mpirun -np N) or
// threads of one process; every communicator talks over Unix-domain stream sockets in the abstract
// namespace (no files, no network), one socket per pair of ranks.
//
// What it assumes and guarantees:
//  - ncclUniqueId is an opaque 128-byte blob: a magic tag and a random nonce. Rank r of a communicator
//    listens on a socket named after the nonce and r, and keeps it while the communicator lives, so a
//    second rank r of the same id is refused (ncclInvalidUsage); an id serves one live communicator.
//    ncclCommInitRank is collective: rank r connects to every lower rank and accepts every higher one,
//    and each pair checks the other's nranks; it gives up after ZINF_CUDAX_NCCL_TIMEOUT_S (default
//    600 s; 0 waits forever) when a rank never arrives.
//  - Every call is stream work: ncclGroupEnd (or the call itself, outside a group) issues the
//    group's operations as one item via zinf::cudax::enqueue on each stream the group names; the last
//    stream to reach the item runs it (the others wait), so a group spanning streams joins them as
//    NCCL does. Work on one communicator runs in issue order whatever streams it is on. On stream 0
//    (which the runtime runs on the calling thread) the call returns when the work is done, with its
//    NCCL error if it failed. Ranks that are threads of one process need non-blocking streams: the
//    legacy stream (cudaMemcpy, stream 0) waits for every blocking stream, a peer's included.
//  - Inside an item every transfer progresses at once (non-blocking sockets, poll), so sends and
//    receives in one group never block each other. Transfers to one peer match in issue order, the
//    collectives lowered into transfers included. A receive first tells the sender what it expects
//    (count, type, operation); the sender checks it before moving data, so a mismatch fails on both
//    ranks (ncclInvalidUsage) instead of hanging or corrupting memory.
//  - Buffers must be device memory (is_device_range), else ncclInvalidArgument. Zero-count calls do
//    nothing. Send/receive with oneself must be paired within one group.
//  - A failed call returns its code; ncclGetLastError gives the calling thread's last such text.
//    A failure found while running (mismatch, a peer that exited or aborted, timeout) becomes the
//    stream's sticky error (cudaErrorUnknown), the communicator's ncclCommGetAsyncError and
//    ncclGetLastError(comm) text, and a line on stderr; the communicator then closes its connections,
//    so its peers fail with ncclRemoteError rather than wait forever.
//    (The runtime's sticky error is the whole context's: later work on every stream is dropped.)
//  - Reductions run locally after every rank's data has arrived, in rank order, so all ranks get the
//    same bits; fp16/bf16 round to their type after each step. fp8 reductions are not supported.
//  - Not caught: ranks that disagree so that both ends wait to send (say, a broadcast called with
//    different roots) wait as NCCL would; after 60 s without progress a line on stderr names what is
//    pending, and after ZINF_CUDAX_NCCL_TIMEOUT_S the work fails (ncclSystemError).
#include <nccl.h>

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "cudax/runtime.h"

namespace zinf::cudax {
struct NcclCommState;
}

// The handle behind ncclComm_t.
struct ncclComm {
  std::shared_ptr<zinf::cudax::NcclCommState> state;
};

namespace zinf::cudax {
namespace {

using Clock = std::chrono::steady_clock;

// ------------------------------------------------------------------------------------------------
// Errors

// ncclGetLastError: a call's own failure is kept per thread (ranks may be threads); a failure found
// while running on a stream is kept by its communicator and, process-wide, as the latest one.
thread_local std::string t_last_error;
std::mutex g_error_mu;
std::string g_last_async_error;

void report(const std::string& line) { std::fprintf(stderr, "cudax: nccl: %s\n", line.c_str()); }

void set_async_error_text(const std::string& msg) {
  std::lock_guard lk(g_error_mu);
  g_last_async_error = msg;
}

// Records msg as the calling thread's last error, prints it, and returns code.
ncclResult_t fail(ncclResult_t code, const std::string& msg) {
  t_last_error = msg;
  report(msg);
  return code;
}

std::string errno_text(int e) { return std::string(std::strerror(e)) + " (errno " + std::to_string(e) + ")"; }

// Seconds to wait for a rank that does not arrive or a transfer that does not move; 0 = forever.
double timeout_s() {
  const char* v = std::getenv("ZINF_CUDAX_NCCL_TIMEOUT_S");
  if (!v || !*v) return 600.0;
  char* end = nullptr;
  double d = std::strtod(v, &end);
  return (end && *end == '\0' && d >= 0) ? d : 600.0;
}

Clock::time_point deadline_after(double s) {
  if (s <= 0) return Clock::time_point::max();
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

// ------------------------------------------------------------------------------------------------
// Data types and reductions

std::size_t dtype_size(int t) {
  switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}

std::string dtype_name(int t) {
  switch (t) {
    case ncclInt8: return "ncclInt8";
    case ncclUint8: return "ncclUint8";
    case ncclInt32: return "ncclInt32";
    case ncclUint32: return "ncclUint32";
    case ncclInt64: return "ncclInt64";
    case ncclUint64: return "ncclUint64";
    case ncclFloat16: return "ncclFloat16";
    case ncclFloat32: return "ncclFloat32";
    case ncclFloat64: return "ncclFloat64";
    case ncclBfloat16: return "ncclBfloat16";
    case ncclFloat8e4m3: return "ncclFloat8e4m3";
    case ncclFloat8e5m2: return "ncclFloat8e5m2";
    default: return "datatype " + std::to_string(t);
  }
}

std::string redop_name(int op) {
  switch (op) {
    case ncclSum: return "ncclSum";
    case ncclProd: return "ncclProd";
    case ncclMax: return "ncclMax";
    case ncclMin: return "ncclMin";
    case ncclAvg: return "ncclAvg";
    default: return "reduction " + std::to_string(op);
  }
}

// IEEE binary16 <-> binary32, rounding to nearest even.
float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0) {
    const float mag = std::ldexp(static_cast<float>(man), -24);
    return sign ? -mag : mag;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (man << 13));
}

std::uint16_t round_shift(std::uint32_t v, int shift) {  // v >> shift, to nearest even
  const std::uint32_t kept = v >> shift, rest = v & ((1u << shift) - 1u), half = 1u << (shift - 1);
  return static_cast<std::uint16_t>(kept + ((rest > half || (rest == half && (kept & 1u))) ? 1u : 0u));
}

std::uint16_t float_to_half(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t exp = (x >> 23) & 0xffu, man = x & 0x7fffffu;
  if (exp == 0xff) return static_cast<std::uint16_t>(sign | 0x7c00u | (man ? 0x200u | (man >> 13) : 0u));
  const int e = static_cast<int>(exp) - 127 + 15;
  if (e >= 31) return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (e <= 0) {
    if (e < -10) return sign;
    return static_cast<std::uint16_t>(sign | round_shift(man | 0x800000u, 14 - e));
  }
  // A carry out of the mantissa correctly bumps the exponent (up to infinity).
  const std::uint32_t v = (static_cast<std::uint32_t>(e) << 23) | man;
  return static_cast<std::uint16_t>(sign | round_shift(v, 13));
}

float bf16_to_float(std::uint16_t b) { return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16); }

std::uint16_t float_to_bf16(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

template <class T>
T combine(T a, T b, int op) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;  // wrap around instead of signed overflow
    switch (op) {
      case ncclProd: return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
      case ncclMax: return a < b ? b : a;
      case ncclMin: return b < a ? b : a;
      default: return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    }
  } else {
    switch (op) {
      case ncclProd: return a * b;
      case ncclMax: return a < b ? b : a;
      case ncclMin: return b < a ? b : a;
      default: return a + b;
    }
  }
}

template <class T>
void reduce_native(void* out, const std::vector<const void*>& in, std::size_t count, int op) {
  const auto n = static_cast<T>(in.size());
  for (std::size_t i = 0; i < count; ++i) {
    T acc, v;
    std::memcpy(&acc, static_cast<const char*>(in[0]) + i * sizeof(T), sizeof(T));
    for (std::size_t k = 1; k < in.size(); ++k) {
      std::memcpy(&v, static_cast<const char*>(in[k]) + i * sizeof(T), sizeof(T));
      acc = combine(acc, v, op);
    }
    if (op == ncclAvg) acc = static_cast<T>(acc / n);
    std::memcpy(static_cast<char*>(out) + i * sizeof(T), &acc, sizeof(T));
  }
}

template <float (*Load)(std::uint16_t), std::uint16_t (*Store)(float)>
void reduce_16bit(void* out, const std::vector<const void*>& in, std::size_t count, int op) {
  for (std::size_t i = 0; i < count; ++i) {
    std::uint16_t raw;
    std::memcpy(&raw, static_cast<const char*>(in[0]) + 2 * i, 2);
    float acc = Load(raw);
    for (std::size_t k = 1; k < in.size(); ++k) {
      std::memcpy(&raw, static_cast<const char*>(in[k]) + 2 * i, 2);
      acc = Load(Store(combine(acc, Load(raw), op)));
    }
    if (op == ncclAvg) acc /= static_cast<float>(in.size());
    raw = Store(acc);
    std::memcpy(static_cast<char*>(out) + 2 * i, &raw, 2);
  }
}

// out[i] = in[0][i] (op) in[1][i] (op) ...; element by element, so out may alias one of the inputs.
void reduce(void* out, const std::vector<const void*>& in, std::size_t count, int dtype, int op) {
  switch (dtype) {
    case ncclInt8: return reduce_native<std::int8_t>(out, in, count, op);
    case ncclUint8: return reduce_native<std::uint8_t>(out, in, count, op);
    case ncclInt32: return reduce_native<std::int32_t>(out, in, count, op);
    case ncclUint32: return reduce_native<std::uint32_t>(out, in, count, op);
    case ncclInt64: return reduce_native<std::int64_t>(out, in, count, op);
    case ncclUint64: return reduce_native<std::uint64_t>(out, in, count, op);
    case ncclFloat32: return reduce_native<float>(out, in, count, op);
    case ncclFloat64: return reduce_native<double>(out, in, count, op);
    case ncclFloat16: return reduce_16bit<half_to_float, float_to_half>(out, in, count, op);
    case ncclBfloat16: return reduce_16bit<bf16_to_float, float_to_bf16>(out, in, count, op);
    default: return;  // rejected when the call was made
  }
}

// ------------------------------------------------------------------------------------------------
// Operations, transfers and the wire format

enum class Kind : std::uint16_t { p2p = 1, broadcast, reduce, all_reduce, reduce_scatter, all_gather, all_to_all };

std::string api_name(Kind k, bool send) {
  switch (k) {
    case Kind::p2p: return send ? "ncclSend" : "ncclRecv";
    case Kind::broadcast: return "ncclBroadcast";
    case Kind::reduce: return "ncclReduce";
    case Kind::all_reduce: return "ncclAllReduce";
    case Kind::reduce_scatter: return "ncclReduceScatter";
    case Kind::all_gather: return "ncclAllGather";
    case Kind::all_to_all: return "ncclAlltoAll";
  }
  return "ncclUnknown";
}

// What both ends of a transfer must agree on.
struct Signature {
  Kind kind = Kind::p2p;
  std::int32_t dtype = 0, root = -1, redop = -1;
  std::uint64_t count = 0;  // elements moved by this one transfer
  bool operator==(const Signature&) const = default;
};

std::string describe(const Signature& s, bool send) {
  std::string d = api_name(s.kind, send) + "(" + std::to_string(s.count) + " x " + dtype_name(s.dtype);
  if (s.root >= 0) d += ", root " + std::to_string(s.root);
  if (s.redop >= 0) d += ", " + redop_name(s.redop);
  return d + ")";
}

enum : std::uint16_t { kFrameCts = 1, kFrameData = 2 };
enum : std::uint32_t { kStatusOk = 0, kStatusMismatch = 1 };
constexpr std::uint32_t kFrameMagic = 0x7a4e436bu;

// Every message on a link starts with one of these. CTS ("clear to send"): the receiver's signature
// for its seq-th receive from this peer. DATA: the sender's signature, then count elements of payload
// unless status says the two did not match.
struct Frame {
  std::uint32_t magic = kFrameMagic;
  std::uint16_t type = 0;
  std::uint16_t kind = 0;
  std::int32_t dtype = 0, root = -1, redop = -1;
  std::uint32_t status = kStatusOk;
  std::uint64_t count = 0;
  std::uint64_t seq = 0;
};
static_assert(sizeof(Frame) == 40 && std::is_trivially_copyable_v<Frame>);

Frame make_frame(std::uint16_t type, const Signature& s, std::uint64_t seq) {
  Frame f;
  f.type = type;
  f.kind = static_cast<std::uint16_t>(s.kind);
  f.dtype = s.dtype;
  f.root = s.root;
  f.redop = s.redop;
  f.count = s.count;
  f.seq = seq;
  return f;
}

Signature signature_of(const Frame& f) {
  Signature s;
  s.kind = static_cast<Kind>(f.kind);
  s.dtype = f.dtype;
  s.root = f.root;
  s.redop = f.redop;
  s.count = f.count;
  return s;
}

struct Transfer {
  NcclCommState* comm = nullptr;
  std::size_t op = 0;  // index of its operation in the task
  int peer = -1;
  bool send = false;
  char* buf = nullptr;
  std::size_t bytes = 0;
  Signature sig;
  std::uint64_t seq = 0;    // its position among the transfers in its direction on its link
  std::size_t moved = 0;    // payload bytes written or read so far
  bool done = false;
  ncclResult_t result = ncclSuccess;
  std::string error;
};

struct Outgoing {
  Frame hdr;
  std::size_t hdr_sent = 0;
  const char* payload = nullptr;
  std::size_t payload_bytes = 0, payload_sent = 0;
  Transfer* owner = nullptr;  // a send, finished once the frame is fully written
};

// One end of the socket to one peer. Persistent across tasks: the peer's CTS frames for sends we
// have not issued yet wait here, and a frame may be half read when a task ends.
struct Link {
  int fd = -1;
  Frame in;
  std::size_t in_have = 0;
  Transfer* reading = nullptr;          // the receive whose payload is arriving
  std::deque<Frame> cts;                // the peer's receives not yet matched with our sends
  std::deque<Transfer*> wait_cts;       // our sends waiting for the peer's CTS, in order
  std::deque<Transfer*> recvs;          // our receives (CTS sent or queued) waiting for data, in order
  std::deque<Outgoing> out;
  std::uint64_t sends_issued = 0, recvs_issued = 0;
};

}  // namespace

struct NcclCommState {
  int rank = 0, nranks = 1, device = 0;
  std::string name;  // the unique id's nonce, in hex
  std::vector<Link> links;
  int listen_fd = -1;  // held for the communicator's life, so a second rank r of the id is refused

  std::mutex mu;
  std::condition_variable cv;
  std::uint64_t next_ticket = 0, serving = 0;  // tasks on this comm run in ticket (issue) order
  std::set<std::uint64_t> finished;
  ncclResult_t async_error = ncclSuccess;
  std::string async_message;
  bool ready = false;      // bootstrap done
  bool finalized = false;
  std::atomic<bool> broken{false};  // links shut down after a failure or ncclCommAbort
  std::atomic<bool> aborted{false};

  ~NcclCommState() {
    for (Link& l : links)
      if (l.fd >= 0) ::close(l.fd);
    if (listen_fd >= 0) ::close(listen_fd);
  }

  void shutdown_links() {
    broken = true;
    for (Link& l : links)
      if (l.fd >= 0) ::shutdown(l.fd, SHUT_RDWR);
  }

  void wait_turn(std::uint64_t t) {
    std::unique_lock lk(mu);
    cv.wait(lk, [&] { return serving == t; });
  }
  void finish_ticket(std::uint64_t t) {
    std::lock_guard lk(mu);
    finished.insert(t);
    while (finished.erase(serving)) ++serving;
    cv.notify_all();
  }
  void wait_idle() {
    std::unique_lock lk(mu);
    cv.wait(lk, [&] { return serving == next_ticket; });
  }
  void set_async_error(ncclResult_t code, const std::string& msg) {
    std::lock_guard lk(mu);
    if (async_error != ncclSuccess) return;
    async_error = code;
    async_message = msg;
  }
};

namespace {

// ------------------------------------------------------------------------------------------------
// Live communicators (so a destroyed or foreign handle is an error, not a crash)

std::mutex g_live_mu;
std::set<const ncclComm*> g_live;

bool is_live(const ncclComm* c) {
  std::lock_guard lk(g_live_mu);
  return g_live.count(c) != 0;
}

// ------------------------------------------------------------------------------------------------
// Unique id and bootstrap

constexpr char kIdMagic[8] = {'z', 'i', 'n', 'f', 'n', 'c', 'c', 'l'};
constexpr std::uint32_t kIdVersion = 1;
constexpr std::uint32_t kHelloMagic = 0x7a4e4948u;

struct IdBlob {
  char magic[8];
  std::uint32_t version;
  std::uint32_t reserved;
  unsigned char nonce[16];
};
static_assert(sizeof(IdBlob) <= sizeof(ncclUniqueId));

std::string hex(const unsigned char* p, std::size_t n) {
  static const char digits[] = "0123456789abcdef";
  std::string s;
  for (std::size_t i = 0; i < n; ++i) {
    s += digits[p[i] >> 4];
    s += digits[p[i] & 15];
  }
  return s;
}

bool parse_id(const ncclUniqueId& id, IdBlob& out) {
  std::memcpy(&out, id.internal, sizeof out);
  return std::memcmp(out.magic, kIdMagic, sizeof kIdMagic) == 0 && out.version == kIdVersion;
}

struct Hello {
  std::uint32_t magic = kHelloMagic;
  std::int32_t rank = 0, nranks = 0;
  std::int32_t status = 0;  // in the reply: 0 accepted, else why not
  unsigned char nonce[16] = {};
};
enum : std::int32_t { kHelloOk = 0, kHelloRanks = 1, kHelloBadRank = 2, kHelloForeign = 3 };

socklen_t socket_address(const std::string& nonce_hex, int rank, sockaddr_un& a) {
  const std::string name = "zinf-cudax-nccl-" + nonce_hex + "-" + std::to_string(rank);
  a = sockaddr_un{};
  a.sun_family = AF_UNIX;
  a.sun_path[0] = '\0';  // abstract namespace: nothing on disk, gone with the socket
  std::memcpy(a.sun_path + 1, name.data(), name.size());
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
}

bool wait_fd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    int ms = -1;
    if (deadline != Clock::time_point::max()) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return false;
      ms = static_cast<int>(std::min<long long>(left, 1000));
    }
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, ms);
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return true;  // let the read/write report it
  }
}

// Moves exactly n bytes over the non-blocking fd before the deadline. Returns "" or what went wrong.
std::string move_all(int fd, void* buf, std::size_t n, bool write, Clock::time_point deadline) {
  auto* p = static_cast<char*>(buf);
  std::size_t done = 0;
  while (done < n) {
    const ssize_t k = write ? ::send(fd, p + done, n - done, MSG_NOSIGNAL) : ::recv(fd, p + done, n - done, 0);
    if (k > 0) {
      done += static_cast<std::size_t>(k);
      continue;
    }
    if (k == 0) return "the peer closed the connection";
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return errno_text(errno);
    if (!wait_fd(fd, write ? POLLOUT : POLLIN, deadline)) return "timed out";
  }
  return "";
}

// Connects every pair of ranks. Rank r listens on its own name, connects to each lower rank (which
// answers at once), then accepts each higher rank; every wait goes toward lower ranks, so it cannot
// deadlock, and rank 0 only accepts.
ncclResult_t bootstrap(NcclCommState& c, const IdBlob& id) {
  const int r = c.rank, n = c.nranks;
  const std::string who = "ncclCommInitRank (rank " + std::to_string(r) + " of " + std::to_string(n) + "): ";
  c.links.assign(static_cast<std::size_t>(n), Link{});
  if (n == 1) return ncclSuccess;
  const double limit = timeout_s();
  const auto deadline = deadline_after(limit);
  const std::string limit_text = "ZINF_CUDAX_NCCL_TIMEOUT_S=" + std::to_string(static_cast<long long>(limit));

  const int lfd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (lfd < 0) return fail(ncclSystemError, who + "socket: " + errno_text(errno));
  struct Closer {  // closes the listener unless the bootstrap succeeds
    int fd;
    ~Closer() {
      if (fd >= 0) ::close(fd);
    }
  } closer{lfd};
  sockaddr_un addr;
  socklen_t len = socket_address(c.name, r, addr);
  if (::bind(lfd, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    if (errno == EADDRINUSE)
      return fail(ncclInvalidUsage, who + "another rank " + std::to_string(r) +
                                        " already uses this unique id (each rank must be unique, and an id serves one "
                                        "communicator)");
    return fail(ncclSystemError, who + "bind: " + errno_text(errno));
  }
  if (::listen(lfd, n) != 0) return fail(ncclSystemError, who + "listen: " + errno_text(errno));

  auto drop_links = [&] {
    for (Link& l : c.links)
      if (l.fd >= 0) {
        ::close(l.fd);
        l.fd = -1;
      }
  };

  // Lower ranks: connect, introduce ourselves, read the verdict.
  for (int p = 0; p < r; ++p) {
    sockaddr_un to;
    const socklen_t to_len = socket_address(c.name, p, to);
    int fd = -1;
    for (;;) {
      fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      if (fd < 0) {
        drop_links();
        return fail(ncclSystemError, who + "socket: " + errno_text(errno));
      }
      if (::connect(fd, reinterpret_cast<sockaddr*>(&to), to_len) == 0) break;
      const int e = errno;
      ::close(fd);
      fd = -1;
      if (e != ECONNREFUSED && e != ENOENT && e != EAGAIN && e != EINTR) {
        drop_links();
        return fail(ncclSystemError, who + "connect to rank " + std::to_string(p) + ": " + errno_text(e));
      }
      if (Clock::now() >= deadline) {
        drop_links();
        return fail(ncclSystemError, who + "timed out waiting for rank " + std::to_string(p) +
                                         " to call ncclCommInitRank with this unique id (" + limit_text + ")");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    c.links[static_cast<std::size_t>(p)].fd = fd;
    Hello h;
    h.rank = r;
    h.nranks = n;
    std::memcpy(h.nonce, id.nonce, sizeof h.nonce);
    std::string err = move_all(fd, &h, sizeof h, true, deadline);
    Hello reply;
    if (err.empty()) err = move_all(fd, &reply, sizeof reply, false, deadline);
    if (!err.empty()) {
      drop_links();
      return fail(ncclSystemError, who + "handshake with rank " + std::to_string(p) + ": " + err);
    }
    if (reply.magic != kHelloMagic || reply.status != kHelloOk) {
      drop_links();
      if (reply.status == kHelloRanks)
        return fail(ncclInvalidUsage, who + "rank " + std::to_string(p) + " was initialized with nranks " +
                                          std::to_string(reply.nranks) + ", this rank with " + std::to_string(n));
      return fail(ncclInvalidUsage, who + "rank " + std::to_string(p) + " refused the connection (status " +
                                        std::to_string(reply.status) + ")");
    }
  }

  // Higher ranks: accept, check, answer.
  for (int accepted = 0; accepted < n - 1 - r;) {
    if (!wait_fd(lfd, POLLIN, deadline)) {
      drop_links();
      return fail(ncclSystemError, who + "timed out: only " + std::to_string(accepted) + " of the " +
                                       std::to_string(n - 1 - r) +
                                       " higher ranks called ncclCommInitRank with this unique id (" + limit_text +
                                       ")");
    }
    const int fd = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) continue;
      drop_links();
      return fail(ncclSystemError, who + "accept: " + errno_text(errno));
    }
    Hello h;
    std::string err = move_all(fd, &h, sizeof h, false, deadline);
    if (!err.empty()) {  // a connection that died before introducing itself: not a rank of ours
      ::close(fd);
      continue;
    }
    Hello reply;
    reply.rank = r;
    reply.nranks = n;
    std::memcpy(reply.nonce, id.nonce, sizeof reply.nonce);
    if (h.magic != kHelloMagic || std::memcmp(h.nonce, id.nonce, sizeof h.nonce) != 0)
      reply.status = kHelloForeign;
    else if (h.nranks != n)
      reply.status = kHelloRanks;
    else if (h.rank <= r || h.rank >= n || c.links[static_cast<std::size_t>(h.rank)].fd >= 0)
      reply.status = kHelloBadRank;
    (void)move_all(fd, &reply, sizeof reply, true, deadline);
    if (reply.status != kHelloOk) {
      ::close(fd);
      drop_links();
      if (reply.status == kHelloRanks)
        return fail(ncclInvalidUsage, who + "rank " + std::to_string(h.rank) + " was initialized with nranks " +
                                          std::to_string(h.nranks) + ", this rank with " + std::to_string(n));
      if (reply.status == kHelloBadRank)
        return fail(ncclInvalidUsage, who + "rank " + std::to_string(h.rank) +
                                          " joined twice or is out of range (each rank must be unique)");
      return fail(ncclInternalError, who + "a connection from outside this communicator");
    }
    c.links[static_cast<std::size_t>(h.rank)].fd = fd;
    ++accepted;
  }
  c.listen_fd = lfd;
  closer.fd = -1;
  return ncclSuccess;
}

// ------------------------------------------------------------------------------------------------
// Groups and tasks

struct OpDesc {
  Kind kind = Kind::p2p;
  bool send = false;  // p2p direction
  const void* sendbuff = nullptr;
  void* recvbuff = nullptr;
  std::size_t count = 0;
  int dtype = 0;
  int redop = -1;
  int peer = -1;  // p2p peer, or the root of broadcast/reduce
  std::shared_ptr<NcclCommState> comm;
  cudaStream_t stream = nullptr;
};

struct PendingInit {
  ncclComm* handle;
  IdBlob id;
};

struct GroupState {
  int depth = 0;
  std::vector<OpDesc> ops;
  std::vector<PendingInit> inits;
  ncclResult_t error = ncclSuccess;
  std::string error_text;
};
thread_local GroupState g_group;

std::mutex g_issue_mu;  // tickets of one task are taken together, so tasks order the same on every comm

// One issued group: its operations, a ticket on each communicator it touches, and the join of the
// streams it was enqueued on.
class Task {
 public:
  std::vector<OpDesc> ops;
  std::vector<std::shared_ptr<NcclCommState>> comms;
  std::vector<std::uint64_t> tickets;
  int expected = 0;  // streams it is enqueued on
  ncclResult_t outcome = ncclSuccess;  // the first failure, once run

  ~Task() {
    if (!ran_)  // never run (its stream dropped the work): let later work on its comms go on
      for (std::size_t i = 0; i < comms.size(); ++i) comms[i]->finish_ticket(tickets[i]);
  }

  // Called on each stream's worker; the last to arrive runs the task, the others wait for it.
  cudaError_t join() {
    std::unique_lock lk(mu_);
    ++arrived_;
    cv_.notify_all();
    cv_.wait(lk, [&] { return arrived_ == expected; });
    if (!claimed_) {
      claimed_ = true;
      lk.unlock();
      const cudaError_t r = run();
      lk.lock();
      result_ = r;
      finished_ = true;
      cv_.notify_all();
      return r;
    }
    cv_.wait(lk, [&] { return finished_; });
    return result_;
  }
  void drop() {  // a stream that will never run its part
    std::lock_guard lk(mu_);
    ++arrived_;
    cv_.notify_all();
  }

 private:
  cudaError_t run();
  cudaError_t execute();

  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  bool claimed_ = false, finished_ = false, ran_ = false;
  cudaError_t result_ = cudaSuccess;
};

struct Arrival {
  std::shared_ptr<Task> task;
  bool arrived = false;
  ~Arrival() {
    if (!arrived) task->drop();
  }
};

cudaError_t Task::run() {
  ran_ = true;
  for (std::size_t i = 0; i < comms.size(); ++i) comms[i]->wait_turn(tickets[i]);
  const cudaError_t r = execute();
  for (std::size_t i = 0; i < comms.size(); ++i) comms[i]->finish_ticket(tickets[i]);
  return r;
}

constexpr std::size_t kChunk = std::size_t{4} << 20;  // most bytes one send/recv call moves

struct OpRun {
  bool failed = false;
  ncclResult_t code = ncclSuccess;
  std::string error;
  std::vector<std::vector<unsigned char>> scratch;  // peers' contributions to a reduction
  std::function<void()> post;                      // runs once every transfer of the op is done
  void fail_with(ncclResult_t c, const std::string& e) {
    if (failed) return;
    failed = true;
    code = c;
    error = e;
  }
};

std::string rank_text(const NcclCommState& c) {
  return "rank " + std::to_string(c.rank) + " of " + std::to_string(c.nranks);
}

std::string mismatch_text(const NcclCommState& c, int peer, const Signature& sent, const Signature& expected,
                          bool we_send) {
  const std::string me = rank_text(c), them = "rank " + std::to_string(peer);
  if (we_send)
    return me + ": " + describe(sent, true) + " to " + them + " does not match its " + describe(expected, false) +
           " (both sides must use the same count and datatype, and the same collective)";
  return me + ": " + describe(expected, false) + " from " + them + " does not match its " + describe(sent, true) +
         " (both sides must use the same count and datatype, and the same collective)";
}

cudaError_t Task::execute() {
  std::vector<OpRun> runs(ops.size());
  std::deque<Transfer> xfers;  // stable addresses
  struct Self {
    std::deque<Transfer*> sends, recvs;
  };
  std::vector<std::pair<NcclCommState*, Self>> selves;

  auto add = [&](std::size_t op, int peer, bool send, const void* buf, std::size_t bytes, const Signature& sig) {
    Transfer t;
    t.comm = ops[op].comm.get();
    t.op = op;
    t.peer = peer;
    t.send = send;
    t.buf = const_cast<char*>(static_cast<const char*>(buf));
    t.bytes = bytes;
    t.sig = sig;
    xfers.push_back(std::move(t));
  };

  // Lower each operation into transfers (and local copies / a reduction afterwards).
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const OpDesc& o = ops[i];
    NcclCommState& c = *o.comm;
    OpRun& run_i = runs[i];
    {
      std::lock_guard lk(c.mu);
      if (c.async_error != ncclSuccess) {
        run_i.fail_with(c.async_error, rank_text(c) + ": " + api_name(o.kind, o.send) +
                                           " on a communicator that failed earlier: " + c.async_message);
        continue;
      }
    }
    if (c.aborted) {
      run_i.fail_with(ncclInvalidUsage, rank_text(c) + ": " + api_name(o.kind, o.send) + " on an aborted communicator");
      continue;
    }
    const int me = c.rank, n = c.nranks;
    const std::size_t es = dtype_size(o.dtype), bytes = o.count * es;
    const auto* sb = static_cast<const char*>(o.sendbuff);
    auto* rb = static_cast<char*>(o.recvbuff);
    Signature sig;
    sig.kind = o.kind;
    sig.dtype = o.dtype;
    sig.count = o.count;
    auto at = [](int k, std::size_t b) { return static_cast<std::size_t>(k) * b; };
    switch (o.kind) {
      case Kind::p2p:
        add(i, o.peer, o.send, o.send ? o.sendbuff : o.recvbuff, bytes, sig);
        break;
      case Kind::broadcast:
        sig.root = o.peer;
        if (me == o.peer) {
          if (sb != rb) std::memmove(rb, sb, bytes);
          for (int p = 0; p < n; ++p)
            if (p != me) add(i, p, true, sb, bytes, sig);
        } else {
          add(i, o.peer, false, rb, bytes, sig);
        }
        break;
      case Kind::reduce:
        sig.root = o.peer;
        sig.redop = o.redop;
        if (me == o.peer) {
          run_i.scratch.resize(static_cast<std::size_t>(n));
          for (int p = 0; p < n; ++p)
            if (p != me) {
              run_i.scratch[static_cast<std::size_t>(p)].resize(bytes);
              add(i, p, false, run_i.scratch[static_cast<std::size_t>(p)].data(), bytes, sig);
            }
          run_i.post = [&run_i, sb, rb, me, n, o] {
            std::vector<const void*> in;
            for (int p = 0; p < n; ++p) in.push_back(p == me ? static_cast<const void*>(sb) : run_i.scratch[static_cast<std::size_t>(p)].data());
            reduce(rb, in, o.count, o.dtype, o.redop);
          };
        } else {
          add(i, o.peer, true, sb, bytes, sig);
        }
        break;
      case Kind::all_reduce:
      case Kind::reduce_scatter: {
        const bool rs = o.kind == Kind::reduce_scatter;
        sig.redop = o.redop;
        run_i.scratch.resize(static_cast<std::size_t>(n));
        for (int p = 0; p < n; ++p)
          if (p != me) {
            run_i.scratch[static_cast<std::size_t>(p)].resize(bytes);
            add(i, p, true, rs ? sb + at(p, bytes) : sb, bytes, sig);
            add(i, p, false, run_i.scratch[static_cast<std::size_t>(p)].data(), bytes, sig);
          }
        const char* mine = rs ? sb + at(me, bytes) : sb;
        run_i.post = [&run_i, mine, rb, me, n, o] {
          std::vector<const void*> in;
          for (int p = 0; p < n; ++p) in.push_back(p == me ? static_cast<const void*>(mine) : run_i.scratch[static_cast<std::size_t>(p)].data());
          reduce(rb, in, o.count, o.dtype, o.redop);
        };
        break;
      }
      case Kind::all_gather:
        if (sb != rb + at(me, bytes)) std::memmove(rb + at(me, bytes), sb, bytes);
        for (int p = 0; p < n; ++p)
          if (p != me) {
            add(i, p, true, sb, bytes, sig);
            add(i, p, false, rb + at(p, bytes), bytes, sig);
          }
        break;
      case Kind::all_to_all:
        if (sb != rb) std::memmove(rb + at(me, bytes), sb + at(me, bytes), bytes);
        for (int p = 0; p < n; ++p)
          if (p != me) {
            add(i, p, true, sb + at(p, bytes), bytes, sig);
            add(i, p, false, rb + at(p, bytes), bytes, sig);
          }
        break;
    }
  }

  // Post the transfers on their links; pair transfers with oneself locally.
  std::vector<std::pair<NcclCommState*, int>> active;  // links with work in this task
  std::size_t pending = 0;
  for (Transfer& t : xfers) {
    NcclCommState& c = *t.comm;
    if (t.peer == c.rank) {
      auto it = std::find_if(selves.begin(), selves.end(), [&](auto& s) { return s.first == &c; });
      if (it == selves.end()) it = selves.insert(selves.end(), {&c, Self{}});
      (t.send ? it->second.sends : it->second.recvs).push_back(&t);
      continue;
    }
    Link& l = c.links[static_cast<std::size_t>(t.peer)];
    if (std::find(active.begin(), active.end(), std::make_pair(&c, t.peer)) == active.end())
      active.emplace_back(&c, t.peer);
    ++pending;
    if (t.send) {
      t.seq = l.sends_issued++;
      l.wait_cts.push_back(&t);
    } else {
      t.seq = l.recvs_issued++;
      l.recvs.push_back(&t);
      Outgoing cts;
      cts.hdr = make_frame(kFrameCts, t.sig, t.seq);
      l.out.push_back(cts);
    }
  }
  for (auto& [cp, s] : selves) {
    const std::size_t k = std::max(s.sends.size(), s.recvs.size());
    for (std::size_t j = 0; j < k; ++j) {
      Transfer* snd = j < s.sends.size() ? s.sends[j] : nullptr;
      Transfer* rcv = j < s.recvs.size() ? s.recvs[j] : nullptr;
      std::string err;
      if (!snd || !rcv)
        err = rank_text(*cp) + ": " + describe((snd ? snd : rcv)->sig, snd != nullptr) +
              " with itself has no matching " + (snd ? "ncclRecv" : "ncclSend") +
              " in the same group (a rank's send to itself must be grouped with its receive)";
      else if (!(snd->sig == rcv->sig))
        err = mismatch_text(*cp, cp->rank, snd->sig, rcv->sig, true);
      if (err.empty()) {
        std::memmove(rcv->buf, snd->buf, snd->bytes);
      } else {
        for (Transfer* t : {snd, rcv})
          if (t) runs[t->op].fail_with(ncclInvalidUsage, err);
      }
    }
  }

  std::vector<NcclCommState*> dead;  // comms whose links failed in this task
  auto complete = [&](Transfer& t) {
    if (t.done) return;
    t.done = true;
    --pending;
    if (t.result != ncclSuccess) runs[t.op].fail_with(t.result, t.error);
  };
  // A broken link: every unfinished transfer on the comm fails; the comm is finished for this task.
  auto kill = [&](NcclCommState& c, ncclResult_t code, const std::string& why) {
    if (std::find(dead.begin(), dead.end(), &c) != dead.end()) return;
    dead.push_back(&c);
    for (Transfer& t : xfers)
      if (t.comm == &c && !t.done && t.peer != c.rank) {
        t.result = code;
        t.error = why;
        complete(t);
      }
    for (Link& l : c.links) {
      l.wait_cts.clear();
      l.recvs.clear();
      l.out.clear();
      l.cts.clear();
      l.reading = nullptr;
      l.in_have = 0;
    }
  };
  auto link_error = [&](NcclCommState& c, int peer, const std::string& what) {
    if (c.aborted) return kill(c, ncclInvalidUsage, rank_text(c) + ": the communicator was aborted");
    kill(c, ncclRemoteError,
         rank_text(c) + ": the connection to rank " + std::to_string(peer) + " failed: " + what +
             " (the peer exited, aborted, or failed an earlier operation)");
  };

  for (NcclCommState* c : [&] {
         std::vector<NcclCommState*> v;
         for (auto& [cp, p] : active)
           if (std::find(v.begin(), v.end(), cp) == v.end()) v.push_back(cp);
         return v;
       }())
    if (c->broken)
      kill(*c, c->aborted ? ncclInvalidUsage : ncclRemoteError,
           rank_text(*c) + (c->aborted ? ": the communicator was aborted"
                                       : ": the communicator's connections were closed after an earlier failure"));

  // One step of I/O on a link until it would block. Returns whether anything moved.
  auto pump = [&](NcclCommState& c, int peer) -> bool {
    Link& l = c.links[static_cast<std::size_t>(peer)];
    bool moved = false;
    for (bool again = true; again;) {
      again = false;
      if (std::find(dead.begin(), dead.end(), &c) != dead.end()) return moved;
      // Match the peer's CTS frames with our waiting sends.
      while (!l.wait_cts.empty() && !l.cts.empty()) {
        Transfer& t = *l.wait_cts.front();
        const Frame f = l.cts.front();
        l.wait_cts.pop_front();
        l.cts.pop_front();
        if (f.seq != t.seq) {
          kill(c, ncclInternalError, rank_text(c) + ": link to rank " + std::to_string(peer) + " out of step");
          return true;
        }
        Outgoing o;
        o.hdr = make_frame(kFrameData, t.sig, t.seq);
        o.owner = &t;
        const Signature want = signature_of(f);
        if (want == t.sig) {
          o.payload = t.buf;
          o.payload_bytes = t.bytes;
        } else {
          o.hdr.status = kStatusMismatch;
          t.result = ncclInvalidUsage;
          t.error = mismatch_text(c, peer, t.sig, want, true);
        }
        l.out.push_back(o);
        again = moved = true;
      }
      // Write.
      while (!l.out.empty()) {
        Outgoing& o = l.out.front();
        const char* src;
        std::size_t left;
        if (o.hdr_sent < sizeof(Frame)) {
          src = reinterpret_cast<const char*>(&o.hdr) + o.hdr_sent;
          left = sizeof(Frame) - o.hdr_sent;
        } else {
          src = o.payload + o.payload_sent;
          left = o.payload_bytes - o.payload_sent;
        }
        if (left == 0) {
          if (o.owner) complete(*o.owner);
          l.out.pop_front();
          moved = true;
          continue;
        }
        const ssize_t k = ::send(l.fd, src, std::min(left, kChunk), MSG_NOSIGNAL);
        if (k > 0) {
          (o.hdr_sent < sizeof(Frame) ? o.hdr_sent : o.payload_sent) += static_cast<std::size_t>(k);
          moved = true;
          continue;
        }
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        link_error(c, peer, k == 0 ? "nothing written" : errno_text(errno));
        return true;
      }
      // Read, when something of ours waits on the peer.
      while (l.reading || l.in_have > 0 || !l.recvs.empty() || !l.wait_cts.empty()) {
        ssize_t k;
        if (l.reading) {
          Transfer& t = *l.reading;
          k = ::recv(l.fd, t.buf + t.moved, std::min(t.bytes - t.moved, kChunk), 0);
          if (k > 0) {
            t.moved += static_cast<std::size_t>(k);
            moved = true;
            if (t.moved == t.bytes) {
              l.reading = nullptr;
              complete(t);
            }
            continue;
          }
        } else {
          k = ::recv(l.fd, reinterpret_cast<char*>(&l.in) + l.in_have, sizeof(Frame) - l.in_have, 0);
          if (k > 0) {
            moved = true;
            l.in_have += static_cast<std::size_t>(k);
            if (l.in_have < sizeof(Frame)) continue;
            l.in_have = 0;
            const Frame f = l.in;
            if (f.magic != kFrameMagic || (f.type != kFrameCts && f.type != kFrameData)) {
              kill(c, ncclInternalError, rank_text(c) + ": garbage on the link to rank " + std::to_string(peer));
              return true;
            }
            if (f.type == kFrameCts) {
              l.cts.push_back(f);
              again = true;  // a send may be waiting for it
              continue;
            }
            if (l.recvs.empty() || l.recvs.front()->seq != f.seq) {
              kill(c, ncclInternalError,
                   rank_text(c) + ": unexpected data from rank " + std::to_string(peer) + " (link out of step)");
              return true;
            }
            Transfer& t = *l.recvs.front();
            l.recvs.pop_front();
            const Signature got = signature_of(f);
            if (f.status != kStatusOk || !(got == t.sig)) {
              t.result = ncclInvalidUsage;
              t.error = mismatch_text(c, peer, got, t.sig, false);
              complete(t);
            } else if (t.bytes == 0) {
              complete(t);
            } else {
              l.reading = &t;
            }
            continue;
          }
        }
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        link_error(c, peer, k == 0 ? "the peer closed the connection" : errno_text(errno));
        return true;
      }
    }
    return moved;
  };

  const double limit = timeout_s();
  auto last_progress = Clock::now();
  bool warned = false;
  std::vector<pollfd> fds;
  while (pending > 0) {
    bool moved = false;
    for (auto& [cp, peer] : active) moved |= pump(*cp, peer);
    if (pending == 0) break;
    const auto now = Clock::now();
    if (moved) {
      last_progress = now;
      continue;
    }
    const double idle = std::chrono::duration<double>(now - last_progress).count();
    if ((!warned && idle >= 60.0) || (limit > 0 && idle >= limit)) {
      std::string waiting;
      for (const Transfer& t : xfers)
        if (!t.done && std::find(dead.begin(), dead.end(), t.comm) == dead.end())
          waiting += (waiting.empty() ? "" : ", ") + rank_text(*t.comm) + " " + describe(t.sig, t.send) +
                     (t.send ? " to rank " : " from rank ") + std::to_string(t.peer);
      if (limit > 0 && idle >= limit) {
        for (auto& [cp, peer] : active)
          kill(*cp, ncclSystemError,
               rank_text(*cp) + ": timed out after " + std::to_string(static_cast<long long>(idle)) +
                   " s without progress waiting for " + waiting + " (ZINF_CUDAX_NCCL_TIMEOUT_S)");
        break;
      }
      warned = true;
      report("still waiting after 60 s for " + waiting + " (the peer has not issued the matching call?)");
    }
    fds.clear();
    for (auto& [cp, peer] : active) {
      if (std::find(dead.begin(), dead.end(), cp) != dead.end()) continue;
      const Link& l = cp->links[static_cast<std::size_t>(peer)];
      short ev = 0;
      if (l.reading || l.in_have > 0 || !l.recvs.empty() || !l.wait_cts.empty()) ev |= POLLIN;
      if (!l.out.empty()) ev |= POLLOUT;
      if (ev) fds.push_back(pollfd{l.fd, ev, 0});
    }
    if (fds.empty()) break;  // cannot happen while transfers are pending; never spin
    if (::poll(fds.data(), fds.size(), 1000) < 0 && errno != EINTR) {
      for (auto& [cp, peer] : active) kill(*cp, ncclSystemError, rank_text(*cp) + ": poll: " + errno_text(errno));
      break;
    }
  }
  for (Transfer& t : xfers)  // only left when the loop above gave up
    if (!t.done && t.peer != t.comm->rank) {
      t.result = ncclInternalError;
      t.error = rank_text(*t.comm) + ": transfer abandoned";
      complete(t);
    }

  bool any_failed = false;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    OpRun& r = runs[i];
    if (!r.failed && r.post) r.post();
    if (!r.failed) continue;
    any_failed = true;
    NcclCommState& c = *ops[i].comm;
    if (outcome == ncclSuccess) outcome = r.code;
    t_last_error = r.error;  // the caller's own, when the stream runs work on the calling thread
    set_async_error_text(r.error);
    if (r.error.find("failed earlier") == std::string::npos) report(r.error);
    c.set_async_error(r.code, r.error);
  }
  for (auto& cp : comms) {
    std::lock_guard lk(cp->mu);
    if (cp->async_error != ncclSuccess && !cp->broken) {
      // Close the links so that peers waiting on this rank fail too instead of hanging. What was
      // written stays readable by the peer.
      for (Link& l : cp->links)
        if (l.fd >= 0) ::shutdown(l.fd, SHUT_RDWR);
      cp->broken = true;
    }
  }
  return any_failed ? cudaErrorUnknown : cudaSuccess;
}

bool is_inline_stream(cudaStream_t s) { return reinterpret_cast<std::uintptr_t>(s) <= 2; }

// Issues one group's operations as one task on every stream they name.
ncclResult_t launch(std::vector<OpDesc> ops) {
  if (ops.empty()) return ncclSuccess;
  auto task = std::make_shared<Task>();
  task->ops = std::move(ops);
  std::vector<cudaStream_t> streams;
  for (const OpDesc& o : task->ops) {
    if (std::find(task->comms.begin(), task->comms.end(), o.comm) == task->comms.end()) task->comms.push_back(o.comm);
    if (std::find(streams.begin(), streams.end(), o.stream) == streams.end()) streams.push_back(o.stream);
  }
  // Streams that run work on the calling thread go last, so that the others are already queued.
  std::stable_partition(streams.begin(), streams.end(), [](cudaStream_t s) { return !is_inline_stream(s); });
  {
    std::lock_guard lk(g_issue_mu);
    for (auto& c : task->comms) {
      std::lock_guard clk(c->mu);
      task->tickets.push_back(c->next_ticket++);
    }
  }
  task->expected = static_cast<int>(streams.size());
  ncclResult_t result = ncclSuccess;
  for (cudaStream_t s : streams) {
    auto arrival = std::make_shared<Arrival>();
    arrival->task = task;
    const cudaError_t e = enqueue(s, [arrival]() {
      arrival->arrived = true;
      return arrival->task->join();
    });
    if (e == cudaSuccess || result != ncclSuccess) continue;
    if (arrival->arrived)  // it ran here (a stream that runs work on the calling thread) and failed
      result = task->outcome != ncclSuccess ? task->outcome : ncclUnhandledCudaError;
    else
      result = fail(ncclUnhandledCudaError, std::string("cannot enqueue NCCL work on stream ") +
                                                std::to_string(reinterpret_cast<std::uintptr_t>(s)) + ": " +
                                                cudaGetErrorString(e) +
                                                (is_inline_stream(s) ? "" : " (destroyed stream, or an earlier failure)"));
  }
  return result;
}

// Records a failure of a call made inside a group, so that ncclGroupEnd fails and issues nothing.
ncclResult_t call_error(ncclResult_t code, const std::string& msg) {
  fail(code, msg);
  if (g_group.depth > 0 && g_group.error == ncclSuccess) {
    g_group.error = code;
    g_group.error_text = msg;
  }
  return code;
}

ncclResult_t submit(OpDesc op) {
  if (g_group.depth > 0) {
    if (!g_group.inits.empty())
      return call_error(ncclInvalidUsage, api_name(op.kind, op.send) +
                                              ": a group may not mix ncclCommInitRank with communication calls");
    g_group.ops.push_back(std::move(op));
    return ncclSuccess;
  }
  std::vector<OpDesc> v;
  v.push_back(std::move(op));
  return launch(std::move(v));
}

// Checks what every communication call shares; fills op.comm.
ncclResult_t check_call(const std::string& api, ncclComm_t comm, int dtype, std::size_t count, OpDesc& op) {
  if (!comm) return call_error(ncclInvalidArgument, api + ": comm is NULL");
  if (!is_live(comm)) return call_error(ncclInvalidArgument, api + ": comm is not a live communicator (destroyed?)");
  op.comm = comm->state;
  NcclCommState& c = *op.comm;
  {
    std::lock_guard lk(c.mu);
    if (!c.ready)
      return call_error(ncclInvalidUsage, api + ": the communicator is not initialized (its ncclCommInitRank is "
                                                "still pending in a group, or failed)");
    if (c.finalized) return call_error(ncclInvalidUsage, api + ": the communicator was finalized");
    if (c.async_error != ncclSuccess)
      return call_error(c.async_error, api + ": the communicator failed earlier: " + c.async_message);
  }
  if (dtype_size(dtype) == 0) return call_error(ncclInvalidArgument, api + ": invalid " + dtype_name(dtype));
  if (count > SIZE_MAX / (dtype_size(dtype) * static_cast<std::size_t>(c.nranks)))
    return call_error(ncclInvalidArgument, api + ": count " + std::to_string(count) + " is too large");
  op.dtype = dtype;
  op.count = count;
  return ncclSuccess;
}

ncclResult_t check_rank(const std::string& api, const char* what, int r, const NcclCommState& c) {
  if (r >= 0 && r < c.nranks) return ncclSuccess;
  return call_error(ncclInvalidArgument, api + ": " + what + " " + std::to_string(r) + " is not a rank of this " +
                                             std::to_string(c.nranks) + "-rank communicator");
}

ncclResult_t check_redop(const std::string& api, int redop, int dtype) {
  if (redop < 0 || redop >= ncclNumOps)
    return call_error(ncclInvalidArgument, api + ": unsupported " + redop_name(redop) +
                                               " (only the built-in operations; ncclRedOpCreatePreMulSum is not faked)");
  if (dtype == ncclFloat8e4m3 || dtype == ncclFloat8e5m2)
    return call_error(ncclInvalidArgument, api + ": reductions on " + dtype_name(dtype) + " are not supported here");
  return ncclSuccess;
}

ncclResult_t check_buffer(const std::string& api, const char* what, const void* p, std::size_t bytes) {
  if (bytes == 0) return ncclSuccess;
  if (!p) return call_error(ncclInvalidArgument, api + ": " + what + " is NULL");
  if (is_device_range(p, bytes)) return ncclSuccess;
  const MemRange r = where(p);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%p", p);
  return call_error(ncclInvalidArgument, api + ": " + what + " " + buf + " (" + std::to_string(bytes) +
                                             " bytes) is not inside one device allocation (it is " +
                                             to_string(r.kind) + " memory" +
                                             (r.kind == MemKind::device ? ", and the allocation is too small" : "") +
                                             ")");
}

// The body of every collective: check, then issue (zero counts do nothing).
ncclResult_t collective(Kind kind, const void* sendbuff, void* recvbuff, std::size_t count, int dtype, int redop,
                        int root, ncclComm_t comm, cudaStream_t stream) {
  const std::string api = api_name(kind, false);
  OpDesc op;
  op.kind = kind;
  ncclResult_t r = check_call(api, comm, dtype, count, op);
  if (r != ncclSuccess) return r;
  const NcclCommState& c = *op.comm;
  const std::size_t bytes = count * dtype_size(dtype), all = bytes * static_cast<std::size_t>(c.nranks);
  const bool rooted = kind == Kind::broadcast || kind == Kind::reduce;
  if (rooted && (r = check_rank(api, "root", root, c)) != ncclSuccess) return r;
  if (kind == Kind::reduce || kind == Kind::all_reduce || kind == Kind::reduce_scatter)
    if ((r = check_redop(api, redop, dtype)) != ncclSuccess) return r;
  std::size_t send_bytes = bytes, recv_bytes = bytes;
  switch (kind) {
    case Kind::broadcast: send_bytes = c.rank == root ? bytes : 0; break;
    case Kind::reduce: recv_bytes = c.rank == root ? bytes : 0; break;
    case Kind::reduce_scatter: send_bytes = all; break;
    case Kind::all_gather: recv_bytes = all; break;
    case Kind::all_to_all: send_bytes = recv_bytes = all; break;
    default: break;
  }
  if ((r = check_buffer(api, "sendbuff", sendbuff, send_bytes)) != ncclSuccess) return r;
  if ((r = check_buffer(api, "recvbuff", recvbuff, recv_bytes)) != ncclSuccess) return r;
  if (count == 0) return ncclSuccess;
  op.sendbuff = sendbuff;
  op.recvbuff = recvbuff;
  op.redop = redop;
  op.peer = root;
  op.stream = stream;
  return submit(std::move(op));
}

ncclResult_t p2p(bool send, const void* buf, std::size_t count, int dtype, int peer, ncclComm_t comm,
                 cudaStream_t stream) {
  const std::string api = api_name(Kind::p2p, send);
  OpDesc op;
  op.kind = Kind::p2p;
  op.send = send;
  ncclResult_t r = check_call(api, comm, dtype, count, op);
  if (r != ncclSuccess) return r;
  if ((r = check_rank(api, "peer", peer, *op.comm)) != ncclSuccess) return r;
  if ((r = check_buffer(api, send ? "sendbuff" : "recvbuff", buf, count * dtype_size(dtype))) != ncclSuccess) return r;
  if (count == 0) return ncclSuccess;
  if (send)
    op.sendbuff = buf;
  else
    op.recvbuff = const_cast<void*>(buf);
  op.peer = peer;
  op.stream = stream;
  return submit(std::move(op));
}

// Creates the handle; the bootstrap happens now or at the group's end.
ncclResult_t init_rank(ncclComm_t* comm, int nranks, const ncclUniqueId& id, int rank, const char* api) {
  const std::string who = api;
  if (!comm) return call_error(ncclInvalidArgument, who + ": comm is NULL");
  if (nranks < 1) return call_error(ncclInvalidArgument, who + ": nranks " + std::to_string(nranks) + " < 1");
  if (rank < 0 || rank >= nranks)
    return call_error(ncclInvalidArgument,
                      who + ": rank " + std::to_string(rank) + " is not in [0, " + std::to_string(nranks) + ")");
  IdBlob blob;
  if (!parse_id(id, blob))
    return call_error(ncclInvalidArgument, who + ": the unique id was not made by ncclGetUniqueId");
  if (g_group.depth > 0 && !g_group.ops.empty())
    return call_error(ncclInvalidUsage, who + ": a group may not mix ncclCommInitRank with communication calls");
  auto* h = new ncclComm;
  h->state = std::make_shared<NcclCommState>();
  h->state->rank = rank;
  h->state->nranks = nranks;
  h->state->name = hex(blob.nonce, sizeof blob.nonce);
  int dev = 0;
  if (cudaGetDevice(&dev) == cudaSuccess) h->state->device = dev;
  {
    std::lock_guard lk(g_live_mu);
    g_live.insert(h);
  }
  *comm = h;
  if (g_group.depth > 0) {
    g_group.inits.push_back(PendingInit{h, blob});
    return ncclSuccess;
  }
  const ncclResult_t r = bootstrap(*h->state, blob);
  if (r != ncclSuccess) {
    {
      std::lock_guard lk(g_live_mu);
      g_live.erase(h);
    }
    delete h;
    *comm = nullptr;
    return r;
  }
  std::lock_guard lk(h->state->mu);
  h->state->ready = true;
  return ncclSuccess;
}

// Bootstraps the communicators a group created, concurrently (one thread may create every rank).
ncclResult_t finish_inits(std::vector<PendingInit> inits) {
  std::vector<ncclResult_t> results(inits.size(), ncclSuccess);
  auto one = [&](std::size_t i) {
    NcclCommState& s = *inits[i].handle->state;
    results[i] = bootstrap(s, inits[i].id);
    std::lock_guard lk(s.mu);
    if (results[i] == ncclSuccess)
      s.ready = true;
    else {
      s.async_error = results[i];
      s.async_message = "ncclCommInitRank failed";
    }
  };
  if (inits.size() == 1) {
    one(0);
  } else {
    std::vector<std::thread> threads;
    for (std::size_t i = 0; i < inits.size(); ++i) threads.emplace_back(one, i);
    for (auto& t : threads) t.join();
  }
  for (ncclResult_t r : results)
    if (r != ncclSuccess) return r;
  return ncclSuccess;
}

ncclResult_t live_comm(ncclComm_t comm, const char* api) {
  if (!comm) return fail(ncclInvalidArgument, std::string(api) + ": comm is NULL");
  if (!is_live(comm)) return fail(ncclInvalidArgument, std::string(api) + ": comm is not a live communicator");
  return ncclSuccess;
}

bool pending_in_this_group(const ncclComm* comm) {
  return std::any_of(g_group.inits.begin(), g_group.inits.end(), [&](const PendingInit& p) { return p.handle == comm; });
}

}  // namespace
}  // namespace zinf::cudax

// ------------------------------------------------------------------------------------------------
// The API (C linkage, from <nccl.h>)

using namespace zinf::cudax;

ncclResult_t ncclGetVersion(int* version) {
  if (!version) return fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (a CUDA call failed)";
    case ncclSystemError: return "unhandled system error (a system call failed or timed out)";
    case ncclInternalError: return "internal error (a bug in the NCCL fake, or memory corruption)";
    case ncclInvalidArgument: return "invalid argument (a bad pointer, rank, count, type or operation)";
    case ncclInvalidUsage: return "invalid usage (NCCL used against its rules; see ncclGetLastError)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t comm) {
  thread_local std::string text;
  if (comm && is_live(comm)) {
    NcclCommState& s = *comm->state;
    std::lock_guard lk(s.mu);
    if (s.async_error != ncclSuccess) {
      text = s.async_message;
      return text.c_str();
    }
  }
  if (!t_last_error.empty()) return t_last_error.c_str();
  std::lock_guard lk(g_error_mu);
  text = g_last_async_error;
  return text.c_str();
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  if (!uniqueId) return fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
  IdBlob b{};
  std::memcpy(b.magic, kIdMagic, sizeof kIdMagic);
  b.version = kIdVersion;
  std::random_device rd;
  std::seed_seq seq{rd(), rd(), rd(), rd(), static_cast<unsigned>(::getpid()),
                    static_cast<unsigned>(Clock::now().time_since_epoch().count())};
  std::vector<std::uint32_t> words(4);
  seq.generate(words.begin(), words.end());
  std::memcpy(b.nonce, words.data(), sizeof b.nonce);
  *uniqueId = ncclUniqueId{};
  std::memcpy(uniqueId->internal, &b, sizeof b);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return init_rank(comm, nranks, commId, rank, "ncclCommInitRank");
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config) {
  if (config && config->magic != 0xcafebeef)
    return call_error(ncclInvalidArgument,
                      "ncclCommInitRankConfig: config was not initialized with NCCL_CONFIG_INITIALIZER");
  // Every option only tunes performance, and non-blocking communicators may complete at once.
  return init_rank(comm, nranks, commId, rank, "ncclCommInitRankConfig");
}

ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist) {
  if (!comm) return fail(ncclInvalidArgument, "ncclCommInitAll: comm is NULL");
  if (ndev < 1) return fail(ncclInvalidArgument, "ncclCommInitAll: ndev " + std::to_string(ndev) + " < 1");
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) return r;
  if ((r = ncclGroupStart()) != ncclSuccess) return r;
  for (int i = 0; i < ndev; ++i) {
    r = init_rank(&comm[i], ndev, id, i, "ncclCommInitAll");
    if (r != ncclSuccess) break;
    comm[i]->state->device = devlist ? devlist[i] : i;
  }
  const ncclResult_t e = ncclGroupEnd();
  return r != ncclSuccess ? r : e;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  ncclResult_t r = live_comm(comm, "ncclCommFinalize");
  if (r != ncclSuccess) return r;
  comm->state->wait_idle();
  std::lock_guard lk(comm->state->mu);
  comm->state->finalized = true;
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  ncclResult_t r = live_comm(comm, "ncclCommDestroy");
  if (r != ncclSuccess) return r;
  if (pending_in_this_group(comm))
    return fail(ncclInvalidUsage, "ncclCommDestroy: the communicator's initialization is pending in this group");
  {
    std::lock_guard lk(g_live_mu);
    g_live.erase(comm);
  }
  // As NCCL's: flush what was issued on it, then free. Its tasks hold the state until they are gone.
  comm->state->wait_idle();
  comm->state->shutdown_links();
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  ncclResult_t r = live_comm(comm, "ncclCommAbort");
  if (r != ncclSuccess) return r;
  if (pending_in_this_group(comm))
    return fail(ncclInvalidUsage, "ncclCommAbort: the communicator's initialization is pending in this group");
  {
    std::lock_guard lk(g_live_mu);
    g_live.erase(comm);
  }
  // Wakes any transfer stuck on the links (it fails); does not wait for issued work.
  comm->state->aborted = true;
  comm->state->shutdown_links();
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  ncclResult_t r = live_comm(comm, "ncclCommGetAsyncError");
  if (r != ncclSuccess) return r;
  if (!asyncError) return fail(ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is NULL");
  std::lock_guard lk(comm->state->mu);
  *asyncError = comm->state->async_error;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  ncclResult_t r = live_comm(comm, "ncclCommCount");
  if (r != ncclSuccess) return r;
  if (!count) return fail(ncclInvalidArgument, "ncclCommCount: count is NULL");
  *count = comm->state->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  ncclResult_t r = live_comm(comm, "ncclCommCuDevice");
  if (r != ncclSuccess) return r;
  if (!device) return fail(ncclInvalidArgument, "ncclCommCuDevice: device is NULL");
  *device = comm->state->device;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  ncclResult_t r = live_comm(comm, "ncclCommUserRank");
  if (r != ncclSuccess) return r;
  if (!rank) return fail(ncclInvalidArgument, "ncclCommUserRank: rank is NULL");
  *rank = comm->state->rank;
  return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
  ++g_group.depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (g_group.depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd: no ncclGroupStart is open on this thread");
  if (--g_group.depth > 0) return ncclSuccess;
  GroupState g = std::move(g_group);
  g_group = GroupState{};
  if (g.error != ncclSuccess) {
    for (PendingInit& p : g.inits) {
      std::lock_guard lk(p.handle->state->mu);
      p.handle->state->async_error = g.error;
      p.handle->state->async_message = "not initialized: its group failed: " + g.error_text;
    }
    t_last_error = "ncclGroupEnd: a call in the group failed, nothing was issued: " + g.error_text;
    return g.error;
  }
  if (!g.inits.empty()) return finish_inits(std::move(g.inits));
  return launch(std::move(g.ops));
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return p2p(true, sendbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return p2p(false, recvbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  return collective(Kind::broadcast, sendbuff, recvbuff, count, datatype, -1, root, comm, stream);
}

ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream) {
  return collective(Kind::broadcast, buff, buff, count, datatype, -1, root, comm, stream);
}

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
  return collective(Kind::reduce, sendbuff, recvbuff, count, datatype, op, root, comm, stream);
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return collective(Kind::all_reduce, sendbuff, recvbuff, count, datatype, op, -1, comm, stream);
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return collective(Kind::reduce_scatter, sendbuff, recvbuff, recvcount, datatype, op, -1, comm, stream);
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  return collective(Kind::all_gather, sendbuff, recvbuff, sendcount, datatype, -1, -1, comm, stream);
}

ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                          ncclComm_t comm, cudaStream_t stream) {
  // NCCL documents no in-place all-to-all; here the blocks would be sent while they are overwritten.
  if (count > 0 && sendbuff == recvbuff) return ncclInvalidArgument;
  return collective(Kind::all_to_all, sendbuff, recvbuff, count, datatype, -1, -1, comm, stream);
}
