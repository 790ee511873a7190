// train_dp_test.cpp — `train()` across data-parallel ranks (run under mpirun): every ZeRO stage,
// placement and overlap mode gives one digest, equal to one rank with the ranks' accumulation — also
// run after run on the asynchronous jittered device, where the ranks' timings differ every time;
// checkpoints resume across world sizes; a job whose ranks disagree on the config is refused.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../e2e/metrics_steps.h"
#include "app/config/config.h"
#include "app/train/train.h"
#include "dp_world.h"
#include "nlohmann/json.hpp"
#include "zinf/error.h"

namespace zinf::test {
namespace {

namespace fs = std::filesystem;

// One directory for the whole job (rank 0's name), removed at the end.
struct SharedDir {
  std::string p;
  SharedDir() {
    char name[256] = {};
    if (world().rank() == 0)
      std::snprintf(name, sizeof name, "%s/zinf-dp-train-%d", fs::temp_directory_path().c_str(),
                    static_cast<int>(::getpid()));
    world().broadcast(name, sizeof name, 0);
    p = name;
    if (world().rank() == 0) fs::create_directories(p);
    world().barrier();
  }
  ~SharedDir() {
    world().barrier();
    if (world().rank() == 0) fs::remove_all(p);
  }
};

// Blocks of 110,592 parameters: split across ranks (shards are 64 Ki-aligned).
std::string dp_config(const std::string& dir) {
  return R"({"model": {"n_layer": 2, "n_head": 2, "d_model": 96, "vocab_size": 256, "seq_len": 16},
             "train": {"steps": 3, "eval_interval": 0, "eval_batches": 3, "seed": 5},
             "device": {"type": "cpu", "memory_budget": "256MiB", "threads": 1},
             "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "steps_per_print": 1000,
             "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}},
             "gradient_clipping": 0.5,
             "fp16": {"enabled": true, "initial_scale_power": 12},
             "zero_optimization": {"stage": 0, "sub_group_size": 50000, "reduce_bucket_size": 40000,
               "offload_optimizer": {"nvme_path": ")" +
         dir + R"("}, "offload_param": {"nvme_path": ")" + dir + R"("}}})";
}

TrainResult run(const std::string& dir, std::vector<std::string> over, bool solo = false,
                const std::string& resume = "") {
  static auto one = make_solo_comm();
  const int W = solo ? 1 : world().size();
  if (solo) over.push_back("gradient_accumulation_steps=" + std::to_string(world().size()));
  TrainHooks h;
  h.comm = solo ? one.get() : &world();
  h.resume = resume;
  return train(parse_config(dp_config(dir), over, "dp.json", W), h);
}

TEST(TrainDp, EveryStagePlacementAndOverlapGivesOneDigestEqualToOneRank) {
  ZINF_NEED_RANKS();
  SharedDir dir;
  const TrainResult one = run(dir.p, {}, /*solo=*/true);
  const std::vector<std::vector<std::string>> cases = {
      {"zero_optimization.stage=0"},
      {"zero_optimization.stage=1", "zero_optimization.offload_optimizer.device=cpu"},
      {"zero_optimization.stage=2", "zero_optimization.offload_optimizer.device=nvme"},
      {"zero_optimization.stage=2", "zero_optimization.offload_optimizer.device=cpu", "train.overlap=none"},
      {"zero_optimization.stage=3"},
      {"zero_optimization.stage=3", "zero_optimization.offload_optimizer.device=cpu",
       "zero_optimization.offload_param.device=cpu"},
      {"zero_optimization.stage=3", "zero_optimization.offload_optimizer.device=nvme",
       "zero_optimization.offload_param.device=nvme", "train.overlap=none"},
  };
  for (const auto& c : cases) {
    const TrainResult r = run(dir.p, c);
    std::string what;
    for (const auto& s : c) what += s + " ";
    EXPECT_EQ(r.params_digest, one.params_digest) << what;
    EXPECT_EQ(r.loss, one.loss) << what;          // the loss summed in the global micro-batch order
    EXPECT_EQ(r.val_loss, one.val_loss) << what;  // evaluation batches dealt round-robin
  }
  EXPECT_GT(one.first_val_loss, one.val_loss);
  // The Llama family, and the asynchronous jittered device, keep the contract too.
  const std::vector<std::string> llama = {"model.family=llama", "model.d_ff=192"};
  const TrainResult llama_one = run(dir.p, llama, true);
  auto with = [](std::vector<std::string> v, std::initializer_list<const char*> more) {
    for (const char* m : more) v.push_back(m);
    return v;
  };
  EXPECT_EQ(run(dir.p, with(llama, {"zero_optimization.stage=3", "zero_optimization.offload_optimizer.device=cpu",
                                    "zero_optimization.offload_param.device=cpu"}))
                .params_digest,
            llama_one.params_digest);
  EXPECT_NE(llama_one.params_digest, one.params_digest);
  const std::string seed = "device.jitter_seed=5";  // (every rank the same config)
  EXPECT_EQ(
      run(dir.p, {"zero_optimization.stage=3", "zero_optimization.offload_param.device=cpu",
                  "zero_optimization.offload_optimizer.device=cpu", "device.async=true", seed, "device.jitter_us=100"})
          .params_digest,
      one.params_digest);
}

// Evaluation batches that do not divide among the ranks, with more layers than parameter window
// slots at stage 3: a forward gathers partitioned parameters, so every rank runs as many evaluation
// forwards as the busiest (the others repeat one and drop its loss) and none waits for ever; the
// validation losses are one rank's.
TEST(TrainDp, UnevenEvaluationAtStage3MatchesOneRank) {
  ZINF_NEED_RANKS();
  SharedDir dir;
  const int W = world().size();
  const std::vector<std::string> base = {
      "model.n_layer=4", "train.eval_interval=1", "train.eval_batches=" + std::to_string(W + 1),
      "zero_optimization.stage3_prefetch_bucket_size=1", "zero_optimization.stage3_param_persistence_threshold=0"};
  const TrainResult one = run(dir.p, base, /*solo=*/true);
  for (const char* param : {"none", "cpu"}) {
    std::vector<std::string> over = base;
    over.push_back("zero_optimization.stage=3");
    over.push_back(std::string("zero_optimization.offload_param.device=") + param);
    TrainResult r;
    within(120, std::string("stage 3, parameters on ") + param, [&] { r = run(dir.p, over); });
    EXPECT_EQ(r.first_val_loss, one.first_val_loss) << param;
    EXPECT_EQ(r.val_loss, one.val_loss) << param;
    EXPECT_EQ(r.params_digest, one.params_digest) << param;
  }
}

// Repeats on the asynchronous jittered device: each case runs once per jitter seed 1…repeats (times
// ZINF_DP_REPEATS when set, for longer sweeps by hand) with exact overlap; every run must give the
// digest and loss of one rank with the ranks' accumulation. Returns one line per case that did not
// always agree ("x/y agree"); rank 0 prints every case's count when ZINF_DP_REPEATS is set.
std::string repeat_on_jittered_device(const std::string& dir, const std::vector<std::string>& base,
                                      const std::vector<std::vector<std::string>>& cases, int repeats) {
  if (const char* m = std::getenv("ZINF_DP_REPEATS")) repeats *= std::max(1, std::atoi(m));
  const TrainResult one = run(dir, base, /*solo=*/true);
  std::string failed;
  for (const auto& c : cases) {
    std::string what;
    for (const auto& s : c) what += s + " ";
    int agree = 0;
    std::string digests;
    for (int seed = 1; seed <= repeats; ++seed) {
      std::vector<std::string> over = base;
      over.insert(over.end(), c.begin(), c.end());
      for (const std::string& s : {std::string("device.async=true"), "device.jitter_seed=" + std::to_string(seed),
                                   std::string("device.jitter_us=100")})
        over.push_back(s);
      TrainResult r;
      within(120, what + "seed " + std::to_string(seed), [&] { r = run(dir, over); });
      if (r.params_digest == one.params_digest && r.loss == one.loss)
        ++agree;
      else
        digests += " " + r.params_digest;
    }
    if (agree < repeats)
      failed +=
          "\n  " + what + ": " + std::to_string(agree) + "/" + std::to_string(repeats) + " agree (" + digests + " )";
    if (std::getenv("ZINF_DP_REPEATS") && world().rank() == 0)
      std::printf("  %d ranks, %s: %d/%d agree\n", world().size(), what.c_str(), agree, repeats);
  }
  return failed.empty() ? failed : "differ from one rank's digest " + one.params_digest + ":" + failed;
}

// Stage 3 with exact overlap, repeated: the next forward's gathers run while the Update is still
// landing units, and every rank must issue them in one order whatever the timing — the blocks are
// all the same size, so two ranks gathering different units at the same point would silently swap
// parameters, not fail. Six blocks and a window that prefetches several of them ahead (and evicts).
TEST(TrainDp, Stage3ExactOverlapGivesOneRanksDigestOnEveryRepeat) {
  ZINF_NEED_RANKS();
  SharedDir dir;
  const std::string failed = repeat_on_jittered_device(
      dir.p, {"model.n_layer=6", "train.steps=4", "train.eval_batches=2"},
      {{"zero_optimization.stage=3"}, {"zero_optimization.stage=3", "zero_optimization.offload_optimizer.device=cpu"}},
      4);
  EXPECT_TRUE(failed.empty()) << failed;
}

// Every stage and every placement DeepSpeed allows (optimizer offload from stage 1, parameter
// offload at stage 3), once each on the jittered device with exact overlap.
TEST(TrainDp, EveryStageAndPlacementGivesOneDigestOnTheJitteredDevice) {
  ZINF_NEED_RANKS();
  SharedDir dir;
  std::vector<std::vector<std::string>> cases = {{"zero_optimization.stage=0"}};
  const std::string opt = "zero_optimization.offload_optimizer.device=",
                    param = "zero_optimization.offload_param.device=";
  for (const char* st : {"1", "2"})
    for (const char* o : {"none", "cpu", "nvme"})
      cases.push_back({std::string("zero_optimization.stage=") + st, opt + o});
  for (const char* o : {"none", "cpu", "nvme"})
    for (const char* p : {"none", "cpu", "nvme"}) cases.push_back({"zero_optimization.stage=3", opt + o, param + p});
  const std::string failed = repeat_on_jittered_device(dir.p, {"model.n_layer=4", "train.eval_batches=2"}, cases, 1);
  EXPECT_TRUE(failed.empty()) << failed;
}

TEST(TrainDp, CheckpointsResumeOnAnotherWorldSize) {
  ZINF_NEED_RANKS();
  SharedDir dir;
  const std::string ck = dir.p + "/ck", ck1 = dir.p + "/ck1", ck2 = dir.p + "/ck0";
  const std::vector<std::string> base = {"train.steps=4", "zero_optimization.stage=2",
                                         "zero_optimization.offload_optimizer.device=cpu"};
  const TrainResult straight = run(dir.p, base);
  auto with = [&](std::vector<std::string> v, const std::string& more) {
    v.push_back(more);
    return v;
  };
  // The ranks train two steps and checkpoint (rank 0 writes whole tensors); the same ranks resume.
  run(dir.p, with(with(base, "train.steps=2"), "train.checkpoint_dir=" + ck));
  world().barrier();  // rank 0 may still be writing when the others return
  EXPECT_TRUE(fs::exists(ck + "/step-00000002"));
  const TrainResult same = run(dir.p, with(base, "train.checkpoint_dir=" + ck2), false, ck + "/step-00000002");
  EXPECT_EQ(same.resumed_from, 2);
  EXPECT_EQ(same.params_digest, straight.params_digest) << "resumed on the same ranks";
  // One rank resumes it.
  if (world().rank() == 0) {  // (one process writes into a checkpoint directory)
    const TrainResult resumed_one = run(dir.p, with(base, "train.checkpoint_dir=" + ck), true, "latest");
    EXPECT_EQ(resumed_one.resumed_from, 2);
    EXPECT_EQ(resumed_one.params_digest, straight.params_digest);
  }
  // One rank trains two steps and checkpoints; the ranks resume from it, with stage 3.
  if (world().rank() == 0) run(dir.p, with(with(base, "train.steps=2"), "train.checkpoint_dir=" + ck1), true);
  world().barrier();
  const TrainResult resumed =
      run(dir.p,
          {"train.steps=4", "zero_optimization.stage=3", "zero_optimization.offload_param.device=cpu",
           "zero_optimization.offload_optimizer.device=cpu", "train.checkpoint_dir=" + ck1},
          false, "latest");
  EXPECT_EQ(resumed.resumed_from, 2);
  EXPECT_EQ(resumed.params_digest, straight.params_digest);
}

// ---- gradient streaming (offload_optimizer.gradient_streaming) across ranks ----

// A run's digest and every step's loss, loss scale, gradient norm and skip (rank 0's metrics file:
// the same path on every rank of a job, whose configs must agree; a solo run's is its rank's own).
struct Steps {
  std::string digest;
  std::vector<std::string> steps;  // rank 0 only
  std::int64_t rollbacks = 0, skipped = 0;
};

Steps run_steps(const std::string& dir, std::vector<std::string> over, bool solo = false) {
  const std::string metrics =
      dir + (solo ? "/metrics-solo-" + std::to_string(world().rank()) + ".jsonl" : std::string("/metrics.jsonl"));
  if (solo || world().rank() == 0) fs::remove(metrics);
  over.push_back("train.metrics_file=" + metrics);
  const TrainResult r = run(dir, over, solo);
  Steps out{r.params_digest, {}, r.rollbacks, r.skipped};
  if (solo || world().rank() == 0) out.steps = test::metrics_steps(metrics).steps;
  if (!solo) world().barrier();  // rank 0 has read the file before the next run rewrites it
  return out;
}

// Streamed gradients across ranks (GA 1; the optimizer on NVMe): the Reduce lands each unit's part
// this rank keeps in a ring slot, writes it to NVMe, and hands it to the speculative Update, or (with
// `speculative: false`) to the Update after the barrier, which reads it back. For ZeRO stages 1, 2
// and 3 (parameters on the device and on NVMe), with steps that never clip, sometimes clip (redone
// with the gradients read back) and always clip, and overflowing fp16 steps: the digest and every
// step's loss, loss scale, norm and skip equal the same ranks without streaming, on the jittered
// asynchronous device; and the ranks' norms equal one rank's with their accumulation, bit for bit.
TEST(TrainDp, StreamingGradientsGiveTheDigestAndNormsOfTheRunWithoutThem) {
  ZINF_NEED_RANKS();
  SharedDir dir;
  const bool full = world().size() == 2;  // 3 ranks (an odd world, an empty last shard): fewer cases
  const std::vector<std::vector<std::string>> settings = {
      {"gradient_clipping=1e9"},
      {"gradient_clipping=3"},
      {"gradient_clipping=0.05"},
      {"fp16.initial_scale_power=18", "fp16.hysteresis=1", "gradient_clipping=0", "train.steps=4"},
  };
  std::vector<std::vector<std::string>> placements = {
      {"zero_optimization.stage=1"}, {"zero_optimization.stage=2"}, {"zero_optimization.stage=3"}};
  if (full) placements.push_back({"zero_optimization.stage=3", "zero_optimization.offload_param.device=nvme"});
  std::uint64_t seed = 31;
  std::int64_t rollbacks = 0;
  for (std::size_t k = 0; k < settings.size(); ++k) {
    if (!full && k == 1) continue;
    std::string setting;
    for (const auto& x : settings[k]) setting += x + " ";
    std::vector<std::string> base = settings[k];
    base.push_back("zero_optimization.offload_optimizer.device=nvme");
    base.push_back("zero_optimization.stage=1");  // (one rank; each placement below sets its own)
    const Steps one = run_steps(dir.p, base, /*solo=*/true);
    EXPECT_FALSE(one.steps.empty()) << setting;
    if (k == 3) {  // some steps overflow and are skipped, the others applied
      EXPECT_GT(one.skipped, 0) << "the config does overflow";
      EXPECT_LT(one.skipped, static_cast<std::int64_t>(one.steps.size()));
    }
    for (const auto& placement : placements) {
      std::vector<std::string> o = base;
      o.insert(o.end(), placement.begin(), placement.end());
      std::string what = setting;
      for (const auto& x : placement) what += x + " ";
      auto without = o;
      without.push_back("zero_optimization.offload_optimizer.gradient_streaming=false");
      const Steps ref = run_steps(dir.p, without);
      EXPECT_EQ(ref.digest, one.digest) << what;
      if (world().rank() == 0) {
        EXPECT_EQ(ref.steps, one.steps) << what << "(the ranks' norms are one rank's)";
      }
      for (const char* speculative : {"true", "false"}) {
        auto with = o;
        for (const std::string& x :
             {std::string("zero_optimization.offload_optimizer.gradient_streaming=true"),
              "zero_optimization.offload_optimizer.speculative=" + std::string(speculative),
              std::string("device.async=true"), "device.jitter_seed=" + std::to_string(seed++),
              std::string("device.jitter_us=100")})
          with.push_back(x);
        Steps got;
        within(120, what + "streaming, speculative " + speculative, [&] { got = run_steps(dir.p, with); });
        EXPECT_EQ(got.digest, ref.digest) << what << "speculative " << speculative;
        EXPECT_EQ(got.skipped, ref.skipped) << what << "speculative " << speculative;
        if (world().rank() == 0) {
          EXPECT_EQ(got.steps, ref.steps) << what << "speculative " << speculative;
        }
        rollbacks += got.rollbacks;
      }
    }
  }
  // Some speculation ran ahead of a clipped or overflowed step, and was redone with the gradients read
  // back from NVMe or undone.
  EXPECT_GT(world().sum(static_cast<double>(rollbacks)), 0.0) << "no speculation redone or undone";
}

// The layer-major order (offload_optimizer.layer_major) across ranks, GA 3: every rank walks the same
// units in the same order, so each micro batch's buckets are reduced across ranks as they come, and
// each rank sums its part of a unit's micro batches one after another — in its host gradient, or with
// streaming in a ring slot. The digest and every step must be those of the micro-batch order on the
// synchronous device, for ZeRO stages 1-3 (and parameters on NVMe), clipping some steps.
TEST(TrainDp, LayerMajorGivesTheDigestOfTheMicroBatchOrder) {
  ZINF_NEED_RANKS();
  SharedDir dir;
  const bool full = world().size() == 2;
  std::vector<std::vector<std::string>> placements = {
      {"zero_optimization.stage=1"}, {"zero_optimization.stage=2"}, {"zero_optimization.stage=3"}};
  if (full) placements.push_back({"zero_optimization.stage=3", "zero_optimization.offload_param.device=nvme"});
  std::uint64_t seed = 61;
  for (const auto& placement : placements) {
    std::vector<std::string> o = {"zero_optimization.offload_optimizer.device=nvme", "gradient_accumulation_steps=3",
                                  "model.activation_checkpointing=true", "gradient_clipping=0.3"};
    o.insert(o.end(), placement.begin(), placement.end());
    std::string what;
    for (const auto& x : placement) what += x + " ";
    auto micro = o;
    micro.push_back("zero_optimization.offload_optimizer.layer_major=false");
    const Steps ref = run_steps(dir.p, micro);
    // Streaming with the speculative Update (two ring slots) and without it (one).
    for (const char* streaming : {"false", "true", "true speculative=false"}) {
      if (!full && streaming[0] == 't' && streaming[4] == ' ') continue;
      auto with = o;
      if (std::string(streaming) == "true speculative=false")
        with.push_back("zero_optimization.offload_optimizer.speculative=false");
      for (const std::string& x : {std::string("zero_optimization.offload_optimizer.layer_major=true"),
                                   "zero_optimization.offload_optimizer.gradient_streaming=" +
                                       std::string(streaming).substr(0, std::string(streaming).find(' ')),
                                   std::string("device.async=true"), "device.jitter_seed=" + std::to_string(seed++),
                                   std::string("device.jitter_us=100")})
        with.push_back(x);
      Steps got;
      within(120, what + "layer-major, streaming " + streaming, [&] { got = run_steps(dir.p, with); });
      EXPECT_EQ(got.digest, ref.digest) << what << "streaming " << streaming;
      if (world().rank() == 0) {
        EXPECT_EQ(got.steps, ref.steps) << what << "streaming " << streaming;
      }
    }
  }
}

TEST(TrainDp, RanksWithDifferentConfigsAreRefusedAtStart) {
  ZINF_NEED_RANKS();
  SharedDir dir;
  const std::string lr = world().rank() == 1 ? "optimizer.params.lr=0.001" : "optimizer.params.lr=0.003";
  try {
    run(dir.p, {lr});
    ADD_FAILURE() << "a job whose ranks disagree trained";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("different configs"), std::string::npos) << e.what();
  }
  // A config resolved for another world size (the batch rule) is refused too.
  try {
    TrainHooks h;
    h.comm = &world();
    train(parse_config(dp_config(dir.p), {}, "dp.json", 1), h);
    ADD_FAILURE() << "a config resolved for one rank trained on " << world().size();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("resolved for 1 rank"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace zinf::test
