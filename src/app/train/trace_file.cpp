// trace_file.cpp — a Trace as a Chrome-trace JSON file (trace_file.h).
#include "app/train/trace_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>

#include "io/files.h"
#include "zinf/error.h"

namespace zinf {
namespace {

const char* group_name(Trace::Group g) {
  switch (g) {
    case Trace::Group::device: return "device";
    case Trace::Group::host: return "host";
    case Trace::Group::nvme: return "nvme";
    case Trace::Group::queue: return "nvme queues";
  }
  return "?";
}

}  // namespace

nlohmann::json trace_json(const Trace& t, const nlohmann::json& about) {
  using nlohmann::json;
  const std::vector<Trace::Track> tracks = t.tracks();
  json events = json::array();
  std::set<int> used;  // tracks with spans: only those are named and drawn
  for (const auto& [step, s] : t.kept_spans()) {
    json args = {{"step", step}};
    if (s.unit >= 0) args["unit"] = s.unit;
    if (!s.detail.empty()) args["tensor"] = s.detail;
    events.push_back({{"name", s.name},
                      {"ph", "X"},
                      {"ts", 1e6 * s.t0},
                      {"dur", 1e6 * (s.t1 - s.t0)},
                      {"pid", static_cast<int>(tracks[static_cast<std::size_t>(s.track)].group)},
                      {"tid", s.track},
                      {"args", args}});
    used.insert(s.track);
  }
  std::set<int> pids;
  for (int k : used) {
    const Trace::Track& tr = tracks[static_cast<std::size_t>(k)];
    const int pid = static_cast<int>(tr.group);
    if (pids.insert(pid).second) {
      events.push_back(
          {{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"args", {{"name", group_name(tr.group)}}}});
      events.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", pid}, {"args", {{"sort_index", pid}}}});
    }
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", k}, {"args", {{"name", tr.name}}}});
    events.push_back(
        {{"name", "thread_sort_index"}, {"ph", "M"}, {"pid", pid}, {"tid", k}, {"args", {{"sort_index", k}}}});
  }
  json z = about.is_object() ? about : json::object();
  z["steps"] = t.kept_steps();
  z["trace_steps"] = t.steps();
  return {{"traceEvents", events}, {"displayTimeUnit", "ms"}, {"zinf", z}};
}

void write_trace_file(const Trace& t, const std::string& path, const nlohmann::json& about) {
  const std::string text = trace_json(t, about).dump() + "\n";
  OutputFile out(path, "train.trace_file");
  out.write(text.data(), text.size());
  out.commit();
}

void check_trace_path(const std::string& path, const std::string& what) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw ConfigError(what + " " + path + ": is a folder, not a file", "name a file such as trace.json");
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  const std::string dir = parent.empty() ? "." : parent.string();
  if (!std::filesystem::is_directory(dir, ec))
    throw ConfigError(what + " " + path + ": the folder " + dir + " does not exist");
  const std::string probe = (std::filesystem::path(dir) / (".zinf-write-test-" + std::to_string(::getpid()))).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) throw ConfigError(what + " " + path + ": cannot write in " + dir + ": " + std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
}

}  // namespace zinf
