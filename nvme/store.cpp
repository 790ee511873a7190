// store.cpp — tensors in preallocated files, moved by an AsyncIo back end (zinf/nvme/store.h).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "zinf/error.h"
#include "zinf/nvme/store.h"

namespace zinf::nvme {

TensorStore::TensorStore(const StoreOptions& o, FaultPlan* faults) {
  ZINF_CHECK(o.files >= 1);
  install_swap_cleanup_handlers();
  stale_ = clean_stale_swap_dirs(o.parent);  // a crashed run's leftovers, removed only when provably ours
  dir_ = std::make_unique<SwapDir>(o.parent, o.create_parent);
  bool direct = o.odirect;
  std::string direct_note = direct ? "O_DIRECT" : "buffered (O_DIRECT off)";
  for (int i = 0; i < o.files; ++i) {
    File f;
    f.path = dir_->file("store." + std::to_string(i));
    int flags = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC;
    f.fd = direct ? ::open(f.path.c_str(), flags | O_DIRECT, 0600) : -1;
    if (direct && f.fd < 0 && errno == EINVAL) {  // the filesystem refuses O_DIRECT (tmpfs, some network fs)
      direct = false;
      direct_note = "buffered (this filesystem refuses O_DIRECT)";
    }
    if (f.fd < 0) f.fd = ::open(f.path.c_str(), flags, 0600);
    if (f.fd < 0) {
      const int e = errno;
      for (auto& g : files_) ::close(g.fd);
      throw IoError("swap file " + f.path + ": open: " + std::strerror(e), e);
    }
    files_.push_back(f);
  }
  odirect_ = direct;
  struct statx sx {};
  if (direct && ::statx(files_[0].fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN))
    align_ = std::max<std::size_t>(4096, std::max(sx.stx_dio_mem_align, sx.stx_dio_offset_align));
  std::string why;
  AsyncIoOptions io_options = o.io;
  io_options.block_size = std::max(align_, io_options.block_size / align_ * align_);
  for (const auto& f : files_) io_options.fixed_files.push_back(f.fd);  // opened once: register them with the rings
  io_ = make_async_io(o.io_kind, io_options, &why, faults);
  const Disk disk = o.disk_override.name.empty() ? disk_of(dir_->path()) : o.disk_override;
  meter_ = o.disks ? o.disks->meter(disk) : std::make_shared<DiskMeter>(disk);
  queue_ = o.queue + " (disk " + disk.name + ")";
  read_span_ = o.read_span;
  write_span_ = o.write_span;
  description_ = why + ", " + direct_note + ", " + std::to_string(files_.size()) + " file(s) in " + dir_->path();
  if (dir_->created_parent()) description_ += " (created " + o.parent + ", which did not exist)";
  description_ += ", on disk " + disk.name;
}

TensorStore::~TensorStore() {
  io_.reset();  // drains and joins the I/O threads before the files go
  for (auto& f : files_) ::close(f.fd);
}

std::uint64_t TensorStore::reserved() const {
  std::uint64_t total = 0;
  for (const auto& f : files_) total += f.end;
  return total;
}

TensorStore::Id TensorStore::add(const std::string& name, std::uint64_t bytes) {
  const std::size_t fi = tensors_.size() % files_.size();
  File& f = files_[fi];
  const std::uint64_t off = f.end, len = padded(bytes);
  if (len > 0) {
    int rc = ::posix_fallocate(f.fd, static_cast<off_t>(off), static_cast<off_t>(len));
    if (rc == EOPNOTSUPP || rc == EINVAL) rc = ::ftruncate(f.fd, static_cast<off_t>(off + len)) == 0 ? 0 : errno;
    if (rc != 0)
      throw IoError("swap file " + f.path + ": cannot reserve " + std::to_string(len) + " bytes at offset " +
                        std::to_string(off) + " for tensor " + name + ": " + std::strerror(rc),
                    rc, rc == ENOSPC ? "free space on the NVMe drive or point nvme_path at a larger one" : "");
  }
  f.end = off + len;
  tensors_.push_back({name, fi, off, bytes});
  return tensors_.size() - 1;
}

std::uint64_t TensorStore::size(Id id) const {
  ZINF_CHECK(id < tensors_.size());
  return tensors_[id].bytes;
}

IoHandle TensorStore::transfer(bool write, Id id, void* buf, std::uint64_t offset, std::uint64_t len) {
  ZINF_CHECK(id < tensors_.size());
  const Tensor& t = tensors_[id];
  ZINF_CHECK(offset % align_ == 0 && offset <= t.bytes);
  ZINF_CHECK(!odirect_ || reinterpret_cast<std::uintptr_t>(buf) % align_ == 0);
  len = std::min(len, t.bytes - offset);
  const File& f = files_[t.file];
  const std::uint64_t bytes = padded(len);
  // Counted on the disk from submit to completion, once: the completion runs on an I/O thread, or
  // here when the submit throws before the transfer could start.
  // With a trace, the transfer is also a span on the store's queue track (from the same two times).
  auto once = std::make_shared<std::atomic<bool>>(false);
  const auto t0 = DiskMeter::Clock::now();
  const bool traced = meter_->traced();
  auto done = [meter = meter_, once, write, bytes, t0, traced, queue = traced ? queue_ : std::string(),
               name = write ? write_span_ : read_span_, tensor = traced ? t.name : std::string()] {
    if (once->exchange(true)) return;
    const auto t1 = DiskMeter::Clock::now();
    meter->end(write, bytes, t1);
    if (traced) meter->queue_span(queue, name, tensor, t0, t1);
  };
  meter_->begin(write, t0);
  try {
    return io_->submit(write, f.fd, buf, bytes, t.offset + offset, f.path, done);
  } catch (...) {
    done();
    throw;
  }
}

IoHandle TensorStore::write(Id id, const void* src, std::uint64_t offset, std::uint64_t len) {
  return transfer(true, id, const_cast<void*>(src), offset, len);
}
IoHandle TensorStore::read(Id id, void* dst, std::uint64_t offset, std::uint64_t len) {
  return transfer(false, id, dst, offset, len);
}

}  // namespace zinf::nvme
