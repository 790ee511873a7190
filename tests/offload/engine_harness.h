// engine_harness.h — the offload engine driven by a synthetic model, for the engine's tests: the same
// gradients through any placement, overlap mode and device give the same masters.
//
// The synthetic model reads two weights of each unit in the forward and writes a gradient that
// depends on them, on the step, the micro batch and the unit, so a wrong or stale window changes the
// result. On a device whose ops are stream-ordered (the async CPU device) it does that reading and
// writing as compute-stream work, exactly where a GPU's kernels would, so a handoff without an event
// is caught by the jitter.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "zinf/backends/cpu.h"
#include "zinf/device.h"
#include "zinf/offload/engine.h"
#include "zinf/offload/placement.h"

namespace zinf::offload::test {

namespace fs = std::filesystem;

struct Dir {
  fs::path p;
  explicit Dir(const std::string& tag = "zinf-engine-test")
      : p(fs::temp_directory_path() / (tag + "-" + std::to_string(::getpid()))) {
    fs::create_directories(p);
  }
  ~Dir() { fs::remove_all(p); }
};

// The bytes of the plan row `name` on tier `tier` (0 when the plan has no such row).
inline std::uint64_t plan_row(const std::vector<Row>& rows, const std::string& name, int tier) {
  for (const Row& r : rows)
    if (r.name == name) return r.bytes[static_cast<std::size_t>(tier)];
  return 0;
}

// The bytes of the NVMe stores' files under `dir` (their names start with "store.").
inline std::uint64_t swap_file_bytes(const fs::path& dir) {
  std::uint64_t total = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file() && e.path().filename().string().rfind("store.", 0) == 0) total += e.file_size();
  return total;
}

// The engine holds exactly the plan's bytes on every tier, and every handoff of its step graph is
// made by a stage that claimed it.
inline void expect_holds_the_plan(const Engine& e, const Plan& plan) {
  const TierBytes held = e.held_bytes();
  for (int t = 0; t < kTiers; ++t) EXPECT_EQ(held[t], plan.totals[t]) << tier_name(static_cast<Tier>(t));
  const auto unclaimed = e.unclaimed_handoffs();
  EXPECT_TRUE(unclaimed.empty()) << unclaimed.front();
}

inline EngineConfig config(OffloadDevice opt, OffloadDevice param, Precision prec, std::int64_t ga, Overlap ov,
                           const std::string& dir) {
  EngineConfig c;
  c.plan.unit_params = {5000, 20000, 9000, 20000, 300};
  c.plan.persistent = {true, false, false, false, true};
  c.plan.precision = prec;
  c.plan.optimizer = opt;
  c.plan.param = param;
  c.plan.grad_accum = ga;
  c.plan.sub_group_size = 8192;
  c.plan.reduce_bucket_size = 4096;
  c.plan.optimizer_buffer_count = 3;
  c.plan.prefetch_depth = 1;
  c.optimizer_store.parent = c.param_store.parent = dir;
  c.optimizer_store.io.block_size = c.param_store.io.block_size = 64 << 10;
  c.host_threads = 2;
  c.plan.overlap = ov;
  c.kernels = make_cpu_engine_kernels;
  return c;
}

// Makes the engine rank comm->rank() of comm->size() (null: one rank alone): its communicator and
// the plan's ranks.
inline void use_comm(EngineConfig& c, Comm* comm) {
  c.comm = comm;
  c.plan.world = comm ? comm->size() : 1;
  c.plan.rank = comm ? comm->rank() : 0;
}

inline void init(std::size_t u, float* p, std::size_t n) {
  std::mt19937 rng(static_cast<std::uint32_t>(u + 1));
  std::normal_distribution<float> nd(0.0f, 0.05f);
  for (std::size_t i = 0; i < n; ++i) p[i] = nd(rng);
}

// Every unit's master, m and v as whole tensors (what a checkpoint holds).
struct States {
  std::vector<std::vector<float>> master, m, v;
};

// Runs `steps` steps on `dev`; returns every unit's master. As rank `rank` of `world` data-parallel
// ranks (c.comm), micro batch m is the global micro batch m·world + rank — the gradients one rank
// with world × the accumulation would see. `load`: states written into the engine before step
// `first`; `save`: receives the states after the last step.
inline std::vector<std::vector<float>> run_on(Device& dev, const EngineConfig& c, int steps, int rank = 0,
                                              int world = 1, int first = 1, const States* load = nullptr,
                                              States* save = nullptr) {
  std::vector<std::vector<float>> out;
  const bool on_stream = dev.ops_stream_ordered();
  {
    Engine e(c, dev, [&](std::size_t u, float* p) { init(u, p, c.plan.unit_params[u]); });
    if (load)
      for (std::size_t u = 0; u < c.plan.unit_params.size(); ++u)
        e.write_states(u, load->master[u].data(), load->m[u].data(), load->v[u].data());
    auto wsum = std::make_shared<std::vector<float>>(c.plan.unit_params.size());
    for (int s = first; s < first + steps; ++s) {
      for (std::int64_t mb = 0; mb < c.plan.grad_accum; ++mb) {
        e.begin_micro_batch(mb);
        e.begin_forward();
        for (std::size_t u = 0; u < c.plan.unit_params.size(); ++u) {
          const float* w = static_cast<const float*>(e.weights(u));
          const std::size_t n = c.plan.unit_params[u];
          auto read = [wsum, w, u, n] { (*wsum)[u] = w[7] + w[n - 1]; };
          if (on_stream)
            dev.launch(StreamRole::compute, read);
          else
            read();
          e.done_with(u);
        }
        e.begin_backward();
        const auto j = static_cast<std::size_t>(mb * world + rank);
        for (std::size_t u = c.plan.unit_params.size(); u-- > 0;) {
          float* g = e.grads(u);
          const std::size_t n = c.plan.unit_params[u];
          auto write = [wsum, g, u, n, s, j] {
            for (std::size_t i = 0; i < n; ++i)
              g[i] += 0.01f * std::sin(static_cast<float>(i * (u + 1) + 31 * static_cast<std::size_t>(s) + 7 * j)) +
                      0.1f * (*wsum)[u];
          };
          if (on_stream)
            dev.launch(StreamRole::compute, write);
          else
            write();
          e.grads_done(u);
        }
      }
      StepOptions o;
      o.loss_scale = c.plan.precision == Precision::fp16 ? 1024 : 1;
      o.gradient_clipping = 1.0;
      o.hyper.lr = 1e-2f;
      o.hyper.weight_decay = 0.01f;
      o.step = s;
      const StepOutcome r = e.step(o);
      EXPECT_TRUE(r.finite);
      EXPECT_GT(r.norm, 0.0);
    }
    for (std::size_t u = 0; u < c.plan.unit_params.size(); ++u) {
      out.emplace_back(c.plan.unit_params[u]);
      e.read_master(u, out.back().data());
    }
    if (save) {
      *save = States{};
      for (std::size_t u = 0; u < c.plan.unit_params.size(); ++u) {
        save->master.emplace_back(c.plan.unit_params[u]), save->m.emplace_back(c.plan.unit_params[u]), save->v.emplace_back(c.plan.unit_params[u]);
        e.read_states(u, save->master.back().data(), save->m.back().data(), save->v.back().data());
      }
    }
    EXPECT_LE(e.pinned_peak(), e.pinned_capacity());
  }
  EXPECT_EQ(dev.in_use(), 0u);
  return out;
}

// One step's forward and backward of every micro batch, on a synchronous device (the model's reads
// and writes inline), with the gradients run_on gives; `poison`: unit 0's gradient is infinite.
inline void forward_backward(Engine& e, const EngineConfig& c, int s, int rank = 0, int world = 1,
                             bool poison = false) {
  std::vector<float> wsum(c.plan.unit_params.size());
  for (std::int64_t mb = 0; mb < c.plan.grad_accum; ++mb) {
    e.begin_micro_batch(mb);
    e.begin_forward();
    for (std::size_t u = 0; u < c.plan.unit_params.size(); ++u) {
      const float* w = static_cast<const float*>(e.weights(u));
      wsum[u] = w[7] + w[c.plan.unit_params[u] - 1];
      e.done_with(u);
    }
    e.begin_backward();
    const auto j = static_cast<std::size_t>(mb * world + rank);
    for (std::size_t u = c.plan.unit_params.size(); u-- > 0;) {
      float* g = e.grads(u);
      for (std::size_t i = 0; i < static_cast<std::size_t>(c.plan.unit_params[u]); ++i)
        g[i] += 0.01f * std::sin(static_cast<float>(i * (u + 1) + 31 * static_cast<std::size_t>(s) + 7 * j)) +
                0.1f * wsum[u];
      if (poison && u == 0) g[3] = INFINITY;
      e.grads_done(u);
    }
  }
}

// One micro batch of the engine's unit protocol with a constant gradient: every unit's weights in
// forward order, then every unit's gradient set to `grad` in backward order (the failure tests).
inline void constant_gradient_pass(Engine& e, const EngineConfig& c, float grad) {
  e.begin_micro_batch(0);
  e.begin_forward();
  for (std::size_t u = 0; u < c.plan.unit_params.size(); ++u) {
    e.weights(u);
    e.done_with(u);
  }
  e.begin_backward();
  for (std::size_t u = c.plan.unit_params.size(); u-- > 0;) {
    float* g = e.grads(u);
    std::fill(g, g + c.plan.unit_params[u], grad);
    e.grads_done(u);
  }
}

// ---- the speculative Update's tests (run_on's model, step by step) ----

inline StepOptions options(int s, double clip) {
  StepOptions o;
  o.gradient_clipping = clip;
  o.hyper.lr = 1e-2f;
  o.hyper.weight_decay = 0.01f;
  o.step = s;
  return o;
}

inline States read_all(Engine& e, const EngineConfig& c) {
  States st;
  for (std::size_t u = 0; u < c.plan.unit_params.size(); ++u) {
    st.master.emplace_back(c.plan.unit_params[u]), st.m.emplace_back(c.plan.unit_params[u]), st.v.emplace_back(c.plan.unit_params[u]);
    e.read_states(u, st.master.back().data(), st.m.back().data(), st.v.back().data());
  }
  return st;
}

// Every unit's compute copy as the model sees it (fp32 runs: the copy is the master's bits).
inline std::vector<std::vector<float>> weights_of(Engine& e, const EngineConfig& c) {
  std::vector<std::vector<float>> w;
  e.begin_forward();
  for (std::size_t u = 0; u < c.plan.unit_params.size(); ++u) {
    const float* p = static_cast<const float*>(e.weights(u));
    w.emplace_back(p, p + c.plan.unit_params[u]);
    e.done_with(u);
  }
  return w;
}

inline bool same_bits(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t u = 0; u < a.size(); ++u)
    if (a[u].size() != b[u].size() || std::memcmp(a[u].data(), b[u].data(), a[u].size() * 4) != 0) return false;
  return true;
}

// Waits until the speculation in flight has updated something and then stopped (its gradient gate
// or its backup bound), at most 20 s.
inline void wait_for_speculation(Engine& e, std::int64_t before) {
  std::int64_t seen = -1;
  for (int i = 0; i < 2000; ++i) {
    const std::int64_t now = e.speculation_counts().updated;
    if (now > before && now == seen) return;
    seen = now;
    std::this_thread::sleep_for(std::chrono::milliseconds(10 + (now > before ? 90 : 0)));
  }
  ADD_FAILURE() << "nothing was updated speculatively";
}

// The same on a fresh CPU device.
inline std::vector<std::vector<float>> run(const EngineConfig& c, int steps, std::size_t* peak = nullptr,
                                           std::size_t budget = 64 << 20, const CpuDeviceOptions& o = {}) {
  auto dev = make_cpu_device(budget, o);
  auto out = run_on(*dev, c, steps);
  if (peak) *peak = dev->peak();
  return out;
}

}  // namespace zinf::offload::test
