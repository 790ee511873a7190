// zinf/nvme/disk.h — which disk a swap folder lives on, and how busy each disk was.
//
// A disk is one resource however many folders, stores and directions use it: the optimizer store and
// the parameter store in two folders on one drive share its time, and a drive that serves a read and
// a write at once is busy once, not twice. So busy time is kept per whole disk (a partition counts as
// its disk; a device-mapper volume over one device as that device) and is the union of the intervals
// during which any transfer to it is in flight — kept with a count of transfers in flight and the
// time the count last left zero, not with a list of intervals.
//
// Thread-safety: every call may be made from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "zinf/trace.h"

namespace zinf::nvme {

// A whole block device: its device number and kernel name ("nvme0n1", "vda"). A filesystem with no
// block device under it (tmpfs, overlay) is named by its anonymous device number, "dev 0:45".
struct Disk {
  std::uint64_t id = 0;
  std::string name;
};

// The disk `path` lives on: the st_dev of the path, looked up in `<sys>/dev/block/MAJ:MIN`. A
// filesystem with an anonymous device number (btrfs gives one to every subvolume) counts as the block
// device its mount names as the source in `mountinfo`, when that is one. Throws zinf::IoError when
// the path cannot be stat'ed.
Disk disk_of(const std::string& path, const std::string& sys = "/sys",
             const std::string& mountinfo = "/proc/self/mountinfo");
// disk_of for a path whose st_dev is given (`path` absolute, symbolic links resolved).
Disk disk_of_device(std::uint64_t st_dev, const std::string& path, const std::string& sys = "/sys",
                    const std::string& mountinfo = "/proc/self/mountinfo");
// The whole disk of block device major:minor: a partition resolves to the disk that holds it, a
// device-mapper volume over exactly one device to that device's disk.
Disk whole_disk(unsigned dev_major, unsigned dev_minor, const std::string& sys = "/sys");

// One disk's use since the last take(): the seconds any transfer was in flight (busy), reads alone,
// writes alone, and the bytes moved (as transferred, padding included).
struct DiskUse {
  std::string name;
  double busy = 0, read = 0, write = 0;
  std::uint64_t read_bytes = 0, write_bytes = 0;
};

// The in-flight count of one disk. begin() when a transfer is submitted, end() when it completes; the
// times are parameters so that the accounting can be checked without a clock. With a trace, each
// interval it counts as busy is a span on the disk's track ("read", "write" or "read+write": what was
// in flight during it), cut where take() cuts the count (zinf/trace.h).
class DiskMeter {
 public:
  using Clock = std::chrono::steady_clock;
  explicit DiskMeter(Disk d) : disk_(std::move(d)) {}
  const Disk& disk() const { return disk_; }

  void begin(bool write, Clock::time_point now = Clock::now());
  void end(bool write, std::uint64_t bytes, Clock::time_point now = Clock::now());
  // The use since the last take; a transfer still in flight counts up to `now` here and from `now` on
  // in the next take. Resets the counts.
  DiskUse take(Clock::time_point now = Clock::now());
  // Records the busy intervals on `track` of `t` from now on.
  void trace_to(Trace* t, int track);
  // With a trace: one transfer of a store's queue, [t0, t1) on the queue's track `queue` (made on
  // first use), named `name` ("SwapIn"), moving tensor `tensor`, in the window of the busy interval
  // it completes in. Without one, nothing.
  void queue_span(const std::string& queue, const char* name, const std::string& tensor, Clock::time_point t0,
                  Clock::time_point t1);
  bool traced() const;

 private:
  void span_locked(Clock::time_point now);  // the interval since any_.since, when it is one
  // Transfers in flight, the time the count last rose from zero (or the last take), and the busy
  // seconds counted so far.
  struct Span {
    int in_flight = 0;
    Clock::time_point since{};
    double seconds = 0;
    void begin(Clock::time_point now);
    void end(Clock::time_point now);
    double take(Clock::time_point now);
  };
  const Disk disk_;
  mutable std::mutex mu_;
  Span any_, dir_[2];  // any transfer; reads; writes
  std::uint64_t bytes_[2] = {0, 0};
  Trace* trace_ = nullptr;  // under mu_
  int track_ = 0;
  std::int64_t window_ = 0;  // take() calls so far
  unsigned dirs_ = 0;        // what was in flight since any_.since: 1 reads, 2 writes
};

// The disks of one engine: one meter per disk, shared by every store whose folder is on it.
class DiskMeters {
 public:
  // The meter of disk `d` (by id; the first caller's name is kept).
  std::shared_ptr<DiskMeter> meter(const Disk& d);
  // Every disk's use since the last take, in the order the disks were first asked for.
  std::vector<DiskUse> take();
  std::size_t size() const;
  // Every disk's busy intervals, as spans on a track "disk <name>" of `t` (set before the first meter).
  void trace_to(Trace* t);

 private:
  mutable std::mutex mu_;
  Trace* trace_ = nullptr;
  std::vector<std::shared_ptr<DiskMeter>> meters_;
};

}  // namespace zinf::nvme
