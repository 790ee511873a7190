// zinf/jitter.h — seeded random delays before stream and worker jobs, so that work on different
// streams interleaves differently on every run. The asynchronous CPU device and the offload engine's
// host workers use it to expose a missing event: a buffer handed from one stream to another without
// an event is then read too early (or overwritten too soon) on some seed, and the run's digest moves.
//
// Each stream or worker owns one Jitter (its own lane), used only by the thread that runs its jobs,
// so the sequence of delays per lane depends on the seed alone. Seed 0 means no delays.
#pragma once

#include <chrono>
#include <cstdint>
#include <thread>

namespace zinf {

struct JitterSpec {
  std::uint64_t seed = 0;  // 0: off
  int max_us = 200;        // the longest single delay, microseconds
  bool enabled() const { return seed != 0 && max_us > 0; }
};

class Jitter {
 public:
  Jitter() = default;
  Jitter(const JitterSpec& s, std::uint64_t lane)
      : spec_(s), state_(s.seed * 0x9E3779B97F4A7C15ull + lane * 0xD1B54A32D192ED03ull + 1) {}
  // Sleeps before a job: half of the jobs run at once, most others after 1..max_us microseconds, and
  // one in 32 stalls for up to 20 × max_us — a stream that falls far behind, as a GPU stream does
  // behind a long kernel, so that a buffer reused a whole pass later is caught too.
  void delay() {
    if (!spec_.enabled()) return;
    const std::uint64_t r = next();
    if (r & 1) return;
    const std::uint64_t span = static_cast<std::uint64_t>(spec_.max_us) * ((r & 0x3e) == 0 ? 20 : 1);
    const auto us = static_cast<long>((r >> 8) % span) + 1;
    std::this_thread::sleep_for(std::chrono::microseconds(us));
  }
  bool enabled() const { return spec_.enabled(); }

 private:
  std::uint64_t next() {  // splitmix64
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  JitterSpec spec_{0, 0};
  std::uint64_t state_ = 0;
};

}  // namespace zinf
