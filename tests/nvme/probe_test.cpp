// probe_test.cpp — the swap-path probe answers from real attempts and leaves nothing behind.
#include <gtest/gtest.h>

#include <filesystem>

#include "zinf/nvme/probe.h"

namespace zinf::nvme {
namespace {

TEST(Probe, TempDirectoryIsProbedAndLeftClean) {
  auto dir = std::filesystem::temp_directory_path() / ("zinf-probe-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  PathProbe p = probe_path(dir.string());
  EXPECT_TRUE(p.exists);
  EXPECT_FALSE(p.filesystem.empty());
  EXPECT_GT(p.total_bytes, 0u);
  EXPECT_TRUE(p.odirect || !p.odirect_reason.empty());
  EXPECT_TRUE(p.io_uring || !p.io_uring_reason.empty());
  if (!p.odirect) GTEST_LOG_(INFO) << "O_DIRECT unavailable here: " << p.odirect_reason;
  if (!p.io_uring) GTEST_LOG_(INFO) << "io_uring unavailable here: " << p.io_uring_reason;
  EXPECT_TRUE(std::filesystem::is_empty(dir));  // the scratch file is gone
  std::filesystem::remove_all(dir);
}

TEST(Probe, MissingDirectoryIsReportedNotThrown) {
  PathProbe p = probe_path("/nonexistent/zinf/path");
  EXPECT_FALSE(p.exists);
  EXPECT_FALSE(p.odirect);
  EXPECT_FALSE(p.io_uring);
  EXPECT_EQ(p.odirect_reason, "not a directory");
}

TEST(Probe, IoUringAvailabilityComesWithAReason) {
  std::string why;
  bool ok = io_uring_available(&why);
  EXPECT_TRUE(ok || !why.empty());
}

}  // namespace
}  // namespace zinf::nvme
