// trace_check.h — reading a trace file back in the tests (docs/trace.md): its Chrome-trace shape,
// and each resource's busy time as its spans give it, to hold against the busy times the run reports.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace zinf::test {

using nlohmann::json;

// Checks the Chrome-trace shape of `t`: every event has the fields its phase needs, complete events a
// non-negative duration and a step, and every process and thread a complete event uses is named.
// Sets the name of each (pid, tid) track.
using TrackNames = std::map<std::pair<int, int>, std::string>;
inline void check_chrome_trace(const json& t, TrackNames& threads) {
  ASSERT_TRUE(t.is_object());
  ASSERT_TRUE(t.contains("traceEvents") && t["traceEvents"].is_array());
  std::set<int> processes;
  std::set<std::pair<int, int>> used;
  for (const json& e : t["traceEvents"]) {
    ASSERT_TRUE(e.contains("name") && e["name"].is_string()) << e.dump();
    ASSERT_TRUE(e.contains("ph") && e["ph"].is_string()) << e.dump();
    ASSERT_TRUE(e.contains("pid") && e["pid"].is_number_integer()) << e.dump();
    ASSERT_TRUE(e.contains("args") && e["args"].is_object()) << e.dump();
    const int pid = e["pid"].get<int>();
    if (e["ph"] == "X") {
      ASSERT_TRUE(e.contains("tid") && e["tid"].is_number_integer()) << e.dump();
      ASSERT_TRUE(e.contains("ts") && e["ts"].is_number()) << e.dump();
      ASSERT_TRUE(e.contains("dur") && e["dur"].is_number()) << e.dump();
      EXPECT_GE(e["ts"].get<double>(), 0.0) << e.dump();
      EXPECT_GE(e["dur"].get<double>(), 0.0) << e.dump();
      EXPECT_TRUE(e["args"].contains("step") && e["args"]["step"].is_number_integer()) << e.dump();
      used.insert({pid, e["tid"].get<int>()});
    } else {
      ASSERT_EQ(e["ph"], "M") << e.dump();
      const std::string n = e["name"].get<std::string>();
      if (n == "process_name") processes.insert(pid);
      if (n == "thread_name") threads[{pid, e["tid"].get<int>()}] = e["args"]["name"].get<std::string>();
      EXPECT_TRUE(n == "process_name" || n == "thread_name" || n == "process_sort_index" || n == "thread_sort_index")
          << e.dump();
    }
  }
  for (const auto& [pid, tid] : used) {
    EXPECT_TRUE(processes.count(pid)) << "process " << pid << " is not named";
    EXPECT_TRUE(threads.count({pid, tid})) << "thread " << pid << "/" << tid << " is not named";
  }
}

// The trace file at `path`, parsed and checked by check_chrome_trace (the caller asserts
// !HasFatalFailure() after it); `names` receives its track names.
inline json load_trace(const std::string& path, TrackNames& names) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  const json t = json::parse(ss.str());
  check_chrome_trace(t, names);
  return t;
}

// The seconds covered by a set of intervals, each instant once.
inline double union_seconds(std::vector<std::pair<double, double>> iv) {
  std::sort(iv.begin(), iv.end());
  double total = 0, end = -1e300;
  for (const auto& [a, b] : iv) {
    if (b <= end) continue;
    total += b - std::max(a, end);
    end = b;
  }
  return 1e-6 * total;
}

// Busy seconds per resource from the spans of the steps `keep` accepts, named as the run reports
// them: a device stream and a disk by their track ("compute", "disk vda"), the host workers together
// as "host". A stream or a disk is busy while any of its spans is open (the union); the host's busy
// time is its workers' times added up, as the engine counts it (two workers at once count twice).
template <class Keep>
std::map<std::string, double> busy_from_spans(const json& t, const TrackNames& names, Keep keep) {
  std::map<std::string, std::vector<std::pair<double, double>>> spans;
  std::map<std::string, double> busy;
  for (const json& e : t["traceEvents"]) {
    if (e["ph"] != "X" || !keep(e["args"]["step"].get<std::int64_t>())) continue;
    const double ts = e["ts"].get<double>(), dur = e["dur"].get<double>();
    if (e["pid"] == 4) continue;  // the stores' queues: each transfer lies inside its disk's busy time
    if (e["pid"] == 2) {          // the host's threads
      busy["host"] += 1e-6 * dur;
      continue;
    }
    spans[names.at({e["pid"].get<int>(), e["tid"].get<int>()})].push_back({ts, ts + dur});
  }
  for (const auto& [name, iv] : spans) busy[name] = union_seconds(iv);
  return busy;
}

// Within 1 % (and a nanosecond, for the rounding of a time of zero or a few microseconds).
inline void expect_agree(double from_spans, double reported, const std::string& what) {
  EXPECT_LE(std::abs(from_spans - reported), 0.01 * reported + 1e-9)
      << what << ": spans " << from_spans << " s, reported " << reported << " s";
}

// The names of the spans on each track.
inline std::map<std::string, std::set<std::string>> span_names(const json& t, const TrackNames& names) {
  std::map<std::string, std::set<std::string>> out;
  for (const json& e : t["traceEvents"])
    if (e["ph"] == "X") out[names.at({e["pid"].get<int>(), e["tid"].get<int>()})].insert(e["name"]);
  return out;
}

// The metrics file's busy_s per step.
inline std::map<std::int64_t, json> metrics_busy(const std::string& path) {
  std::ifstream f(path);
  std::map<std::int64_t, json> out;
  for (std::string line; std::getline(f, line);) {
    const json m = json::parse(line);
    if (m.contains("busy_s")) out[m["step"].get<std::int64_t>()] = m["busy_s"];
  }
  return out;
}

// Every resource's busy time in each step the trace holds, from its spans, against the metrics file's.
inline void expect_spans_match_metrics(const json& t, const TrackNames& names,
                                       const std::map<std::int64_t, json>& reported) {
  for (const json& s : t["zinf"]["steps"]) {
    const std::int64_t step = s.get<std::int64_t>();
    ASSERT_TRUE(reported.count(step)) << "step " << step << " is not in the metrics file";
    const auto busy = busy_from_spans(t, names, [&](std::int64_t x) { return x == step; });
    for (const auto& [name, sec] : reported.at(step).items())
      expect_agree(busy.count(name) ? busy.at(name) : 0.0, sec.get<double>(),
                   "step " + std::to_string(step) + " " + name);
    for (const auto& [name, sec] : busy)
      EXPECT_TRUE(reported.at(step).contains(name)) << "step " << step << ": spans on " << name << ", no busy figure";
  }
}

}  // namespace zinf::test
