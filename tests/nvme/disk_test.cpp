// disk_test.cpp — disks as resources: a folder resolves to its whole disk (partitions and a
// device-mapper volume over one device to the disk under them, on a made-up sysfs tree), folders on
// one disk share one meter and different disks do not, busy time is the union of the intervals with
// any transfer in flight (given times, no clock), and the busiest resource is named with the disks
// among the others.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "zinf/nvme/disk.h"
#include "zinf/nvme/store.h"
#include "zinf/pinned.h"
#include "zinf/trace.h"
#include "zinf/types.h"

namespace zinf::nvme {
namespace {

namespace fs = std::filesystem;
using Clock = DiskMeter::Clock;

Clock::time_point at(double seconds) {
  return Clock::time_point{} + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

class Folder {
 public:
  explicit Folder(const std::string& tag)
      : path(fs::temp_directory_path() / ("zinf-disk-test-" + tag + "-" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~Folder() { fs::remove_all(path); }
  fs::path path;
};

void write_file(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text << "\n";
}

// A sysfs tree as the kernel lays it out: /dev/block/MAJ:MIN links to the device's folder; a
// partition is a folder inside its disk's with a `partition` file; a device-mapper volume lists the
// devices under it in `slaves/`.
struct FakeSys {
  Folder root{"sys"};
  FakeSys() {
    const fs::path pci = root.path / "devices/pci0000:00/block";
    write_file(pci / "sda/dev", "8:0");
    write_file(pci / "sda/sda1/dev", "8:1");
    write_file(pci / "sda/sda1/partition", "1");
    write_file(pci / "sda/sda2/dev", "8:2");
    write_file(pci / "sda/sda2/partition", "2");
    write_file(pci / "nvme0n1/dev", "259:0");
    write_file(pci / "nvme0n1/nvme0n1p1/dev", "259:1");
    write_file(pci / "nvme0n1/nvme0n1p1/partition", "1");
    const fs::path dm = root.path / "devices/virtual/block";
    write_file(dm / "dm-0/dev", "253:0");  // LVM on sda2
    fs::create_directories(dm / "dm-0/slaves");
    fs::create_directory_symlink(pci / "sda/sda2", dm / "dm-0/slaves/sda2");
    write_file(dm / "md0/dev", "9:0");  // RAID over two partitions: a resource of its own
    fs::create_directories(dm / "md0/slaves");
    fs::create_directory_symlink(pci / "sda/sda1", dm / "md0/slaves/sda1");
    fs::create_directory_symlink(pci / "nvme0n1/nvme0n1p1", dm / "md0/slaves/nvme0n1p1");
    const fs::path block = root.path / "dev/block";
    fs::create_directories(block);
    for (auto [num, dir] : {std::pair{"8:0", pci / "sda"}, {"8:1", pci / "sda/sda1"}, {"8:2", pci / "sda/sda2"},
                            {"259:0", pci / "nvme0n1"}, {"259:1", pci / "nvme0n1/nvme0n1p1"},
                            {"253:0", dm / "dm-0"}, {"9:0", dm / "md0"}})
      fs::create_directory_symlink(dir, block / num);
  }
  std::string str() const { return root.path.string(); }
};

TEST(Disk, PartitionsAndVolumesResolveToTheirWholeDisk) {
  FakeSys sys;
  const Disk sda = whole_disk(8, 0, sys.str());
  EXPECT_EQ(sda.name, "sda");
  EXPECT_EQ(sda.id, makedev(8, 0));
  for (auto [ma, mi] : {std::pair{8u, 1u}, {8u, 2u}, {253u, 0u}}) {  // two partitions and LVM on one of them
    const Disk d = whole_disk(ma, mi, sys.str());
    EXPECT_EQ(d.name, "sda") << ma << ":" << mi;
    EXPECT_EQ(d.id, sda.id) << ma << ":" << mi;
  }
  const Disk nvme = whole_disk(259, 1, sys.str());
  EXPECT_EQ(nvme.name, "nvme0n1");
  EXPECT_NE(nvme.id, sda.id);
  const Disk md = whole_disk(9, 0, sys.str());  // over two disks: itself
  EXPECT_EQ(md.name, "md0");
  const Disk anon = whole_disk(0, 45, sys.str());  // tmpfs, overlay: no block device
  EXPECT_EQ(anon.name, "dev 0:45");
  EXPECT_EQ(anon.id, makedev(0, 45));
}

TEST(Disk, AFolderIsOnTheDiskOfItsFilesystem) {
  Folder a("a"), b("b");
  const Disk da = disk_of(a.path.string()), db = disk_of(b.path.string());
  EXPECT_FALSE(da.name.empty());
  EXPECT_EQ(da.id, db.id);  // two folders under one temporary directory: one disk
  EXPECT_EQ(da.name, db.name);
  EXPECT_THROW(disk_of((a.path / "missing").string()), IoError);
}

// The first block device node under /dev, or "" (a container may have none).
std::string some_block_device() {
  std::error_code ec;
  for (fs::directory_iterator it("/dev", ec), end; !ec && it != end; it.increment(ec))
    if (it->is_block_file(ec)) return it->path().string();
  return "";
}

TEST(Disk, AnAnonymousFilesystemCountsAsTheBlockDeviceItIsMountedFrom) {
  const std::string dev = some_block_device();
  if (dev.empty()) GTEST_SKIP() << "no block device under /dev";
  struct stat st {};
  ASSERT_EQ(::stat(dev.c_str(), &st), 0);
  const Disk want = whole_disk(major(st.st_rdev), minor(st.st_rdev));
  Folder f("mountinfo");
  const std::string mountinfo = (f.path / "mountinfo").string();
  // btrfs subvolumes mounted from `dev` (one with a space in its mount point), an overlay inside one
  write_file(mountinfo, "22 1 254:0 / / rw - ext4 /dev/zinf-no-such-device rw\n"
                        "30 22 0:45 /@data /mnt/my\\040data rw,relatime - btrfs " + dev + " rw\n"
                        "31 22 0:46 /@scratch /mnt/scratch rw - btrfs " + dev + " rw\n"
                        "32 31 0:47 / /mnt/scratch/ovl rw - overlay overlay rw,lowerdir=/a");
  for (auto [num, path] : {std::pair{45u, "/mnt/my data/swap"}, {46u, "/mnt/scratch/zinf"}}) {
    const Disk d = disk_of_device(makedev(0, num), path, "/sys", mountinfo);
    EXPECT_EQ(d.id, want.id) << path;  // two subvolumes of one device: one disk
    EXPECT_EQ(d.name, want.name) << path;
  }
  EXPECT_EQ(disk_of_device(makedev(0, 47), "/mnt/scratch/ovl/x", "/sys", mountinfo).name, "dev 0:47");
  // Not under /mnt/scratch, so under / (whose source is no device).
  EXPECT_EQ(disk_of_device(makedev(0, 48), "/mnt/scratchy", "/sys", mountinfo).name, "dev 0:48");
}

TEST(Disk, FoldersOnOneDiskShareAMeterAndOtherDisksDoNot) {
  FakeSys sys;
  DiskMeters meters;
  auto p1 = meters.meter(whole_disk(8, 1, sys.str()));
  auto p2 = meters.meter(whole_disk(8, 2, sys.str()));
  auto lvm = meters.meter(whole_disk(253, 0, sys.str()));
  auto other = meters.meter(whole_disk(259, 1, sys.str()));
  EXPECT_EQ(p1, p2);
  EXPECT_EQ(p1, lvm);
  EXPECT_NE(p1, other);
  EXPECT_EQ(meters.size(), 2u);
  const auto use = meters.take();
  ASSERT_EQ(use.size(), 2u);
  EXPECT_EQ(use[0].name, "sda");  // in the order first asked for
  EXPECT_EQ(use[1].name, "nvme0n1");
}

TEST(Disk, ReadsAndWritesInFlightTogetherCountOnce) {
  DiskMeter m(Disk{1, "vda"});
  // reads [0, 3] and [1, 2]; a write [2, 5]; then a read alone [7, 8]
  m.begin(false, at(0));
  m.begin(false, at(1));
  m.begin(true, at(2));
  m.end(false, 4096, at(2));
  m.end(false, 8192, at(3));
  m.end(true, 12288, at(5));
  m.begin(false, at(7));
  m.end(false, 4096, at(8));
  const DiskUse u = m.take(at(10));
  EXPECT_DOUBLE_EQ(u.busy, 6.0);   // [0, 5] and [7, 8]: the union, not 3 + 3 + 1
  EXPECT_DOUBLE_EQ(u.read, 4.0);   // [0, 3] and [7, 8]
  EXPECT_DOUBLE_EQ(u.write, 3.0);  // [2, 5]
  EXPECT_EQ(u.read_bytes, 16384u);
  EXPECT_EQ(u.write_bytes, 12288u);
  EXPECT_EQ(u.name, "vda");
  const DiskUse again = m.take(at(11));  // taken: reset
  EXPECT_EQ(again.busy, 0.0);
  EXPECT_EQ(again.read_bytes, 0u);
}

TEST(Disk, ATransferInFlightAtATakeIsSplitBetweenTheTwo) {
  DiskMeter m(Disk{1, "vda"});
  m.begin(true, at(0));
  EXPECT_DOUBLE_EQ(m.take(at(4)).busy, 4.0);
  m.end(true, 4096, at(6));
  const DiskUse u = m.take(at(9));
  EXPECT_DOUBLE_EQ(u.busy, 2.0);
  EXPECT_DOUBLE_EQ(u.write, 2.0);
  EXPECT_EQ(u.write_bytes, 4096u);
}

// With a trace, each busy interval is a span, cut where a take cuts the count and named by what was in
// flight in it; per take, the spans cover the busy time the take returns.
TEST(Disk, ATracedMeterRecordsItsBusyIntervalsInTheirTakes) {
  Trace t(2);
  DiskMeters meters;
  meters.trace_to(&t);
  std::shared_ptr<DiskMeter> m = meters.meter(Disk{1, "vda"});
  m->begin(false, at(0));
  m->begin(true, at(1));
  m->end(false, 4096, at(2));
  const double first = m->take(at(4)).busy;  // the write is still in flight: [0, 4] here
  m->end(true, 4096, at(6));                 // [4, 6] in the next take
  m->begin(false, at(7));
  m->end(false, 4096, at(8));
  const double second = m->take(at(9)).busy;
  t.keep(1);
  t.keep(2);
  const auto spans = t.kept_spans();
  ASSERT_EQ(spans.size(), 3u);
  EXPECT_EQ(t.tracks()[static_cast<std::size_t>(spans[0].second.track)].name, "disk vda");
  double in[2] = {0, 0};
  for (const auto& [step, s] : spans) in[step - 1] += s.t1 - s.t0;
  EXPECT_NEAR(in[0], first, 1e-9);
  EXPECT_NEAR(in[1], second, 1e-9);
  EXPECT_DOUBLE_EQ(first, 4.0);
  EXPECT_DOUBLE_EQ(second, 3.0);
  EXPECT_EQ(spans[0].second.name, "read+write");
  EXPECT_EQ(spans[1].second.name, "write");  // only the write was left in flight after the cut
  EXPECT_EQ(spans[2].second.name, "read");
}

TEST(Disk, TwoStoresInTwoFoldersOfOneDiskCountOnOneMeter) {
  Folder a("store-a"), b("store-b");
  DiskMeters meters;
  StoreOptions oa, ob;
  oa.parent = a.path.string();
  ob.parent = b.path.string();
  oa.io_kind = ob.io_kind = AsyncIoKind::posix;
  oa.disks = ob.disks = &meters;
  TensorStore sa(oa), sb(ob);
  EXPECT_EQ(&sa.meter(), &sb.meter());
  EXPECT_NE(sa.description().find(", on disk " + disk_of(a.path.string()).name), std::string::npos)
      << sa.description();
  PinnedPool pool(1 << 20, false);
  PinnedBuffer buf = pool.acquire(64 << 10);
  const auto ta = sa.add("x", 64 << 10), tb = sb.add("y", 10000);  // y padded to the block size
  sa.write(ta, buf.data())->wait();
  sb.write(tb, buf.data())->wait();
  sb.read(tb, buf.data())->wait();
  const auto use = meters.take();
  ASSERT_EQ(use.size(), 1u);
  EXPECT_EQ(use[0].write_bytes, (64u << 10) + sb.padded(10000));  // what was transferred
  EXPECT_EQ(use[0].read_bytes, sb.padded(10000));
  EXPECT_LE(use[0].busy, use[0].read + use[0].write + 1e-9);
  // Injected as two disks, the same folders are two resources.
  DiskMeters split;
  oa.disks = ob.disks = &split;
  oa.disk_override = Disk{makedev(8, 0), "sda"};
  ob.disk_override = Disk{makedev(259, 0), "nvme0n1"};
  TensorStore s1(oa), s2(ob);
  EXPECT_NE(&s1.meter(), &s2.meter());
  EXPECT_EQ(split.size(), 2u);
}

TEST(Disk, TheBusiestResourceIsNamedWithTheDisksAmongTheOthers) {
  BusyTimes b;
  b.compute = 24, b.host = 5, b.h2d = 1, b.d2h = 1;
  b.disks = {{"vda", 32, 19, 13, 9e9, 9e9}};  // reads and writes overlapped: 32 s busy of 19 + 13
  EXPECT_EQ(b.busiest_name(), "disk vda");
  EXPECT_DOUBLE_EQ(b.busiest(), 32);
  b.disks[0].busy = 20;  // each direction alone is under compute, and so is the disk
  EXPECT_EQ(b.busiest_name(), "compute");
  b.disks.push_back({"nvme0n1", 30, 30, 0, 1e9, 0});
  EXPECT_EQ(b.busiest_name(), "disk nvme0n1");
  EXPECT_DOUBLE_EQ(b.nvme_read_bytes(), 10e9);
  b.host = 31;
  EXPECT_EQ(b.busiest_name(), "host");
  b.disks.clear(), b.host = 0, b.compute = 0;
  EXPECT_EQ(b.busiest_name(), "h2d");  // a tie: the first in the order
  // Sums over steps merge each disk by name; per() divides every figure.
  BusyTimes sum;
  BusyTimes s1;
  s1.disks = {{"vda", 2, 1, 1.5, 100, 200}};
  sum += s1;
  sum += s1;
  ASSERT_EQ(sum.disks.size(), 1u);
  const BusyTimes per = sum.per(2);
  EXPECT_DOUBLE_EQ(per.disks[0].busy, 2);
  EXPECT_DOUBLE_EQ(per.disks[0].write_bytes, 200);
  std::vector<std::string> names;
  per.each([&](const std::string& n, double) { names.push_back(n); });
  EXPECT_EQ(names, (std::vector<std::string>{"compute", "h2d", "d2h", "host", "disk vda"}));
}

}  // namespace
}  // namespace zinf::nvme
