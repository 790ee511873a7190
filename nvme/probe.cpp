// probe.cpp — try O_DIRECT and io_uring on a directory (zinf/nvme/probe.h).
#include "zinf/nvme/probe.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "zinf/error.h"

namespace zinf::nvme {
namespace {

std::string fs_name(long magic) {
  switch (static_cast<unsigned long>(magic)) {
    case 0xEF53: return "ext4";
    case 0x58465342: return "xfs";
    case 0x9123683E: return "btrfs";
    case 0x01021994: return "tmpfs";
    case 0x6969: return "nfs";
    case 0x794C7630: return "overlayfs";
    case 0x2FC12FC1: return "zfs";
    case 0xF2F52010: return "f2fs";
    case 0x65735546: return "fuse";
    case 0xFF534D42: return "cifs";
    default: {
      char buf[32];
      std::snprintf(buf, sizeof buf, "0x%lx", static_cast<unsigned long>(magic));
      return buf;
    }
  }
}

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

}  // namespace

bool io_uring_available(std::string* reason) {
  io_uring ring;
  int rc = io_uring_queue_init(4, &ring, 0);
  if (rc < 0) {
    if (reason) *reason = std::string("io_uring_queue_init: ") + std::strerror(-rc);
    return false;
  }
  io_uring_queue_exit(&ring);
  return true;
}

PathProbe probe_path(const std::string& dir) {
  ZINF_CHECK(!dir.empty());
  PathProbe p;
  p.path = dir;
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    p.odirect_reason = p.io_uring_reason = "not a directory";
    return p;
  }
  p.exists = true;
  struct statfs sfs {};
  if (::statfs(dir.c_str(), &sfs) == 0) p.filesystem = fs_name(static_cast<long>(sfs.f_type));
  struct statvfs vfs {};
  if (::statvfs(dir.c_str(), &vfs) == 0) {
    p.free_bytes = static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    p.total_bytes = static_cast<std::uint64_t>(vfs.f_blocks) * vfs.f_frsize;
  }

  std::string tmpl = dir + "/.zinf-probe-XXXXXX";
  int fd = ::mkstemp(tmpl.data());
  if (fd < 0) {
    p.odirect_reason = p.io_uring_reason = std::string("cannot create a file: ") + std::strerror(errno);
    return p;
  }
  p.writable = true;
  ::close(fd);
  struct statx sx {};
  if (::statx(AT_FDCWD, tmpl.c_str(), 0, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN))
    p.dio_align = std::max(sx.stx_dio_mem_align, sx.stx_dio_offset_align);
  const std::size_t n = 4096 * 4;
  const std::size_t align = std::max<std::size_t>(4096, p.dio_align);
  std::unique_ptr<char, FreeDeleter> buf(static_cast<char*>(std::aligned_alloc(align, n)));
  for (std::size_t i = 0; i < n; ++i) buf.get()[i] = static_cast<char>(i * 131u + 7u);

  fd = ::open(tmpl.c_str(), O_RDWR | O_DIRECT);
  if (fd < 0) {
    p.odirect_reason = std::string("open(O_DIRECT): ") + std::strerror(errno);
  } else {
    ssize_t w = ::pwrite(fd, buf.get(), n, 0);
    if (w != static_cast<ssize_t>(n)) {
      p.odirect_reason =
          w < 0 ? std::string("pwrite(O_DIRECT): ") + std::strerror(errno) : "pwrite(O_DIRECT): short write";
    } else {
      p.odirect = true;
    }
  }
  // io_uring: read the block back through a ring (O_DIRECT fd when we have one).
  std::string why;
  if (!io_uring_available(&why)) {
    p.io_uring_reason = why;
  } else {
    int rfd = fd >= 0 ? fd : ::open(tmpl.c_str(), O_RDONLY);
    io_uring ring;
    if (rfd >= 0 && io_uring_queue_init(2, &ring, 0) == 0) {
      std::unique_ptr<char, FreeDeleter> back(static_cast<char*>(std::aligned_alloc(align, n)));
      if (!p.odirect) {  // buffered fallback: still tell whether the ring works here
        if (::pwrite(rfd, buf.get(), n, 0) != static_cast<ssize_t>(n)) rfd = -1;
      }
      io_uring_sqe* sqe = io_uring_get_sqe(&ring);
      io_uring_prep_read(sqe, rfd, back.get(), static_cast<unsigned>(n), 0);
      io_uring_submit(&ring);
      io_uring_cqe* cqe = nullptr;
      int rc = io_uring_wait_cqe(&ring, &cqe);
      if (rc < 0) {
        p.io_uring_reason = std::string("io_uring_wait_cqe: ") + std::strerror(-rc);
      } else if (cqe->res < 0) {
        p.io_uring_reason = std::string("io_uring read: ") + std::strerror(-cqe->res);
      } else if (static_cast<std::size_t>(cqe->res) != n || std::memcmp(back.get(), buf.get(), n) != 0) {
        p.io_uring_reason = "io_uring read returned different bytes";
      } else {
        p.io_uring = true;
      }
      if (cqe) io_uring_cqe_seen(&ring, cqe);
      io_uring_queue_exit(&ring);
      if (rfd != fd && rfd >= 0) ::close(rfd);
    } else {
      p.io_uring_reason = "cannot set up a ring on this file";
    }
  }
  if (fd >= 0) ::close(fd);
  ::unlink(tmpl.c_str());
  return p;
}

}  // namespace zinf::nvme
