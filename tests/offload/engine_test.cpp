// engine_test.cpp — the offload engine without a model: the same gradients through every placement
// and both overlap modes give bit-identical masters; windows hold the right weights; budgets hold;
// an NVMe read failure during the Update fails cleanly.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <random>

#include "../common/error_of.h"
#include "../common/forwarding_device.h"
#include "engine_harness.h"
#include "zinf/backends/cpu.h"
#include "zinf/comm.h"
#include "zinf/cpu_adam/convert.h"
#include "zinf/cpu_adam/spec.h"
#include "zinf/device.h"
#include "zinf/device_memory.h"
#include "zinf/error.h"
#include "zinf/offload/buffer_specs.h"
#include "zinf/offload/engine.h"

namespace zinf::offload {
namespace {

using namespace test;

TEST(OffloadEngine, EveryPlacementAndOverlapModeIsBitIdentical) {
  Dir dir;
  for (Precision prec : {Precision::fp32, Precision::fp16, Precision::bf16}) {
    for (std::int64_t ga : {1, 2}) {
      const auto ref = run(config(OffloadDevice::none, OffloadDevice::none, prec, ga, Overlap::none, dir.p), 3);
      for (auto opt : {OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme})
        for (auto param : {OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme})
          for (auto ov : {Overlap::exact, Overlap::none}) {
            SCOPED_TRACE(::testing::Message()
                         << "prec " << static_cast<int>(prec) << " ga " << ga << " opt " << static_cast<int>(opt)
                         << " param " << static_cast<int>(param) << " overlap " << static_cast<int>(ov));
            const auto got = run(config(opt, param, prec, ga, ov, dir.p), 3);
            for (std::size_t u = 0; u < ref.size(); ++u)
              ASSERT_EQ(std::memcmp(got[u].data(), ref[u].data(), ref[u].size() * 4), 0) << "unit " << u;
          }
    }
  }
  EXPECT_TRUE(fs::is_empty(dir.p));  // every swap directory was removed
}

// zero_optimization.optimizer_states: in each format, every placement and overlap mode gives one
// master bit for bit (the tiers hold, walk and hand the Update the same encoded m and v); and the
// format really applies (bf16 and q8 give other masters than fp32, and than each other).
TEST(OffloadEngine, EachStateFormatIsBitIdenticalOverEveryPlacement) {
  using cpu_adam::StateFormat;
  Dir dir;
  std::vector<std::vector<std::vector<float>>> refs;
  for (StateFormat f : {StateFormat::fp32, StateFormat::bf16, StateFormat::q8}) {
    auto cfg = [&](OffloadDevice opt, OffloadDevice param, Overlap ov) {
      EngineConfig c = config(opt, param, Precision::bf16, 2, ov, dir.p);
      c.plan.optimizer_states = f;
      return c;
    };
    refs.push_back(run(cfg(OffloadDevice::none, OffloadDevice::none, Overlap::none), 3));
    for (auto opt : {OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme})
      for (auto param : {OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme})
        for (auto ov : {Overlap::exact, Overlap::none}) {
          SCOPED_TRACE(::testing::Message() << cpu_adam::state_format_name(f) << " opt " << to_string(opt) << " param "
                                            << to_string(param) << " overlap " << static_cast<int>(ov));
          const auto got = run(cfg(opt, param, ov), 3);
          for (std::size_t u = 0; u < got.size(); ++u)
            ASSERT_EQ(std::memcmp(got[u].data(), refs.back()[u].data(), got[u].size() * 4), 0) << "unit " << u;
        }
  }
  for (int a = 0; a < 3; ++a)
    for (int b = a + 1; b < 3; ++b) EXPECT_NE(refs[a], refs[b]) << "formats " << a << " and " << b;
  EXPECT_TRUE(fs::is_empty(dir.p));
}

// Checkpoints see fp32 states in every format: states read after two steps and written into a fresh
// engine (of any tier) continue exactly as the uninterrupted run — read decodes, write encodes, and
// decoding what was encoded from a decoded state gives it back. Written into an engine of another
// format they arrive converted (encoded in that format).
TEST(OffloadEngine, StatesResumeExactlyInEveryFormatAndTier) {
  using cpu_adam::StateFormat;
  Dir dir;
  const OffloadDevice tiers[] = {OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme};
  for (StateFormat f : {StateFormat::fp32, StateFormat::bf16, StateFormat::q8}) {
    auto cfg = [&](OffloadDevice opt) {
      EngineConfig c = config(opt, OffloadDevice::none, Precision::fp16, 1, Overlap::exact, dir.p);
      c.plan.optimizer_states = f;
      return c;
    };
    const auto straight = run(cfg(OffloadDevice::none), 4);
    for (auto from : tiers) {
      States saved;
      auto dev = make_cpu_device(64 << 20);
      run_on(*dev, cfg(from), 2, 0, 1, 1, nullptr, &saved);
      for (auto to : tiers) {
        SCOPED_TRACE(::testing::Message() << cpu_adam::state_format_name(f) << " from " << to_string(from) << " to "
                                          << to_string(to));
        States again;
        run_on(*dev, cfg(to), 0, 0, 1, 3, &saved, &again);  // written and read back as they are
        EXPECT_EQ(again.m, saved.m);
        EXPECT_EQ(again.v, saved.v);
        const auto resumed = run_on(*dev, cfg(to), 2, 0, 1, 3, &saved);
        for (std::size_t u = 0; u < resumed.size(); ++u)
          ASSERT_EQ(std::memcmp(resumed[u].data(), straight[u].data(), resumed[u].size() * 4), 0) << "unit " << u;
      }
    }
  }
  // fp32 states written into a q8 engine come back as their q8 encoding, decoded.
  States saved, got;
  auto dev = make_cpu_device(64 << 20);
  EngineConfig c = config(OffloadDevice::cpu, OffloadDevice::none, Precision::fp16, 1, Overlap::exact, dir.p);
  run_on(*dev, c, 2, 0, 1, 1, nullptr, &saved);
  c.plan.optimizer_states = StateFormat::q8;
  run_on(*dev, c, 0, 0, 1, 3, &saved, &got);
  for (std::size_t u = 0; u < saved.m.size(); ++u) {
    const std::size_t n = saved.m[u].size();
    std::vector<std::uint8_t> codes(n);
    std::vector<float> scales(cpu_adam::state_scales(StateFormat::q8, n)), want(n);
    cpu_adam::encode_states(StateFormat::q8, cpu_adam::StateKind::v, saved.v[u].data(), codes.data(), scales.data(), n);
    cpu_adam::decode_states(StateFormat::q8, cpu_adam::StateKind::v, codes.data(), scales.data(), want.data(), n);
    EXPECT_EQ(got.v[u], want) << "unit " << u;
    EXPECT_NE(got.v[u], saved.v[u]) << "unit " << u;
  }
}

// Device kernels whose Update keeps fp32 states only (takes_states) refuse another format with the
// optimizer on the device — one error naming the key — and take it with the optimizer offloaded.
TEST(OffloadEngine, ADeviceKernelWithoutTheFormatRefusesItOnTheDevice) {
  Dir dir;
  struct Fp32Only final : EngineKernels {
    std::unique_ptr<EngineKernels> k;
    void zero(void* p, std::size_t b, StreamRole s) override { k->zero(p, b, s); }
    void to_half(const float* a, void* b, std::size_t n, cpu_adam::HalfType t, StreamRole s) override {
      k->to_half(a, b, n, t, s);
    }
    void from_half(const void* a, float* b, std::size_t n, cpu_adam::HalfType t, StreamRole s) override {
      k->from_half(a, b, n, t, s);
    }
    void copy(void* d, const void* a, std::size_t b, StreamRole s) override { k->copy(d, a, b, s); }
    void add(float* a, const float* x, std::size_t n, StreamRole s) override { k->add(a, x, n, s); }
    std::vector<std::vector<double>> block_sums(const std::vector<NormInput>& in, StreamRole s) override {
      return k->block_sums(in, s);
    }
    void adam_update(const cpu_adam::AdamStep& st, const cpu_adam::UpdateChunk& c, StreamRole s) override {
      k->adam_update(st, c, s);
    }
    bool takes_states(cpu_adam::StateFormat f) const override { return f == cpu_adam::StateFormat::fp32; }
  };
  for (auto opt : {OffloadDevice::none, OffloadDevice::cpu}) {
    EngineConfig c = config(opt, OffloadDevice::none, Precision::bf16, 1, Overlap::exact, dir.p);
    c.plan.optimizer_states = cpu_adam::StateFormat::bf16;
    c.kernels = [](Device& d, cpu_adam::HostThreads& t) {
      auto w = std::make_unique<Fp32Only>();
      w->k = make_cpu_engine_kernels(d, t);
      return w;
    };
    auto dev = make_cpu_device(64 << 20);
    if (opt == OffloadDevice::cpu) {
      EXPECT_NO_THROW(Engine(c, *dev, [&](std::size_t u, float* p) { init(u, p, c.plan.unit_params[u]); }));
      continue;
    }
    const std::string what = ::zinf::test::error_of<Error>([&] { Engine(c, *dev, [&](std::size_t u, float* p) { init(u, p, c.plan.unit_params[u]); }); });
    EXPECT_NE(what.find("zero_optimization.optimizer_states \"bf16\""), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

TEST(OffloadEngine, WindowsKeepDeviceMemoryBounded) {
  Dir dir;
  std::size_t peak_off = 0, peak_none = 0;
  run(config(OffloadDevice::nvme, OffloadDevice::nvme, Precision::fp16, 1, Overlap::exact, dir.p), 2, &peak_off);
  run(config(OffloadDevice::none, OffloadDevice::none, Precision::fp16, 1, Overlap::exact, dir.p), 2, &peak_none);
  EXPECT_LT(peak_off * 2, peak_none);  // the device holds the persistent units and two windows only
  const EngineConfig c = config(OffloadDevice::nvme, OffloadDevice::nvme, Precision::fp16, 1, Overlap::exact, dir.p);
  EXPECT_EQ(peak_off, Engine::device_bytes(c));  // and exactly what the engine planned
}

TEST(OffloadEngine, AllocatesExactlyWhatThePlanSays) {
  Dir dir;
  for (auto opt : {OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme})
    for (auto param : {OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme})
      for (Precision prec : {Precision::fp32, Precision::bf16})
        for (auto f : {cpu_adam::StateFormat::fp32, cpu_adam::StateFormat::q8}) {
        SCOPED_TRACE(::testing::Message() << "opt " << static_cast<int>(opt) << " param " << static_cast<int>(param)
                                          << " states " << cpu_adam::state_format_name(f));
        EngineConfig c = config(opt, param, prec, 2, Overlap::exact, dir.p);
        c.plan.optimizer_states = f;
        auto dev = make_cpu_device(64 << 20);
        Engine e(c, *dev, [&](std::size_t u, float* p) { init(u, p, c.plan.unit_params[u]); });
        EXPECT_EQ(dev->in_use(), Engine::device_bytes(c));
        EXPECT_EQ(e.pinned_capacity(), Engine::pinned_bytes(c));
      }
}

// One rank of `world` that never communicates: enough to build an engine as that rank (construction
// runs no collectives), so that one process can check what every rank of a world allocates.
class RankOnly final : public Comm {
 public:
  RankOnly(int rank, int world) : rank_(rank), world_(world) {}
  int rank() const override { return rank_; }
  int size() const override { return world_; }
  std::string backend() const override { return "test"; }
  void alltoallv(const void*, const std::vector<std::size_t>&, void*, const std::vector<std::size_t>&, std::size_t,
                 void*) override {
    fail();
  }
  void allgatherv(void*, const std::vector<std::size_t>&, std::size_t, void*) override { fail(); }
  void allgatherv(const void*, void*, const std::vector<std::size_t>&, std::size_t, void*) override { fail(); }
  void broadcast(void*, std::size_t, int, void*) override { fail(); }
  void barrier() override { fail(); }
  std::unique_ptr<Comm> dup() override { return std::make_unique<RankOnly>(rank_, world_); }
  [[noreturn]] void abort(int) override { std::abort(); }

 private:
  [[noreturn]] static void fail() { throw Error("this test's communicator runs no collectives"); }
  int rank_, world_;
};

// For every ZeRO stage, optimizer and parameter tier, precision, accumulation and world size (every
// rank of it), the engine holds on each tier exactly the plan's bytes — as the tiers count them: the
// device's bytes in use, the pinned pool's blocks (the pool is exactly full), the host memory the
// engine allocated, the swap files on disk. And its stages claim every handoff of the placement's step graph.
TEST(OffloadEngine, HoldsThePlansBytesOnEveryTier) {
  Dir dir;
  const OffloadDevice tiers[] = {OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme};
  int engines = 0;
  for (int world : {1, 2, 3})
    for (int stage = 0; stage <= 3; ++stage) {
      if (world == 1 && stage > 0) continue;  // one rank partitions nothing
      for (auto opt : tiers)
        for (auto param : tiers)
          for (Precision prec : {Precision::fp32, Precision::bf16})
            for (std::int64_t ga : {1, 2}) {
              if (world > 1 && ga > 1) continue;  // several ranks always sum in fp32, as GA > 1 does
              for (int rank = 0; rank < world; ++rank) {
                const std::string what = "world " + std::to_string(world) + " rank " + std::to_string(rank) +
                                         " stage " + std::to_string(stage) + " optimizer " +
                                         std::string(to_string(opt)) + " param " + std::string(to_string(param)) + " " +
                                         std::string(to_string(prec)) + " GA " + std::to_string(ga);
                SCOPED_TRACE(what);
                EngineConfig c = config(opt, param, prec, ga, Overlap::exact, dir.p);
                // Units that split unevenly over 2 and 3 ranks (shards are 64 Ki-aligned) and one at the
                // persistence threshold (kept whole at stage 3).
                c.plan.unit_params = {5000, 140000, 70000, 131073, 300};
                c.plan.sub_group_size = 32768;
                c.plan.reduce_bucket_size = 40960;
                c.plan.persistence_threshold = 70000;
                c.plan.stage = stage;
                RankOnly comm(rank, world);
                if (world > 1) use_comm(c, &comm);
                const Plan plan = make_plan(c.plan);
                auto dev = make_cpu_device(64 << 20);
                Engine e(c, *dev, [&](std::size_t u, float* p) { std::fill(p, p + c.plan.unit_params[u], 0.01f); });
                expect_holds_the_plan(e, plan);
                const TierBytes held = e.held_bytes();
                EXPECT_EQ(dev->in_use(), held[static_cast<int>(Tier::device)]);
                EXPECT_EQ(e.pinned_capacity(), held[static_cast<int>(Tier::pinned)]);
                EXPECT_EQ(swap_file_bytes(dir.p), held[static_cast<int>(Tier::nvme)]);
                ++engines;
              }
            }
    }
  EXPECT_EQ(engines, 36 + 2 * 72 + 3 * 72);
}

// device_grad_accum: the engine holds exactly the plan's bytes, which add an fp32 sum per unit (and a
// 16-bit rounding buffer) on the device, land fp32 buckets instead of 16-bit ones and keep no device
// GradOut staging; it applies only with GA > 1 and one rank.
TEST(OffloadEngine, GradientsSummedOnTheDeviceArePlannedAndHeld) {
  Dir dir;
  for (auto opt : {OffloadDevice::cpu, OffloadDevice::nvme})
    for (auto param : {OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme})
      for (Precision prec : {Precision::fp32, Precision::bf16}) {
        SCOPED_TRACE("optimizer " + std::string(to_string(opt)) + " param " + std::string(to_string(param)) + " " +
                     std::string(to_string(prec)));
        EngineConfig c = config(opt, param, prec, 2, Overlap::exact, dir.p);
        if (param != OffloadDevice::none) c.plan.stage = 3;
        const Plan host_sum = make_plan(c.plan);
        c.plan.device_grad_accum = true;
        const Plan plan = make_plan(c.plan);
        constexpr int D = static_cast<int>(Tier::device), H = static_cast<int>(Tier::host);
        const std::uint64_t n = std::accumulate(c.plan.unit_params.begin(), c.plan.unit_params.end(), std::uint64_t{0});
        auto row = [](const Plan& p, const std::string& name, int t) {
          std::uint64_t b = 0;
          for (const auto& r : p.states)
            if (r.name == name) b += r.bytes[t];
          for (const auto& r : p.buffers)
            if (r.name == name) b += r.bytes[t];
          return b;
        };
        EXPECT_EQ(row(plan, "grad32", D), 4 * n) << "an fp32 sum of every unit on the device";
        EXPECT_EQ(row(host_sum, "grad32", D), 0u);
        EXPECT_EQ(row(plan, "grad32", H), row(host_sum, "grad32", H)) << "the host gradient stays";
        EXPECT_EQ(row(plan, "grad out staging", D), 0u);
        EXPECT_GT(plan.totals[D], host_sum.totals[D]);
        auto dev = make_cpu_device(64 << 20);
        {
          Engine e(c, *dev, [&](std::size_t u, float* p) { std::fill(p, p + c.plan.unit_params[u], 0.01f); });
          const TierBytes held = e.held_bytes();
          for (int t = 0; t < kTiers; ++t) EXPECT_EQ(held[t], plan.totals[t]) << tier_name(static_cast<Tier>(t));
          EXPECT_EQ(dev->in_use(), held[D]);
        }
        EngineConfig ga1 = c;
        ga1.plan.grad_accum = 1;
        EXPECT_FALSE(BufferSpecs(ga1.plan).layout().device_accum) << "nothing to sum with GA 1";
      }
}

// A device that counts the host memory registered with it (page-locked, on CUDA).
class RegisterCountingDevice final : public ::zinf::test::ForwardingDevice {
 public:
  explicit RegisterCountingDevice(std::size_t budget) : ForwardingDevice(make_cpu_device(budget)) {}
  void register_host(void* p, std::size_t bytes) override {
    registered += bytes;
    ForwardingDevice::register_host(p, bytes);
  }
  std::size_t registered = 0;
};

// pin_memory false: the staging pool is pageable and not registered with the device, and the plan
// counts it in the host column — the engine holds exactly that; the pool is as large as with pinning.
TEST(OffloadEngine, PageableStagingIsPlannedAndHeldAsHostMemory) {
  Dir dir;
  for (auto opt : {OffloadDevice::cpu, OffloadDevice::nvme})
    for (auto param : {OffloadDevice::none, OffloadDevice::cpu}) {
      SCOPED_TRACE("optimizer " + std::string(to_string(opt)) + " param " + std::string(to_string(param)));
      EngineConfig c = config(opt, param, Precision::bf16, 2, Overlap::exact, dir.p);
      if (param != OffloadDevice::none) c.plan.stage = 3;
      const Plan pinned = make_plan(c.plan);
      c.plan.pin_memory = false;
      const Plan pageable = make_plan(c.plan);
      constexpr int P = static_cast<int>(Tier::pinned), H = static_cast<int>(Tier::host);
      ASSERT_GT(pinned.totals[P], 0u);
      EXPECT_TRUE(pinned.pinned);
      EXPECT_FALSE(pageable.pinned);
      EXPECT_EQ(pageable.totals[P], 0u);
      EXPECT_EQ(pageable.totals[H], pinned.totals[H] + pinned.totals[P]);
      EXPECT_EQ(pageable.pinned_pool, pinned.pinned_pool);
      for (const auto& r : pageable.buffers) EXPECT_EQ(r.bytes[P], 0u) << r.name;
      for (const auto& r : pageable.states) EXPECT_EQ(r.bytes[P], 0u) << r.name;
      for (bool pin : {true, false}) {
        c.plan.pin_memory = pin;
        RegisterCountingDevice dev(64 << 20);
        Engine e(c, dev, [&](std::size_t u, float* p) { std::fill(p, p + c.plan.unit_params[u], 0.01f); });
        const TierBytes held = e.held_bytes();
        const Plan& plan = pin ? pinned : pageable;
        for (int t = 0; t < kTiers; ++t) EXPECT_EQ(held[t], plan.totals[t]) << tier_name(static_cast<Tier>(t));
        EXPECT_EQ(e.pinned_capacity(), plan.pinned_pool);
        EXPECT_EQ(dev.registered, pin ? plan.pinned_pool : 0u);
      }
    }
  // The device's own Update writes offloaded parameter homes through mapped (page-locked) memory.
  EngineConfig mapped = config(OffloadDevice::none, OffloadDevice::cpu, Precision::bf16, 1, Overlap::exact, dir.p);
  mapped.plan.stage = 3;
  mapped.plan.pin_memory = false;
  auto dev = make_cpu_device(64 << 20);
  try {
    Engine e(mapped, *dev, [&](std::size_t u, float* p) { std::fill(p, p + mapped.plan.unit_params[u], 0.01f); });
    ADD_FAILURE() << "pageable homes for the device's Update were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pin_memory false"), std::string::npos) << e.what();
  }
  EXPECT_EQ(dev->in_use(), 0u);
}

// The CPU device with the CUDA caching allocator's accounting: each request takes its block
// (cuda_block_bytes), so in_use counts what a GPU's allocator would.
class BlockDevice final : public ::zinf::test::ForwardingDevice {
 public:
  explicit BlockDevice(std::size_t budget) : ForwardingDevice(make_cpu_device(budget)) {}
  void* allocate(std::size_t bytes, const std::string& what) override {
    return ForwardingDevice::allocate(static_cast<std::size_t>(cuda_block_bytes(bytes)), what);
  }
};

// On a device that allocates whole blocks (CUDA), an engine told so holds exactly its plan's device
// bytes as the allocator counts them (every buffer rounded to its block), and refuses a budget that
// only the exact bytes would fit, before allocating anything.
TEST(OffloadEngine, HoldsThePlansBlocksOnABlockDevice) {
  Dir dir;
  for (int world : {1, 3})
    for (auto opt : {OffloadDevice::none, OffloadDevice::cpu})
      for (auto param : {OffloadDevice::none, OffloadDevice::cpu}) {
        SCOPED_TRACE(std::string(to_string(opt)) + " " + std::string(to_string(param)) + " world " +
                     std::to_string(world));
        EngineConfig c = config(opt, param, Precision::bf16, world > 1 ? 1 : 2, Overlap::exact, dir.p);
        c.plan.unit_params = {5000, 140000, 70000, 300};  // none a multiple of 512 bytes in bf16 or fp32
        c.plan.persistent = {true, false, false, true};
        RankOnly comm(world - 1, world);  // the last rank: the shortest (here empty) shards
        if (world > 1) use_comm(c, &comm), c.plan.stage = 3;
        c.plan.device_blocks = true;
        const Plan plan = make_plan(c.plan);
        EngineConfig exact_cfg = c;
        exact_cfg.plan.device_blocks = false;
        const std::uint64_t exact = make_plan(exact_cfg.plan).totals[static_cast<int>(Tier::device)];
        const std::uint64_t blocks = plan.totals[static_cast<int>(Tier::device)];
        EXPECT_GT(blocks, exact);
        {
          BlockDevice dev(64 << 20);
          Engine e(c, dev, [&](std::size_t u, float* p) { std::fill(p, p + c.plan.unit_params[u], 0.01f); });
          EXPECT_EQ(e.held_bytes()[static_cast<int>(Tier::device)], blocks);
          EXPECT_EQ(dev.in_use(), blocks);
        }
        BlockDevice tight(static_cast<std::size_t>(exact));  // the exact bytes fit, the blocks do not
        EXPECT_THROW(Engine(c, tight, [&](std::size_t u, float* p) { std::fill(p, p + c.plan.unit_params[u], 0.01f); }),
                     DeviceMemoryError);
        EXPECT_EQ(tight.peak(), 0u);
      }
}

// Under the fast kernels a 16-bit run keeps no fp32 working weights on the device: the plan has no
// `work` buffers, the engine holds exactly the plan's bytes (4 bytes per parameter of a resident unit
// and per element of a window slot fewer than under the reference kernels), and weights(u) is the
// 16-bit compute copy itself, for resident and windowed units alike.
TEST(OffloadEngine, FastKernelsHoldNoFp32WorkingWeights) {
  Dir dir;
  for (auto param : {OffloadDevice::none, OffloadDevice::cpu}) {
    SCOPED_TRACE(std::string("param ") + std::string(to_string(param)));
    EngineConfig ref = config(OffloadDevice::cpu, param, Precision::bf16, 1, Overlap::exact, dir.p);
    EngineConfig fast = ref;
    fast.plan.fp32_work = false;  // the fast kernels
    const BufferSpecs ref_specs(ref.plan), fast_specs(fast.plan);
    std::uint64_t work_bytes = 0;
    for (const BufferSpec& b : ref_specs.all())
      if (b.what == Buffer::work || b.what == Buffer::work_slot) work_bytes += b.bytes * b.count;
    ASSERT_GT(work_bytes, 0u);
    for (const BufferSpec& b : fast_specs.all()) EXPECT_TRUE(b.what != Buffer::work && b.what != Buffer::work_slot);
    const Plan plan = make_plan(fast.plan);
    const int device = static_cast<int>(Tier::device);
    EXPECT_EQ(plan.totals[device] + work_bytes, make_plan(ref.plan).totals[device]);

    auto dev = make_cpu_device(64 << 20);
    Engine e(fast, *dev, [&](std::size_t u, float* p) { init(u, p, fast.plan.unit_params[u]); });
    EXPECT_EQ(e.held_bytes()[device], plan.totals[device]);
    EXPECT_EQ(dev->in_use(), plan.totals[device]);
    EXPECT_EQ(e.weights_precision(), Precision::bf16);
    e.begin_micro_batch(0);
    e.begin_forward();
    for (std::size_t u = 0; u < fast.plan.unit_params.size(); ++u) {
      const std::size_t n = fast.plan.unit_params[u];
      std::vector<float> master(n);
      init(u, master.data(), n);
      const auto* w = static_cast<const std::uint16_t*>(e.weights(u));
      EXPECT_EQ(w[0], cpu_adam::spec::fp32_to_bf16(master[0])) << "unit " << u;
      EXPECT_EQ(w[n - 1], cpu_adam::spec::fp32_to_bf16(master[n - 1])) << "unit " << u;
      e.done_with(u);
    }
    e.synchronize();
  }
}

TEST(OffloadEngine, RefusesAPlanOverTheBudgetBeforeAllocating) {
  Dir dir;
  auto dev = make_cpu_device(100000);
  const EngineConfig c = config(OffloadDevice::none, OffloadDevice::none, Precision::fp32, 1, Overlap::exact, dir.p);
  try {
    Engine e(c, *dev, [&](std::size_t u, float* p) { init(u, p, c.plan.unit_params[u]); });
    FAIL();
  } catch (const DeviceMemoryError& err) {
    EXPECT_NE(std::string(err.what()).find("the offload plan needs"), std::string::npos) << err.what();
  }
  EXPECT_EQ(dev->peak(), 0u);
}

TEST(OffloadEngine, NvmeReadFailureDuringTheUpdateFailsCleanly) {
  Dir dir;
  for (auto ov : {Overlap::exact, Overlap::none}) {
    nvme::FaultPlan faults;
    faults.fail_errno = EIO;
    EngineConfig c = config(OffloadDevice::nvme, OffloadDevice::cpu, Precision::bf16, 1, ov, dir.p);
    c.optimizer_faults = &faults;
    auto dev = make_cpu_device(64 << 20);
    bool failed = false;
    {
      Engine e(c, *dev, [&](std::size_t u, float* p) { init(u, p, c.plan.unit_params[u]); });
      faults.fail_at = faults.seen.load() + 3;  // a read of the first Update's sub-groups
      try {
        for (int s = 1; s <= 2; ++s) {
          constant_gradient_pass(e, c, 1e-3f);
          StepOptions o;
          o.hyper.lr = 1e-3f;
          o.step = s;
          e.step(o);
        }
        e.synchronize();
      } catch (const IoError& err) {
        failed = true;
        EXPECT_EQ(err.error_number(), EIO);
        EXPECT_NE(std::string(err.what()).find(dir.p.string()), std::string::npos) << err.what();
      }
    }
    EXPECT_TRUE(failed) << "overlap " << static_cast<int>(ov);
    EXPECT_TRUE(fs::is_empty(dir.p));  // the swap directory is gone
    EXPECT_EQ(dev->in_use(), 0u);
  }
}

}  // namespace
}  // namespace zinf::offload
