// zinf/trace.h — a timeline of what each resource of a run was busy with (train.trace_file,
// `zinf bench step --trace`; docs/trace.md): one span per piece of busy time, on the track of the
// resource that ran it — a device stream, a host thread, a disk.
//
// The spans are recorded where the busy times are measured (zinf/device.h, the offload engine's
// host workers, the NVMe disk meters), from the same clock reads, so the timeline and the busy
// figures cannot disagree. A resource's busy time is taken once per step (Engine::take_times), and
// each span is tagged with its resource's *window*: how many takes that resource had counted when it
// counted the span's time, read under the lock the take holds. The trainer then names each window
// in order — a step to keep, or one to drop (an evaluation's) — so a span belongs to exactly the step
// whose busy figure holds its time, whichever thread recorded it and however the step boundaries
// fall. Only the first `steps` kept steps are held: after them every span is refused at once, so a
// long run holds a bounded timeline.
//
// Cost: nothing is recorded without a Trace (every caller holds a null pointer then). Thread-safety:
// every call may be made from any thread.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace zinf {

class Trace {
 public:
  using Clock = std::chrono::steady_clock;
  // The process a track is drawn under: the device's streams, the host's threads, the disks (busy
  // time: the union of what is in flight), and the NVMe stores' queues (each transfer from submit to
  // completion, named by what it moves: informational, inside its disk's busy time, not added to it).
  enum class Group { device = 1, host = 2, nvme = 3, queue = 4 };
  struct Track {
    Group group;
    std::string name;  // "compute", "h2d", "trainer", "Update worker", "disk vda"
  };
  struct Span {
    int track = 0;
    std::string name;        // "Fetch", "forward", "Update", …
    std::int64_t unit = -1;  // the layer unit, -1 when none
    std::int64_t window = 0;
    double t0 = 0, t1 = 0;  // seconds since origin()
    std::string detail;     // what a queue's transfer moved ("block.3.sg0"), empty elsewhere
  };

  // Keeps the first `steps` steps named by keep() (at least one).
  explicit Trace(std::int64_t steps) : steps_(std::max<std::int64_t>(1, steps)), origin_(Clock::now()) {}
  Trace(const Trace&) = delete;
  Trace& operator=(const Trace&) = delete;

  Clock::time_point origin() const { return origin_; }
  std::int64_t steps() const { return steps_; }

  // The track named `name` under `group`, made on first use.
  int track(Group group, const std::string& name) {
    std::lock_guard<std::mutex> lk(mu_);
    return track_locked(group, name);
  }
  // Names the calling thread's host track (a worker, when it starts).
  void name_this_thread(const std::string& name) {
    std::lock_guard<std::mutex> lk(mu_);
    threads_[std::this_thread::get_id()] = track_locked(Group::host, name);
  }
  // The calling thread's host track: its name, or "host thread N" for a thread that gave none.
  int this_thread_track() {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = threads_.find(std::this_thread::get_id());
    if (it != threads_.end()) return it->second;
    const int t = track_locked(Group::host, "host thread " + std::to_string(threads_.size() + 1));
    threads_[std::this_thread::get_id()] = t;
    return t;
  }

  // A busy span [t0, t1) on `track`, counted in its resource's window `window`.
  void span(int track, std::string name, std::int64_t unit, Clock::time_point t0, Clock::time_point t1,
            std::int64_t window, std::string detail = {}) {
    std::lock_guard<std::mutex> lk(mu_);
    if (full_locked() || t1 < t0) return;
    spans_.push_back({track, std::move(name), unit, window, seconds(t0), seconds(t1), std::move(detail)});
  }
  bool full() const {
    std::lock_guard<std::mutex> lk(mu_);
    return full_locked();
  }

  // The trainer, right after each take of the busy times, in order: the window just taken is step
  // `step` (kept while fewer than steps() are), or is dropped with its spans.
  void keep(std::int64_t step) {
    std::lock_guard<std::mutex> lk(mu_);
    if (kept_ < steps_) {
      windows_.push_back(step);
      ++kept_;
    } else {
      windows_.push_back(kDropped);
    }
    erase_dropped_locked();
  }
  void drop() {
    std::lock_guard<std::mutex> lk(mu_);
    windows_.push_back(kDropped);
    erase_dropped_locked();
  }
  // Windows named so far (keep and drop): the window a span recorded now on a thread that also takes
  // the busy times (the trainer's) is counted in.
  std::int64_t windows() const {
    std::lock_guard<std::mutex> lk(mu_);
    return static_cast<std::int64_t>(windows_.size());
  }

  // What was kept: the tracks, and the spans of kept windows with their step, in recording order.
  std::vector<Track> tracks() const {
    std::lock_guard<std::mutex> lk(mu_);
    return tracks_;
  }
  std::vector<std::pair<std::int64_t, Span>> kept_spans() const {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<std::pair<std::int64_t, Span>> out;
    for (const Span& s : spans_)
      if (s.window < static_cast<std::int64_t>(windows_.size()) &&
          windows_[static_cast<std::size_t>(s.window)] != kDropped)
        out.emplace_back(windows_[static_cast<std::size_t>(s.window)], s);
    return out;
  }
  // The steps kept, in order.
  std::vector<std::int64_t> kept_steps() const {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<std::int64_t> out;
    for (std::int64_t w : windows_)
      if (w != kDropped) out.push_back(w);
    return out;
  }

 private:
  static constexpr std::int64_t kDropped = -1;
  double seconds(Clock::time_point t) const { return std::chrono::duration<double>(t - origin_).count(); }
  bool full_locked() const { return kept_ >= steps_; }
  int track_locked(Group group, const std::string& name) {
    for (std::size_t i = 0; i < tracks_.size(); ++i)
      if (tracks_[i].group == group && tracks_[i].name == name) return static_cast<int>(i);
    tracks_.push_back({group, name});
    return static_cast<int>(tracks_.size() - 1);
  }
  // Spans of dropped windows go at once, so an evaluation between steps holds nothing.
  void erase_dropped_locked() {
    const auto n = static_cast<std::int64_t>(windows_.size());
    spans_.erase(std::remove_if(spans_.begin(), spans_.end(),
                                [&](const Span& s) {
                                  return s.window < n && windows_[static_cast<std::size_t>(s.window)] == kDropped;
                                }),
                 spans_.end());
  }

  const std::int64_t steps_;
  const Clock::time_point origin_;
  mutable std::mutex mu_;
  std::vector<Track> tracks_;
  std::map<std::thread::id, int> threads_;
  std::vector<Span> spans_;
  std::vector<std::int64_t> windows_;  // per window: its step, or kDropped
  std::int64_t kept_ = 0;
};

}  // namespace zinf
