// trace_file_test.cpp — the trace recorder (zinf/trace.h) and its file (app/train/trace_file.h): spans
// land in the step their window is named, dropped windows and everything past the bound are not
// kept, and the file is the Chrome trace of what was kept.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <vector>

#include "app/train/trace_file.h"
#include "common/temp_dir.h"
#include "zinf/error.h"
#include "zinf/trace.h"

namespace zinf {
namespace {

using Clock = Trace::Clock;

TEST(TraceRecorder, SpansGoToTheStepTheirWindowIsNamed) {
  Trace t(2);
  const int h2d = t.track(Trace::Group::device, "h2d");
  EXPECT_EQ(t.track(Trace::Group::device, "h2d"), h2d) << "one track per name";
  const auto a = Clock::now(), b = a + std::chrono::microseconds(10);
  t.span(h2d, "Fetch", 1, a, b, 0);   // window 0: step 1
  t.span(h2d, "Fetch", 2, a, b, 1);   // window 1: an evaluation, dropped
  t.span(h2d, "Upload", 3, a, b, 2);  // window 2: step 2, though recorded before window 1 was named
  t.keep(1);
  t.drop();
  EXPECT_EQ(t.windows(), 2);
  t.keep(2);
  EXPECT_TRUE(t.full());
  t.span(h2d, "Fetch", 4, a, b, 3);  // past the bound: refused
  t.keep(3);
  const auto kept = t.kept_spans();
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_EQ(kept[0].first, 1);
  EXPECT_EQ(kept[0].second.unit, 1);
  EXPECT_EQ(kept[1].first, 2);
  EXPECT_EQ(kept[1].second.name, "Upload");
  EXPECT_EQ(t.kept_steps(), (std::vector<std::int64_t>{1, 2}));
}

TEST(TraceRecorder, ThreadsGetTheirOwnHostTracks) {
  Trace t(1);
  t.name_this_thread("trainer");
  const int mine = t.this_thread_track();
  int other = -1, named = -1;
  std::thread([&] { other = t.this_thread_track(); }).join();
  std::thread([&] {
    t.name_this_thread("Update worker");
    named = t.this_thread_track();
  }).join();
  EXPECT_NE(mine, other);
  const auto tracks = t.tracks();
  EXPECT_EQ(tracks[static_cast<std::size_t>(mine)].name, "trainer");
  EXPECT_EQ(tracks[static_cast<std::size_t>(other)].name.rfind("host thread ", 0), 0u);
  EXPECT_EQ(tracks[static_cast<std::size_t>(named)].name, "Update worker");
  EXPECT_EQ(tracks[static_cast<std::size_t>(named)].group, Trace::Group::host);
}

TEST(TraceFileJson, CompleteEventsAndNamedTracks) {
  Trace t(4);
  const int c = t.track(Trace::Group::device, "compute");
  t.track(Trace::Group::nvme, "disk unused");  // no spans: not in the file
  const auto a = t.origin() + std::chrono::milliseconds(2);
  t.span(c, "forward", 0, a, a + std::chrono::microseconds(1500), 0);
  t.span(c, "Norm", -1, a, a + std::chrono::microseconds(5), 0);
  t.keep(7);
  const nlohmann::json j = trace_json(t, {{"config", "c.json"}});
  EXPECT_EQ(j["zinf"]["steps"], nlohmann::json({7}));
  EXPECT_EQ(j["zinf"]["config"], "c.json");
  int complete = 0, thread_names = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "X") {
      ++complete;
      EXPECT_NEAR(e["ts"].get<double>(), 2000.0, 1e-6);
      EXPECT_EQ(e["pid"], 1);
      EXPECT_EQ(e["tid"], c);
      EXPECT_EQ(e["args"]["step"], 7);
      if (e["name"] == "forward") {
        EXPECT_NEAR(e["dur"].get<double>(), 1500.0, 1e-6);
        EXPECT_EQ(e["args"]["unit"], 0);
      } else {
        EXPECT_FALSE(e["args"].contains("unit")) << "no unit: none given";
      }
    } else if (e["name"] == "thread_name") {
      ++thread_names;
      EXPECT_EQ(e["args"]["name"], "compute");
    }
  }
  EXPECT_EQ(complete, 2);
  EXPECT_EQ(thread_names, 1);
}

TEST(TraceFileJson, WritesAllOrNothingAndRefusesBadPaths) {
  test::TempDir dir("trace-file");
  Trace t(1);
  t.keep(1);
  const std::string path = dir / "t.json";
  write_trace_file(t, path);
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_TRUE(nlohmann::json::parse(ss.str()).contains("traceEvents"));
  EXPECT_EQ(dir.entries().size(), 1u) << "no temporary file left";
  EXPECT_NO_THROW(check_trace_path(path, "train.trace_file"));
  EXPECT_THROW(check_trace_path(dir.path.string(), "train.trace_file"), ConfigError);
  EXPECT_THROW(check_trace_path(dir / "missing/t.json", "train.trace_file"), ConfigError);
}

}  // namespace
}  // namespace zinf
