// zinf/nvme/store.h — the tensor store: named tensors in preallocated files under a private swap
// directory, read and written asynchronously through an AsyncIo back end.
//
// Layout: `<nvme_path>/zinf-<pid>-<random>/` (mode 0700, with a `.zinf-swap` marker naming the
// owning process) holds `store.0 … store.<files-1>` (mode 0600). Each tensor gets an extent aligned
// to the file's O_DIRECT alignment (queried with statx, at least 4 KiB) and padded to it; extents are
// reserved with fallocate as tensors are added, and files are opened once.
//
// Buffers passed to read/write must be aligned to alignment() and hold padded(len) bytes (the
// PinnedPool's blocks are): with O_DIRECT the tail of a tensor whose size is not a multiple of the
// block size is transferred whole (DeepSpeed #1070 silently dropped such tails).
//
// Scratch hygiene: the directory and its files are removed by the destructor (normal exit, errors),
// and on SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 by a handler installed with
// install_swap_cleanup_handlers() (where the program has none of its own). A leftover
// directory from a crashed run is only removed when it is provably zinf's (marker present, owner
// process gone, nothing but zinf's files inside) — see clean_stale_swap_dirs().
//
// Thread-safety: add() must not race with other calls; read/write may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "zinf/nvme/async_io.h"
#include "zinf/nvme/disk.h"

namespace zinf::nvme {

// The private directory; removed (files and all) when destroyed or on SIGINT/SIGTERM.
class SwapDir {
 public:
  // With create_parent, creates `parent` (and its parents) when it does not exist, as DeepSpeed does
  // with nvme_path; throws zinf::IoError naming the parent when that fails or it is no directory.
  explicit SwapDir(const std::string& parent, bool create_parent = false);
  ~SwapDir();
  SwapDir(const SwapDir&) = delete;
  SwapDir& operator=(const SwapDir&) = delete;
  const std::string& path() const { return path_; }
  bool created_parent() const { return created_parent_; }
  // Path of a file inside; registers it for removal.
  std::string file(const std::string& name);

 private:
  void remove();
  std::string path_;
  int slot_ = -1;
  bool created_parent_ = false;
};

// Installs handlers for SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 that remove every
// live SwapDir, then re-raise the signal with its default action — for each of them that still has
// its default action: a signal the program handles itself keeps its handler (which must call
// remove_live_swap_dirs() on the paths that end the process at once), and an ignored one stays
// ignored. Idempotent.
void install_swap_cleanup_handlers();
// Removes every live SwapDir of this process now (async-signal-safe): for a program's own signal
// handler that stops at once, e.g. on a second Ctrl-C.
void remove_live_swap_dirs();

// Leftover swap directories under `parent`: removes those that are provably zinf's and whose owner
// is gone; returns one line per directory found (removed or kept, and why). This process's own
// directories (another store of the same run) are passed over in silence.
std::vector<std::string> clean_stale_swap_dirs(const std::string& parent);
// The bytes on the disk of the directories clean_stale_swap_dirs(parent) would remove now (their
// files' allocated blocks), removing nothing: space a new store under `parent` gets back at start.
std::uint64_t stale_swap_bytes(const std::string& parent);

struct StoreOptions {
  std::string parent;  // nvme_path
  AsyncIoKind io_kind = AsyncIoKind::automatic;
  AsyncIoOptions io;
  int files = 1;               // tensors are spread round-robin over this many files
  bool odirect = true;         // false, or refused by the filesystem: buffered I/O
  bool create_parent = false;  // create `parent` when missing (training's nvme_path, as DeepSpeed)
  // Where the store's transfers are counted: the meter of its folder's disk in `disks` (shared with
  // every other store of those meters on that disk), or a meter of its own when null.
  DiskMeters* disks = nullptr;
  Disk disk_override;  // tests: count under this disk instead of the folder's (when its name is set)
  // With a trace (the meter's): the store's queue track, and what its reads and writes are called
  // there ("optimizer states", "SwapIn", "SwapOut").
  std::string queue = "store";
  const char* read_span = "read";
  const char* write_span = "write";
};

class TensorStore {
 public:
  using Id = std::size_t;
  explicit TensorStore(const StoreOptions& o, FaultPlan* faults = nullptr);
  ~TensorStore();

  // Registers a tensor of `bytes` and reserves its extent (fallocate). Throws zinf::IoError on a full
  // disk, naming the file and size.
  Id add(const std::string& name, std::uint64_t bytes);

  std::uint64_t size(Id id) const;
  std::uint64_t padded(std::uint64_t len) const { return (len + align_ - 1) / align_ * align_; }
  std::size_t alignment() const { return align_; }
  std::size_t count() const { return tensors_.size(); }
  // Bytes of every extent reserved so far (tensors padded to alignment()), over all files.
  std::uint64_t reserved() const;

  // Async whole-tensor or sub-range transfers; offset must be aligned; len is clamped to the tensor
  // and the transfer covers padded(len) bytes of the buffer.
  IoHandle write(Id id, const void* src, std::uint64_t offset = 0, std::uint64_t len = UINT64_MAX);
  IoHandle read(Id id, void* dst, std::uint64_t offset = 0, std::uint64_t len = UINT64_MAX);

  // The disk the store's folder is on, where every transfer is counted from submit to completion
  // (zinf/nvme/disk.h): take() its busy time and bytes.
  DiskMeter& meter() { return *meter_; }

  // "io_uring engine (auto: io_uring works here), O_DIRECT, 1 file(s) in /tmp/zinf-12-ab34, on disk vda"
  const std::string& description() const { return description_; }
  const std::string& directory() const { return dir_->path(); }
  // What clean_stale_swap_dirs found under the parent when the store was created.
  const std::vector<std::string>& stale_report() const { return stale_; }
  AsyncIo& io() { return *io_; }

 private:
  struct File {
    std::string path;
    int fd = -1;
    std::uint64_t end = 0;  // bytes reserved
  };
  struct Tensor {
    std::string name;
    std::size_t file;
    std::uint64_t offset, bytes;
  };
  IoHandle transfer(bool write, Id id, void* buf, std::uint64_t offset, std::uint64_t len);

  std::unique_ptr<SwapDir> dir_;
  std::vector<std::string> stale_;
  std::vector<File> files_;
  std::vector<Tensor> tensors_;
  std::size_t align_ = 4096;
  bool odirect_ = false;
  std::unique_ptr<AsyncIo> io_;
  std::string description_;
  std::shared_ptr<DiskMeter> meter_;
  std::string queue_;
  const char* read_span_;
  const char* write_span_;
};

}  // namespace zinf::nvme
