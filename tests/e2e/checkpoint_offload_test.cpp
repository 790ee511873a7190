// checkpoint_offload_test.cpp — activation_checkpointing.cpu_checkpointing: the checkpointed block
// inputs go to pinned host memory behind the forward and come back one block ahead of the backward.
// The parameters must equal those of the run that keeps its checkpoints on the device bit for bit —
// on the synchronous CPU device, and on the asynchronous, jittered one (where a missing event moves
// the digest) — for both families, fp32 and bf16, with and without gradient accumulation; and the
// device memory the run takes must fall by what `zinf plan` says. Seeds per configuration:
// ZINF_ASYNC_SEEDS (default 3). Jitter finds a missing event only on some seeds, so the model is also
// run on a device that makes one side of every handoff slow on purpose (the copies, or the compute
// stream): each of the four events, left out, then changes the gradients on every run.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "../common/forwarding_device.h"
#include "app/config/config.h"
#include "app/plan/plan.h"
#include "app/train/train.h"
#include "model/lm.h"
#include "small_train.h"
#include "zinf/backends/backend.h"
#include "zinf/backends/cpu.h"

namespace zinf {
namespace {

namespace fs = std::filesystem;

const std::string kSwap =
    (fs::temp_directory_path() / ("zinf-checkpoint-offload-" + std::to_string(::getpid()))).string();

int seeds() {
  const char* v = std::getenv("ZINF_ASYNC_SEEDS");
  return v && *v ? std::max(1, std::atoi(v)) : 3;
}

// Five blocks: checkpoints 0–3 of the six leave the device (the last two stay), so every slot is
// reused and refilled more than once in each direction.
std::vector<std::string> base(std::vector<std::string> extra) {
  std::vector<std::string> o = {"model.n_layer=5", "model.activation_checkpointing=true"};
  o.insert(o.end(), extra.begin(), extra.end());
  return o;
}
std::vector<std::string> offloaded(std::vector<std::string> o) {
  o.push_back("activation_checkpointing.cpu_checkpointing=true");
  return o;
}
std::vector<std::string> jittered(std::vector<std::string> o, std::uint64_t seed) {
  o.push_back("device.async=true");
  o.push_back("device.jitter_seed=" + std::to_string(seed));
  o.push_back("device.jitter_us=100");
  return o;
}

TrainResult run(const std::vector<std::string>& overrides) {
  return train(parse_config(test::small_train_config(kSwap), overrides), TrainHooks{});
}
std::string digest(const std::vector<std::string>& overrides) { return run(overrides).params_digest; }

const std::vector<std::string> kLlama = {"model.family=llama", "model.n_kv_head=1", "model.d_ff=48",
                                         "model.tie_embeddings=false"};

class CheckpointOffload : public ::testing::Test {
 protected:
  void SetUp() override { fs::create_directories(kSwap); }
  void TearDown() override { fs::remove_all(kSwap); }
};

// Every precision × GA of one family: the synchronous device, then the jittered asynchronous one.
void expect_equal_sync_and_jittered(const std::vector<std::string>& family, std::uint64_t seed) {
  for (const char* prec : {"fp16.enabled=false", "bf16.enabled=true"})
    for (const char* ga : {"gradient_accumulation_steps=1", "gradient_accumulation_steps=2"}) {
      SCOPED_TRACE(std::string(prec) + " " + ga);
      std::vector<std::string> extra = {"fp16.enabled=false", prec, ga};
      extra.insert(extra.end(), family.begin(), family.end());
      const std::vector<std::string> o = base(extra);
      const std::string ref = digest(o);
      EXPECT_EQ(digest(offloaded(o)), ref) << "synchronous";
      for (int k = 0; k < seeds(); ++k, ++seed) EXPECT_EQ(digest(jittered(offloaded(o), seed)), ref) << "seed " << seed;
    }
}

TEST_F(CheckpointOffload, GptEqualsCheckpointsOnTheDeviceSyncAndJittered) { expect_equal_sync_and_jittered({}, 501); }

TEST_F(CheckpointOffload, LlamaEqualsCheckpointsOnTheDeviceSyncAndJittered) {
  expect_equal_sync_and_jittered(kLlama, 513);
}

// With the parameters and the optimizer offloaded too, every stream carries the engine's traffic
// beside the checkpoints'.
TEST_F(CheckpointOffload, EqualsCheckpointsOnTheDeviceWithEverythingOffloaded) {
  const std::vector<std::string> o =
      base({"zero_optimization.offload_optimizer.device=cpu", "zero_optimization.offload_param.device=cpu"});
  const std::string ref = digest(o);
  EXPECT_EQ(digest(offloaded(o)), ref);
  for (std::uint64_t seed = 601; seed < 601 + static_cast<std::uint64_t>(seeds()); ++seed)
    EXPECT_EQ(digest(jittered(offloaded(o), seed)), ref) << "seed " << seed;
}

// The fast kernels store the checkpoints in bf16 (rows on 16-byte boundaries).
TEST_F(CheckpointOffload, FastKernelsEqualCheckpointsOnTheDevice) {
  const std::vector<std::string> o = base({"fp16.enabled=false", "bf16.enabled=true", "device.kernels=fast"});
  const std::string ref = digest(o);
  EXPECT_EQ(digest(offloaded(o)), ref);
  EXPECT_EQ(digest(jittered(offloaded(o), 701)), ref);
}

// The run's peak device memory falls by the checkpoints that live on the host — four of six rows of
// B·T·C fp32 — and `zinf plan`'s device total falls by the same bytes, which it shows as pinned.
TEST_F(CheckpointOffload, DeviceBytesFallByThePlannedRows) {
  const std::vector<std::string> o = base({"fp16.enabled=false"});
  const std::uint64_t row = 2 * 16 * 32 * 4;  // micro batch 2, seq 16, d_model 32, fp32 storage
  const std::uint64_t off = 4 * row;          // checkpoints 0–3 of 0–5
  const TrainResult kept = run(o), moved = run(offloaded(o));
  EXPECT_EQ(kept.peak_device_bytes - moved.peak_device_bytes, off);
  // The copies are timed on their streams (what `zinf bench step` reports); none without them.
  EXPECT_GT(moved.checkpoints.d2h, 0);
  EXPECT_GT(moved.checkpoints.h2d, 0);
  EXPECT_EQ(kept.checkpoints.d2h + kept.checkpoints.h2d + kept.checkpoints.wait, 0);

  auto plan_of = [](const std::vector<std::string>& ov) {
    const Config c = parse_config(test::small_train_config(kSwap), ov);
    return offload::make_plan(make_plan_input(c, model_shape(c.model)));
  };
  const offload::Plan a = plan_of(o), b = plan_of(offloaded(o));
  EXPECT_EQ(a.totals[0] - b.totals[0], off);
  EXPECT_EQ(b.totals[1] - a.totals[1], off);
  EXPECT_EQ(a.pinned_pool, b.pinned_pool);  // the checkpoints' host rows are a pool of the model's
  const offload::Row* ckpt = nullptr;
  for (const auto& r : b.buffers)
    if (r.name == "activation ckpts") ckpt = &r;
  ASSERT_NE(ckpt, nullptr);
  EXPECT_EQ(ckpt->bytes[0], 2 * row);
  EXPECT_EQ(ckpt->bytes[1], off);
  EXPECT_EQ(Checkpoints::device_rows(6, true), 2u);
  EXPECT_EQ(Checkpoints::host_rows(6, true), 4u);
  EXPECT_EQ(Checkpoints::host_rows(2, true), 0u);  // one block: both checkpoints stay on the device
  EXPECT_EQ(Checkpoints::host_rows(6, false), 0u);
}

// The asynchronous CPU device with one side of the handoffs slowed: every checkpoint copy (and any
// other h2d/d2h copy) waits 2 ms on its stream first, or the compute stream sleeps 2 ms before every
// event recorded on it, so that whichever side an event orders arrives late.
class SlowDevice final : public test::ForwardingDevice {
 public:
  explicit SlowDevice(bool slow_copies) : ForwardingDevice(make_cpu_device(64 << 20, async())), copies_(slow_copies) {}
  void copy_to_device(void* dst, const void* src, std::size_t bytes, StreamRole s) override {
    if (copies_) launch(s, nap);
    ForwardingDevice::copy_to_device(dst, src, bytes, s);
  }
  void copy_to_host(void* dst, const void* src, std::size_t bytes, StreamRole s) override {
    if (copies_ && s != StreamRole::compute) launch(s, nap);
    ForwardingDevice::copy_to_host(dst, src, bytes, s);
  }
  EventHandle record(StreamRole s) override {
    if (!copies_ && s == StreamRole::compute) launch(s, nap);
    return ForwardingDevice::record(s);
  }

 private:
  static CpuDeviceOptions async() {
    CpuDeviceOptions o;
    o.async = true;
    return o;
  }
  static void nap() { std::this_thread::sleep_for(std::chrono::milliseconds(2)); }
  bool copies_;
};

// Two micro batches of forward and backward (gradients accumulated) of a five-block model; the row
// losses of both and every gradient, as bits.
std::vector<float> model_run(const ModelShape& s, bool offload, Device& dev, bool pin = true) {
  const int B = 2, R = B * s.seq_len;
  auto ops = backends::backend_for(DeviceType::cpu).make_ops(dev, Precision::fp32, 1, Kernels::reference);
  auto model = make_model(s, B, /*checkpointing=*/true, dev, *ops, offload, pin);
  std::vector<std::vector<float>> w, g;
  std::vector<const float*> wp;
  std::vector<float*> gp;
  std::vector<std::size_t> sizes;
  std::size_t unit = 0;
  for (const auto& lu : layer_units(s)) {
    w.emplace_back(static_cast<std::size_t>(lu.params));
    init_model_unit(w.back().data(), unit++, s, 7);
    g.emplace_back(static_cast<std::size_t>(lu.params), 0.0f);
    sizes.push_back(static_cast<std::size_t>(lu.params));
  }
  for (std::size_t u = 0; u < w.size(); ++u) wp.push_back(w[u].data()), gp.push_back(g[u].data());
  ResidentUnits src(wp, gp, sizes);
  std::vector<float> out;
  for (int mb = 0; mb < 2; ++mb) {
    std::vector<int> tok(static_cast<std::size_t>(R)), tg(static_cast<std::size_t>(R));
    for (int i = 0; i < R; ++i) {
      tok[static_cast<std::size_t>(i)] = (i * 7 + mb * 13) % s.vocab_size;
      tg[static_cast<std::size_t>(i)] = (i * 5 + mb * 3 + 1) % s.vocab_size;
    }
    model->forward(src, tok.data(), tg.data());
    model->backward(src, tok.data(), tg.data(), 1.0f / static_cast<float>(R));
    dev.synchronize();
    out.insert(out.end(), model->row_losses(), model->row_losses() + R);
  }
  for (const auto& v : g) out.insert(out.end(), v.begin(), v.end());
  return out;
}

TEST(CheckpointOffloadModel, LateCopiesOrLateComputeChangeNothing) {
  for (bool llama : {false, true}) {
    ModelShape s{5, 2, 32, 64, 16};  // n_layer, n_head, d_model, vocab, seq
    if (llama) {
      s.family = ModelFamily::llama;
      s.n_kv_head = 1;
      s.d_ff = 48;
      s.tie_embeddings = false;
    }
    auto plain = make_cpu_device(64 << 20);
    const std::vector<float> ref = model_run(s, false, *plain);
    for (bool slow_copies : {true, false}) {
      SCOPED_TRACE(std::string(llama ? "llama" : "gpt") + (slow_copies ? ", slow copies" : ", slow compute"));
      SlowDevice slow(slow_copies);
      const std::vector<float> got = model_run(s, true, slow);
      ASSERT_EQ(got.size(), ref.size());
      EXPECT_EQ(std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)), 0);
    }
  }
}

// pin_memory: false (offload_optimizer's or offload_param's) leaves the checkpoints' host rows
// pageable: the model copies to and from memory it never registered with the device (as CUDA copies
// pageable memory: read when called, written before the call returns), and nothing else changes —
// the gradients equal the pinned rows', and the trained parameters too.
TEST(CheckpointOffloadModel, PinMemoryFalseKeepsTheHostRowsPageable) {
  const ModelShape s{5, 2, 32, 64, 16};
  auto plain = make_cpu_device(64 << 20);
  const std::vector<float> ref = model_run(s, false, *plain);
  for (bool pin : {true, false}) {
    SCOPED_TRACE(pin ? "pinned" : "pageable");
    test::ForwardingDevice dev(make_cpu_device(64 << 20));
    dev.pageable_copies(true);  // unregistered rows are copied as CUDA copies pageable memory
    const std::vector<float> got = model_run(s, true, dev, pin);
    ASSERT_EQ(got.size(), ref.size());
    EXPECT_EQ(std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)), 0);
    const auto unregistered = dev.unregistered_copies();
    auto count = [&](const char* what) { return unregistered.count(what) ? unregistered.at(what) : 0; };
    if (pin) {
      EXPECT_EQ(count("copy_to_host") + count("copy_to_device"), 0);
    } else {  // four rows leave the device and come back, twice (two micro batches)
      EXPECT_EQ(count("copy_to_host"), 8);
      EXPECT_EQ(count("copy_to_device"), 8);
    }
  }
}

TEST_F(CheckpointOffload, PinMemoryFalseTrainsToTheSameParameters) {
  const std::vector<std::string> o = offloaded(base({"zero_optimization.offload_optimizer.device=cpu"}));
  auto unpinned = o;
  unpinned.push_back("zero_optimization.offload_optimizer.pin_memory=false");
  EXPECT_EQ(digest(unpinned), digest(o));
}

}  // namespace
}  // namespace zinf
