// report_test.cpp — the progress line's busy part: each disk once with its reads and writes beside
// it, the NVMe bytes, and the busiest resource with the step time against it.
#include <gtest/gtest.h>

#include "app/config/config.h"
#include "app/train/report.h"

namespace zinf {
namespace {

TEST(ProgressLine, NamesTheBusiestResourceWithADiskCountedOnce) {
  BusyTimes b;
  b.compute = 24.5, b.host = 5, b.h2d = 0.5, b.d2h = 0.25;
  b.disks = {{"vda", 32, 19, 13, 9.3e9, 9.3e9}};  // reads and writes overlap: 32 s busy, 19 + 13 summed
  const std::string s = busy_summary(b, 34);
  EXPECT_NE(s.find("compute 24500"), std::string::npos) << s;
  EXPECT_NE(s.find("disk vda 32000 (r 19000 w 13000)"), std::string::npos) << s;
  EXPECT_NE(s.find("nvme MB r 9300 w 9300"), std::string::npos) << s;
  EXPECT_NE(s.find("pace: disk vda, overlap 1.06"), std::string::npos) << s;  // 34 / 32, not 34 / 24.5
  // Without a disk, the line has no NVMe part and compute sets the pace.
  b.disks.clear();
  const std::string c = busy_summary(b, 34);
  EXPECT_EQ(c.find("nvme"), std::string::npos) << c;
  EXPECT_NE(c.find("pace: compute, overlap 1.39"), std::string::npos) << c;
}

TEST(ProgressLine, CarriesTheBusyPartOnlyWhenSomethingIsOffloaded) {
  StepReport r;
  r.step = 3, r.steps = 10, r.step_s = 2;
  r.busy.compute = 1;
  r.busy.disks = {{"nvme0n1", 1.6, 1, 1, 1e6, 2e6}};
  Config off = parse_config(R"({"train_batch_size": 8})");
  EXPECT_EQ(progress_line(off, r, 0, 0).find("pace:"), std::string::npos);
  Config on = parse_config(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
                              "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"}}})");
  const std::string line = progress_line(on, r, 0, 0);
  EXPECT_NE(line.find("step     3/10 | loss"), std::string::npos) << line;
  EXPECT_NE(line.find("| pace: disk nvme0n1, overlap 1.25"), std::string::npos) << line;
}

}  // namespace
}  // namespace zinf
