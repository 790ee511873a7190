// disk.cpp — the disk of a folder, and per-disk busy time (zinf/nvme/disk.h).
#include "zinf/nvme/disk.h"

#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "zinf/error.h"

namespace zinf::nvme {

namespace fs = std::filesystem;

namespace {

std::string first_line(const fs::path& p) {
  std::ifstream f(p);
  std::string s;
  std::getline(f, s);
  return s;
}

// A block device's sysfs folder, walked down to its whole disk: a partition to the disk above it (its
// parent folder), a device-mapper volume with one device under it to that device. A volume over
// several devices (RAID, striped LVM) stays itself: it is the resource its users share.
fs::path whole_disk_dir(fs::path dir) {
  for (int hop = 0; hop < 8; ++hop) {
    std::error_code ec;
    std::vector<fs::path> under;
    for (fs::directory_iterator it(dir / "slaves", ec), end; !ec && it != end; it.increment(ec))
      under.push_back(it->path());
    if (under.size() == 1) {
      fs::path next = fs::canonical(under[0], ec);
      if (ec) break;
      dir = next;
      continue;
    }
    if (under.empty() && fs::exists(dir / "partition", ec)) {
      dir = dir.parent_path();
      continue;
    }
    break;
  }
  return dir;
}

// A mountinfo field with its octal escapes (`\040` for a space) decoded.
std::string unescape(const std::string& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '3') {
      out += static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0'));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

// The block device behind the mount that holds `path` (the mount point that is the longest prefix of
// it; the later of two equal ones), from mountinfo's source field; 0 when the source is no block
// device (tmpfs, overlay, a ZFS dataset).
dev_t mount_source(const std::string& path, const std::string& mountinfo) {
  std::ifstream f(mountinfo);
  std::string line, source;
  std::size_t best = 0;
  while (std::getline(f, line)) {
    std::istringstream head(line);
    std::string id, parent, number, root, point;
    const auto dash = line.find(" - ");
    if (!(head >> id >> parent >> number >> root >> point) || dash == std::string::npos) continue;
    std::istringstream tail(line.substr(dash + 3));
    std::string type, src;
    if (!(tail >> type >> src)) continue;
    point = unescape(point);
    const bool under = path.compare(0, point.size(), point) == 0 &&
                       (path.size() == point.size() || point == "/" || path[point.size()] == '/');
    if (under && point.size() >= best) best = point.size(), source = unescape(src);
  }
  struct stat st {};
  if (source.rfind("/dev/", 0) != 0 || ::stat(source.c_str(), &st) != 0 || !S_ISBLK(st.st_mode)) return 0;
  return st.st_rdev;
}

}  // namespace

Disk whole_disk(unsigned dev_major, unsigned dev_minor, const std::string& sys) {
  const std::string number = std::to_string(dev_major) + ":" + std::to_string(dev_minor);
  std::error_code ec;
  const fs::path dir = fs::canonical(fs::path(sys) / "dev" / "block" / number, ec);
  if (ec) return {makedev(dev_major, dev_minor), "dev " + number};  // no block device (tmpfs, overlay)
  const fs::path disk = whole_disk_dir(dir);
  unsigned a = dev_major, b = dev_minor;
  if (std::sscanf(first_line(disk / "dev").c_str(), "%u:%u", &a, &b) != 2) a = dev_major, b = dev_minor;
  return {makedev(a, b), disk.filename().string()};
}

Disk disk_of_device(std::uint64_t st_dev, const std::string& path, const std::string& sys,
                    const std::string& mountinfo) {
  if (major(st_dev) == 0)  // an anonymous number: the device the filesystem was mounted from, if any
    if (const dev_t source = mount_source(path, mountinfo)) return whole_disk(major(source), minor(source), sys);
  return whole_disk(major(st_dev), minor(st_dev), sys);
}

Disk disk_of(const std::string& path, const std::string& sys, const std::string& mountinfo) {
  struct stat st {};
  std::error_code ec;
  const fs::path real = fs::canonical(path, ec);
  if (ec || ::stat(real.c_str(), &st) != 0) {
    const int e = ec ? ec.value() : errno;
    throw IoError(path + ": cannot find its disk (" + std::strerror(e) + ")", e);
  }
  return disk_of_device(st.st_dev, real.string(), sys, mountinfo);
}

// ---- busy time ---------------------------------------------------------------------------------------

void DiskMeter::Span::begin(Clock::time_point now) {
  if (in_flight++ == 0) since = now;
}

void DiskMeter::Span::end(Clock::time_point now) {
  if (in_flight == 0) return;
  if (--in_flight == 0 && now > since) seconds += std::chrono::duration<double>(now - since).count();
}

double DiskMeter::Span::take(Clock::time_point now) {
  if (in_flight > 0 && now > since) {
    seconds += std::chrono::duration<double>(now - since).count();
    since = now;
  }
  const double s = seconds;
  seconds = 0;
  return s;
}

void DiskMeter::begin(bool write, Clock::time_point now) {
  std::lock_guard<std::mutex> lk(mu_);
  any_.begin(now);
  dir_[write ? 1 : 0].begin(now);
  dirs_ |= write ? 2u : 1u;
}

void DiskMeter::end(bool write, std::uint64_t bytes, Clock::time_point now) {
  std::lock_guard<std::mutex> lk(mu_);
  if (any_.in_flight == 1) span_locked(now);  // the busy interval ends here
  any_.end(now);
  dir_[write ? 1 : 0].end(now);
  bytes_[write ? 1 : 0] += bytes;
  if (any_.in_flight == 0) dirs_ = 0;  // the next interval names only what it holds
}

void DiskMeter::span_locked(Clock::time_point now) {
  if (trace_ && any_.in_flight > 0 && now > any_.since)
    trace_->span(track_, dirs_ == 3 ? "read+write" : dirs_ == 2 ? "write" : "read", -1, any_.since, now, window_);
  dirs_ = (dir_[0].in_flight > 0 ? 1u : 0u) | (dir_[1].in_flight > 0 ? 2u : 0u);
}

void DiskMeter::queue_span(const std::string& queue, const char* name, const std::string& tensor, Clock::time_point t0,
                           Clock::time_point t1) {
  std::lock_guard<std::mutex> lk(mu_);
  if (trace_) trace_->span(trace_->track(Trace::Group::queue, queue), name, -1, t0, t1, window_, tensor);
}

bool DiskMeter::traced() const {
  std::lock_guard<std::mutex> lk(mu_);
  return trace_ != nullptr;
}

void DiskMeter::trace_to(Trace* t, int track) {
  std::lock_guard<std::mutex> lk(mu_);
  trace_ = t;
  track_ = track;
}

DiskUse DiskMeter::take(Clock::time_point now) {
  std::lock_guard<std::mutex> lk(mu_);
  span_locked(now);  // a transfer in flight: its part up to now is this take's
  ++window_;
  DiskUse u;
  u.name = disk_.name;
  u.busy = any_.take(now);
  u.read = dir_[0].take(now);
  u.write = dir_[1].take(now);
  u.read_bytes = bytes_[0];
  u.write_bytes = bytes_[1];
  bytes_[0] = bytes_[1] = 0;
  return u;
}

std::shared_ptr<DiskMeter> DiskMeters::meter(const Disk& d) {
  std::lock_guard<std::mutex> lk(mu_);
  for (const auto& m : meters_)
    if (m->disk().id == d.id) return m;
  meters_.push_back(std::make_shared<DiskMeter>(d));
  if (trace_) meters_.back()->trace_to(trace_, trace_->track(Trace::Group::nvme, "disk " + d.name));
  return meters_.back();
}

void DiskMeters::trace_to(Trace* t) {
  std::lock_guard<std::mutex> lk(mu_);
  trace_ = t;
  for (const auto& m : meters_) m->trace_to(t, t ? t->track(Trace::Group::nvme, "disk " + m->disk().name) : 0);
}

std::vector<DiskUse> DiskMeters::take() {
  std::vector<std::shared_ptr<DiskMeter>> all;
  {
    std::lock_guard<std::mutex> lk(mu_);
    all = meters_;
  }
  const auto now = DiskMeter::Clock::now();
  std::vector<DiskUse> out;
  for (const auto& m : all) out.push_back(m->take(now));
  return out;
}

std::size_t DiskMeters::size() const {
  std::lock_guard<std::mutex> lk(mu_);
  return meters_.size();
}

}  // namespace zinf::nvme
