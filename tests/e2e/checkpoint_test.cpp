// checkpoint_test.cpp — checkpoints and resume: bitwise-identical resume (also across placements and
// thread counts, with the loss scaler mid-flight), keep_last, corruption and truncation refused with
// the file and tensor named, `latest` falling back past a bad checkpoint, a full disk leaving the
// previous checkpoint intact, and a run killed with SIGKILL at random moments resuming to the
// uninterrupted digest.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "app/config/config.h"
#include "app/train/checkpoint.h"
#include "app/train/train.h"
#include "shell.h"
#include "zinf/error.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace zinf {
namespace {

namespace fs = std::filesystem;

class Checkpoints : public ::testing::Test {
 protected:
  fs::path dir = fs::temp_directory_path() / ("zinf-ckpt-test-" + std::to_string(::getpid()));
  void SetUp() override { fs::create_directories(dir / "swap"); }
  void TearDown() override { fs::remove_all(dir); }

  std::string cfg(int steps, const std::string& extra = "") const {
    return R"({"model": {"n_layer": 2, "n_head": 2, "d_model": 32, "vocab_size": 256, "seq_len": 16},
               "train": {"steps": )" +
           std::to_string(steps) + R"(, "eval_interval": 0, "eval_batches": 2, "seed": 5, "checkpoint_interval": 2,
                         "keep_last": 3, "checkpoint_dir": ")" +
           (dir / "ck").string() + R"("},
               "device": {"type": "cpu", "memory_budget": "256MiB", "threads": 1},
               "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "steps_per_print": 1000,
               "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}},
               "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 3, "total_num_steps": "auto"}},
               "fp16": {"enabled": true, "initial_scale_power": 24, "loss_scale_window": 3, "hysteresis": 1},
               "zero_optimization": {"stage": 3, "sub_group_size": 6000,
                 "offload_optimizer": {"nvme_path": ")" +
           (dir / "swap").string() + R"("}, "offload_param": {"nvme_path": ")" + (dir / "swap").string() + R"("}})" +
           extra + "}";
  }
  TrainResult run(int steps, const std::vector<std::string>& overrides = {}, const std::string& resume = "",
                  std::vector<std::string>* log = nullptr) {
    TrainHooks h;
    h.resume = resume;
    if (log) h.log = [log](const std::string& s) { log->push_back(s); };
    return train(parse_config(cfg(steps), overrides), h);
  }
  ModelShape shape() const { return ModelShape{2, 2, 32, 256, 16}; }
  void sigkill_resumes_exactly(const std::vector<std::string>& extra);
};

TEST_F(Checkpoints, ResumeIsBitwiseIdenticalAcrossPlacementsAndThreads) {
  const TrainResult full = run(10);
  EXPECT_GT(full.skipped, 0);  // the fp16 scaler was busy: its state must survive the checkpoint
  fs::remove_all(dir / "ck");
  run(4, {"train.keep_last=10"});  // checkpoints at steps 2 and 4
  ASSERT_TRUE(fs::exists(dir / "ck" / "step-00000004"));
  const TrainResult resumed = run(10, {"train.keep_last=10"}, "latest");
  EXPECT_EQ(resumed.resumed_from, 4);
  EXPECT_EQ(resumed.params_digest, full.params_digest);
  // Written with the states on the device, resumed with them on NVMe and 2 threads (and back).
  // (Steps 6 to 10 of the resumed run are there: going back to step 4 replaces them.)
  const TrainResult moved =
      run(10,
          {"zero_optimization.offload_optimizer.device=nvme", "zero_optimization.offload_param.device=cpu",
           "device.threads=2", "train.overwrite_checkpoints=true"},
          (dir / "ck" / "step-00000004").string());
  EXPECT_EQ(moved.params_digest, full.params_digest);
  EXPECT_TRUE(fs::is_empty(dir / "swap"));
}

// In each compressed state format the checkpoint (fp32, decoded exactly) resumes bit for bit — on the
// tier it was written from and on another; the manifest records the format. (A small initial loss
// scale, so that the first steps are not all skipped: the states change from step 1.)
TEST_F(Checkpoints, ResumeIsBitwiseIdenticalInEachStateFormat) {
  const std::string scale = "fp16.initial_scale_power=8";
  const std::string fp32 = run(6, {scale}).params_digest;
  for (const char* states : {"bf16", "8bit"}) {
    SCOPED_TRACE(states);
    const std::string mode = std::string("zero_optimization.optimizer_states=") + states;
    fs::remove_all(dir / "ck");
    const TrainResult full = run(6, {scale, mode});
    EXPECT_NE(full.params_digest, fp32);  // the mode applies
    fs::remove_all(dir / "ck");
    run(4, {scale, mode, "train.keep_last=10"});
    std::ifstream mf(dir / "ck" / "step-00000004" / "manifest.json");
    EXPECT_EQ(nlohmann::json::parse(mf)["optimizer_states"], states);
    std::vector<std::string> log;
    const TrainResult resumed = run(6, {scale, mode, "train.keep_last=10"}, "latest", &log);
    EXPECT_EQ(resumed.resumed_from, 4);
    EXPECT_EQ(resumed.params_digest, full.params_digest);
    for (const auto& l : log) EXPECT_EQ(l.find("converted"), std::string::npos) << l;
    const TrainResult moved = run(6,
                                  {scale, mode, "zero_optimization.offload_optimizer.device=nvme", "device.threads=2",
                                   "train.overwrite_checkpoints=true"},
                                  (dir / "ck" / "step-00000004").string());
    EXPECT_EQ(moved.params_digest, full.params_digest);
  }
  EXPECT_TRUE(fs::is_empty(dir / "swap"));
}

// Resumed under another state format, the fp32 states convert (encoded in the new format) with one
// note line; the run then trains in its own format (another digest than either uninterrupted run).
TEST_F(Checkpoints, ResumeUnderAnotherStateFormatConvertsWithOneNote) {
  const std::string scale = "fp16.initial_scale_power=8", q8mode = "zero_optimization.optimizer_states=8bit";
  const TrainResult fp32 = run(6, {scale});
  const TrainResult q8 = run(6, {scale, q8mode, "train.overwrite_checkpoints=true"});
  EXPECT_NE(q8.params_digest, fp32.params_digest);
  fs::remove_all(dir / "ck");
  run(4, {scale});
  std::vector<std::string> log;
  const TrainResult resumed = run(6, {scale, q8mode}, "latest", &log);
  EXPECT_EQ(resumed.resumed_from, 4);
  int notes = 0;
  for (const auto& l : log)
    if (l.find("converted") != std::string::npos) {
      ++notes;
      EXPECT_NE(l.find("kept as fp32, this run keeps them as 8bit"), std::string::npos) << l;
    }
  EXPECT_EQ(notes, 1);
  EXPECT_NE(resumed.params_digest, fp32.params_digest);
  EXPECT_NE(resumed.params_digest, q8.params_digest);
}

TEST_F(Checkpoints, KeepLastPrunesOlderCheckpoints) {
  run(10);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir / "ck")) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  // (and the folder's lock file; no step-N.pruned-PID is left behind)
  EXPECT_EQ(names, (std::vector<std::string>{".zinf-lock", "step-00000006", "step-00000008", "step-00000010"}));
  const auto m = nlohmann::json::parse(std::ifstream(dir / "ck" / "step-00000010" / "manifest.json"));
  EXPECT_EQ(m["format"], "zinf-checkpoint");
  EXPECT_EQ(m["tensors"].size(), 12u);  // 4 units × (master, m, v)
}

// Flips one bit of the byte at `off` in `file`, as a bad disk or cable would.
void flip_byte(const fs::path& file, std::uint64_t off) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(off));
  char ch;
  f.read(&ch, 1);
  ch = static_cast<char>(ch ^ 0x40);
  f.seekp(static_cast<std::streamoff>(off));
  f.write(&ch, 1);
}

TEST_F(Checkpoints, CorruptionIsNamedAndLatestFallsBack) {
  run(6);
  // Corrupt the newest checkpoint's states: one flipped byte inside block.1's Adam v.
  const fs::path bad = dir / "ck" / "step-00000006";
  const auto m = nlohmann::json::parse(std::ifstream(bad / "manifest.json"));
  std::uint64_t off = 0;
  for (const auto& t : m["tensors"])
    if (t["name"] == "block.1/adam.v") off = t["offset"].get<std::uint64_t>() + 17;
  flip_byte(bad / "states.bin", off);
  try {
    verify_checkpoint(bad.string(), shape());
    FAIL();
  } catch (const Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("states.bin"), std::string::npos) << w;
    EXPECT_NE(w.find("block.1/adam.v"), std::string::npos) << w;
  }
  EXPECT_THROW(run(8, {}, bad.string()), Error);  // an explicit bad checkpoint is refused
  std::vector<std::string> log;
  const TrainResult r = run(8, {}, "latest", &log);
  EXPECT_EQ(r.resumed_from, 4);
  bool said = false;
  for (const auto& l : log) said = said || l.find("falling back") != std::string::npos;
  EXPECT_TRUE(said);
  // Truncation and a different model shape.
  fs::resize_file(dir / "ck" / "step-00000004" / "states.bin", 1000);
  EXPECT_THROW(verify_checkpoint((dir / "ck" / "step-00000004").string(), shape()), Error);
  try {
    verify_checkpoint((dir / "ck" / "step-00000008").string(), ModelShape{3, 2, 32, 256, 16});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model shape differs"), std::string::npos) << e.what();
  }
}

TEST_F(Checkpoints, FullDiskLeavesThePreviousCheckpointIntact) {
  set_checkpoint_fault(2);  // the 2nd save of this process runs out of space half-way
  try {
    run(6);
    FAIL() << "the second checkpoint should have failed";
  } catch (const IoError& e) {
    EXPECT_EQ(e.error_number(), ENOSPC);
    EXPECT_NE(std::string(e.what()).find("states.bin"), std::string::npos) << e.what();
  }
  set_checkpoint_fault(0);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir / "ck")) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{".zinf-lock", "step-00000002"}));  // no torn temporary left behind
  verify_checkpoint((dir / "ck" / "step-00000002").string(), shape());
  EXPECT_TRUE(fs::is_empty(dir / "swap"));
}

// ---- a checkpoint directory is never damaged by a mistake ------------------------------------------------

using test::snapshot;

// The names in a checkpoint folder, its lock file (.zinf-lock) aside.
std::vector<std::string> entries(const fs::path& d) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(d))
    if (e.path().filename() != ".zinf-lock") names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// Rewrites a manifest through `edit` (as a user with an editor would; its checksum is left as it was).
std::string slurp_file(const fs::path& p) { return test::slurp(p.string()); }

void edit_manifest(const fs::path& ck, const std::function<void(nlohmann::json&)>& edit) {
  auto m = nlohmann::json::parse(std::ifstream(ck / "manifest.json"));
  edit(m);
  std::ofstream(ck / "manifest.json") << m.dump(1);
}

using test::count_errors;
using test::said;

// A checkpoint of another model shape or family is refused — one error, nothing written or deleted —
// rather than passed over as if it were damaged (which trained from scratch and let keep_last delete
// every original checkpoint).
TEST_F(Checkpoints, ResumeUnderAnotherShapeOrFamilyIsRefusedAndTouchesNothing) {
  run(6);  // steps 2, 4, 6
  const auto before = snapshot(dir / "ck");
  const std::vector<std::pair<std::vector<std::string>, std::string>> others = {
      {{"model.d_model=48"}, "model shape differs"},
      {{"model.seq_len=32"}, "model shape differs"},
      {{"model.family=llama", "model.n_kv_head=1", "model.d_ff=40"}, "the model family differs"},
  };
  for (const auto& [over, why] : others) {
    for (const std::string& which : {std::string("latest"), (dir / "ck" / "step-00000004").string()}) {
      try {
        run(8, over, which);
        ADD_FAILURE() << over[0] << " resumed " << which;
      } catch (const IncompatibleCheckpoint& e) {
        EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find(which == "latest" ? "step-00000006" : "step-00000004"), std::string::npos)
            << e.what();
      }
      EXPECT_EQ(snapshot(dir / "ck"), before) << over[0] << " " << which;
    }
  }
  // Another precision is honoured: the fp32 states carry over, the loss scaler starts from the config
  // (bf16's static 1, not the fp16 run's scale).
  std::vector<std::string> log;
  const TrainResult r = run(8, {"fp16.enabled=false", "bf16.enabled=true", "steps_per_print=1"}, "latest", &log);
  EXPECT_EQ(r.resumed_from, 6);
  EXPECT_TRUE(said(log, "the checkpoint was trained in fp16, this run is bf16")) << log.size();
  EXPECT_TRUE(said(log, "step     7/8 | ") && said(log, "| scale 1 |"));
  for (const auto& l : log) {
    if (l.rfind("step ", 0) == 0 && l.find("| scale ") != std::string::npos) {
      EXPECT_NE(l.find("| scale 1 |"), std::string::npos) << l;
    }
  }
}

// The same through the command line and with a checkpoint of a model of another family: exit code 2,
// one line, the directory as it was.
TEST_F(Checkpoints, TheCommandLineRefusesAnIncompatibleResumeWithExitTwo) {
  const std::string conf = (dir / "run.json").string();
  std::ofstream(conf) << cfg(3);
  const std::string zinf = std::string(ZINF_BIN) + " train --config " + conf;
  ASSERT_EQ(test::sh(zinf + " --set model.family=llama --set model.n_kv_head=1 --set model.d_ff=40").rc, 0);
  const auto before = snapshot(dir / "ck");
  const test::Result r = test::sh(zinf + " --resume");
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_EQ(count_errors(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("the model family differs (checkpoint llama, config gpt2)"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("step 0: val_loss"), std::string::npos) << "it started";
  EXPECT_EQ(snapshot(dir / "ck"), before);
}

// A checkpoint whose manifest names an optimizer-state format this zinf does not know (written by a
// later version, say) is refused — not passed over as damaged, which would resume from an older
// checkpoint and let keep_last delete this one — with one error line and exit code 2; nothing in the
// directory changes. The manifest carries a valid checksum, so the refusal is the format's.
TEST_F(Checkpoints, AnUnknownStateFormatIsRefusedWithExitTwoAndTouchesNothing) {
  const std::string conf = (dir / "run.json").string();
  std::ofstream(conf) << cfg(4);
  const std::string zinf = std::string(ZINF_BIN) + " train --config " + conf;
  ASSERT_EQ(test::sh(zinf).rc, 0);  // steps 2 and 4
  const fs::path four = dir / "ck" / "step-00000004";
  edit_manifest(four, [](nlohmann::json& m) {
    m["optimizer_states"] = "4bit";
    m.erase("manifest_xxh64");
    const std::string text = m.dump();  // the checksum is over the compact form without itself
    char h[17];
    std::snprintf(h, sizeof h, "%016llx", static_cast<unsigned long long>(XXH64(text.data(), text.size(), 0)));
    m["manifest_xxh64"] = h;
  });
  const auto before = snapshot(dir / "ck");
  try {
    verify_checkpoint(four.string(), shape());
    ADD_FAILURE() << "a manifest naming an unknown state format passed";
  } catch (const IncompatibleCheckpoint& e) {
    EXPECT_NE(std::string(e.what()).find("'4bit', which this zinf cannot convert"), std::string::npos) << e.what();
  }
  EXPECT_THROW(run(6, {}, "latest"), IncompatibleCheckpoint);  // no fall back to step 2
  const test::Result r = test::sh(zinf + " --resume --set train.steps=6");
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_EQ(count_errors(r.err), 1) << r.err;
  EXPECT_NE(r.err.find(four.string() + "/manifest.json"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("'4bit', which this zinf cannot convert (it knows fp32, bf16 and 8bit)"), std::string::npos)
      << r.err;
  EXPECT_EQ(r.out.find("val_loss"), std::string::npos) << "it started: " << r.out;
  EXPECT_EQ(snapshot(dir / "ck"), before);
}

// A run without --resume into a directory that holds checkpoints is refused; with
// train.overwrite_checkpoints the old ones stay until the new run's first checkpoint is written and
// verified, then all of them go (none is left to pass for the new run's latest).
TEST_F(Checkpoints, AFreshRunIntoADirectoryWithCheckpointsIsRefusedUnlessOverwriting) {
  run(3);  // steps 2 and 3
  const auto before = snapshot(dir / "ck");
  try {
    run(4);
    ADD_FAILURE() << "a fresh run wrote into a directory of checkpoints";
  } catch (const ConfigError& e) {
    const std::string w = std::string(e.what()) + " " + e.hint();
    EXPECT_NE(w.find("holds checkpoints (step-00000003, step-00000002)"), std::string::npos) << w;
    EXPECT_NE(w.find("--resume"), std::string::npos) << w;
    EXPECT_NE(w.find("train.overwrite_checkpoints"), std::string::npos) << w;
  }
  EXPECT_EQ(snapshot(dir / "ck"), before);
  // Overwriting, with the first checkpoint failing (a full disk): the old ones are all still there.
  set_checkpoint_fault(1);
  EXPECT_THROW(run(4, {"train.overwrite_checkpoints=true"}), IoError);
  set_checkpoint_fault(0);
  EXPECT_EQ(snapshot(dir / "ck"), before);
  // Overwriting, with a first checkpoint at step 1: the old steps 2 and 3 are replaced.
  std::vector<std::string> log;
  const TrainResult fresh = run(1, {"train.overwrite_checkpoints=true", "train.checkpoint_interval=1"}, "", &log);
  EXPECT_EQ(entries(dir / "ck"), (std::vector<std::string>{"step-00000001"}));
  EXPECT_TRUE(said(log, "2 checkpoint(s)")) << log.size();
  EXPECT_EQ(run(0, {}, "latest").params_digest, fresh.params_digest);
  // Going back to an older checkpoint with newer ones beside it is refused the same way.
  run(4, {"train.checkpoint_interval=1", "train.keep_last=5"}, "latest");  // steps 2, 3, 4
  const auto four = snapshot(dir / "ck");
  try {
    run(4, {}, (dir / "ck" / "step-00000002").string());
    ADD_FAILURE() << "resumed an older checkpoint beside newer ones";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("newer than"), std::string::npos) << e.what();
  }
  EXPECT_EQ(snapshot(dir / "ck"), four);
}

// A run killed while replacing checkpoints (overwrite_checkpoints, or a step saved again) had renamed
// them aside as step-N.old-PID. If it died before publishing its own checkpoint (its step-M.tmp-PID
// still there) they are the directory's real state and come back; if it had published, they were
// superseded and go. A live process's files are left alone.
TEST_F(Checkpoints, AnInterruptedReplacementIsUndoneOrFinishedByTheNextRun) {
  run(3);  // steps 2 and 3
  auto dead_pid = [] {
    const pid_t p = ::fork();
    if (p == 0) ::_exit(0);
    ::waitpid(p, nullptr, 0);
    return std::to_string(p);
  };
  const fs::path ck = dir / "ck";
  // Died before publishing: both checkpoints renamed aside, its temporary half written.
  const std::string a = dead_pid();
  fs::rename(ck / "step-00000002", ck / ("step-00000002.old-" + a));
  fs::rename(ck / "step-00000003", ck / ("step-00000003.old-" + a));
  fs::create_directories(ck / ("step-00000001.tmp-" + a));
  std::vector<std::string> log;
  const TrainResult resumed = run(4, {"train.checkpoint_interval=1"}, "latest", &log);
  EXPECT_EQ(resumed.resumed_from, 3) << "the renamed-aside checkpoints were not put back";
  EXPECT_TRUE(said(log, "restored")) << log.size();
  // Died after publishing: what it renamed aside is gone; a live process's leftovers stay.
  const std::string b = dead_pid(), live = std::to_string(::getppid());
  fs::create_directories(ck / ("step-00000002.old-" + b));
  fs::create_directories(ck / ("step-00000009.tmp-" + live));
  recover_interrupted_saves(ck.string(), nullptr);
  EXPECT_FALSE(fs::exists(ck / ("step-00000002.old-" + b)));
  EXPECT_TRUE(fs::exists(ck / ("step-00000009.tmp-" + live)));
  EXPECT_TRUE(fs::exists(ck / "step-00000004"));
}

// keep_last counts only verified checkpoints: a corrupt one is moved aside as step-N.corrupt with a
// line — never counted, never deleted — and the valid older one is kept.
TEST_F(Checkpoints, KeepLastCountsOnlyVerifiedCheckpoints) {
  const std::vector<std::string> two = {"train.keep_last=2", "train.checkpoint_interval=1"};
  run(3, two);  // steps 2 and 3
  const auto m = nlohmann::json::parse(std::ifstream(dir / "ck" / "step-00000003" / "manifest.json"));
  flip_byte(dir / "ck" / "step-00000003" / "states.bin", m["tensors"][4]["offset"].get<std::uint64_t>() + 9);
  std::vector<std::string> log;
  std::vector<std::string> over = two;
  over.push_back("train.checkpoint_interval=2");
  const TrainResult r = run(4, over, "latest", &log);  // from 2, writes 4
  EXPECT_EQ(r.resumed_from, 2);
  EXPECT_EQ(entries(dir / "ck"), (std::vector<std::string>{"step-00000002", "step-00000003.corrupt", "step-00000004"}));
  EXPECT_TRUE(said(log, "moved the corrupt")) << log.size();
  verify_checkpoint((dir / "ck" / "step-00000002").string(), shape());
  // An older checkpoint found corrupt when keep_last comes to it is moved aside too, not deleted.
  const auto m2 = nlohmann::json::parse(std::ifstream(dir / "ck" / "step-00000002" / "manifest.json"));
  flip_byte(dir / "ck" / "step-00000002" / "states.bin", m2["tensors"][0]["offset"].get<std::uint64_t>() + 3);
  log.clear();
  run(6, over, "latest", &log);  // from 4, writes 6: keep_last meets step 2
  EXPECT_EQ(entries(dir / "ck"), (std::vector<std::string>{"step-00000002.corrupt", "step-00000003.corrupt",
                                                           "step-00000004", "step-00000006"}));
  EXPECT_TRUE(said(log, "not counted by keep_last")) << log.size();
}

// The manifest is checksummed like the tensors: an edited step or data position is corruption, and
// `latest` falls back past it. A manifest written before manifests had a checksum is accepted with a
// note (its tensors are still verified).
TEST_F(Checkpoints, AnEditedManifestIsCaughtAsCorruption) {
  run(4);  // steps 2 and 4
  const fs::path four = dir / "ck" / "step-00000004";
  const auto original = slurp_file(four / "manifest.json");
  edit_manifest(four, [](nlohmann::json& m) { m["rows_drawn"] = m["rows_drawn"].get<std::int64_t>() + 1; });
  try {
    verify_checkpoint(four.string(), shape());
    ADD_FAILURE() << "an edited manifest passed";
  } catch (const CorruptCheckpoint& e) {
    EXPECT_NE(std::string(e.what()).find("manifest.json: the manifest fails its checksum"), std::string::npos)
        << e.what();
  }
  edit_manifest(four, [](nlohmann::json& m) { m["step"] = 7; });
  EXPECT_THROW(verify_checkpoint(four.string(), shape()), CorruptCheckpoint);
  std::vector<std::string> log;
  EXPECT_EQ(run(0, {}, "latest", &log).resumed_from, 2);
  EXPECT_TRUE(said(log, "passed over as corrupt")) << log.size();
  ASSERT_TRUE(fs::exists(four / "manifest.json"));  // evaluating moves nothing aside
  // The same manifest as the previous format wrote it: no checksum, no precision, version 1.
  {
    std::ofstream f(four / "manifest.json");
    f << original;
  }
  edit_manifest(four, [](nlohmann::json& m) {
    m.erase("manifest_xxh64");
    m.erase("precision");
    m["version"] = 1;
  });
  log.clear();
  EXPECT_EQ(run(0, {}, "latest", &log).resumed_from, 4);
  EXPECT_TRUE(said(log, "written before manifests carried a checksum")) << log.size();
}

// zinf eval with no valid checkpoint evaluates nothing: exit code 2, one line, no directory created;
// a --checkpoint that does not exist is bad input (2) too.
TEST_F(Checkpoints, EvalWithoutAValidCheckpointIsExitTwoAndCreatesNothing) {
  const std::string conf = (dir / "run.json").string();
  std::ofstream(conf) << cfg(3);
  test::Result r = test::sh(std::string(ZINF_BIN) + " eval --config " + conf + " --checkpoint latest");
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_EQ(count_errors(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("no valid checkpoint under train.checkpoint_dir"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir / "ck"));
  r = test::sh(std::string(ZINF_BIN) + " eval --config " + conf + " --checkpoint " +
               (dir / "nowhere" / "step-00000001").string());
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(r.err.find("no such directory"), std::string::npos) << r.err;
  // The directory of checkpoints instead of one of them: said so.
  run(2);
  r = test::sh(std::string(ZINF_BIN) + " eval --config " + conf + " --checkpoint " + (dir / "ck").string());
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(r.err.find("a directory of checkpoints, not one checkpoint"), std::string::npos) << r.err;
  // Only corrupt checkpoints: the same refusal, and eval moves nothing.
  flip_byte(dir / "ck" / "step-00000002" / "states.bin", 100);
  const auto before = snapshot(dir / "ck");
  r = test::sh(std::string(ZINF_BIN) + " eval --config " + conf + " --checkpoint latest");
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(r.err.find("(1 corrupt)"), std::string::npos) << r.err;
  EXPECT_EQ(snapshot(dir / "ck"), before);
}

// ---- processes ---------------------------------------------------------------------------------------

int spawn(const std::vector<std::string>& args, const std::string& out, const std::string& err = "/dev/null") {
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    FILE* f = std::freopen(out.c_str(), "w", stdout);
    (void)f;
    FILE* e = std::freopen(err.c_str(), "w", stderr);
    (void)e;
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

TEST_F(Checkpoints, CtrlCStopsCleanlyWithACheckpointAndNoSwapLeft) {
  const std::string conf = (dir / "run.json").string();
  std::ofstream(conf) << cfg(100000);
  const std::string out = (dir / "out.json").string();
  const pid_t pid =
      spawn({ZINF_BIN, "train", "--json", "--config", conf, "--set", "train.checkpoint_interval=1", "--set",
             "zero_optimization.offload_optimizer.device=nvme", "--set", "zero_optimization.offload_param.device=nvme"},
            out);
  // Training has started once its first checkpoint exists (bounded wait on that condition).
  for (int i = 0; i < 2000 && !fs::exists(dir / "ck" / "step-00000001"); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(fs::exists(dir / "ck" / "step-00000001"));
  ::kill(pid, SIGINT);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by the signal instead of stopping cleanly";
  EXPECT_EQ(WEXITSTATUS(status), 130);
  const auto j = nlohmann::json::parse(std::ifstream(out));
  EXPECT_TRUE(j["interrupted"].get<bool>());
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(j["steps"].get<std::int64_t>()));
  EXPECT_TRUE(fs::exists(dir / "ck" / name)) << name;  // the step it stopped after was saved
  EXPECT_TRUE(fs::is_empty(dir / "swap"));             // and the NVMe swap directories are gone
}

// `zinf train` killed with SIGKILL at random moments, again and again, resuming each time with
// --resume, ends with the uninterrupted run's digest; `extra`: --set items of both.
void Checkpoints::sigkill_resumes_exactly(const std::vector<std::string>& extra) {
  const int kills = std::getenv("ZINF_LONG_TESTS") ? 200 : 20;
  const std::string conf = (dir / "run.json").string();
  std::ofstream(conf) << cfg(40, R"(, "data": {"val_fraction": 0.1})");
  const std::string out = (dir / "out.json").string();
  auto args = [&](bool resume) {
    std::vector<std::string> a = {ZINF_BIN,
                                  "train",
                                  "--json",
                                  "--config",
                                  conf,
                                  "--set",
                                  "train.checkpoint_interval=1",
                                  "--set",
                                  "zero_optimization.offload_optimizer.device=nvme"};
    for (const auto& e : extra) a.insert(a.end(), {"--set", e});
    if (resume) a.push_back("--resume");
    return a;
  };
  // The uninterrupted run.
  int status = 0;
  ::waitpid(spawn(args(false), out), &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  const std::string want = nlohmann::json::parse(std::ifstream(out))["params_digest"];
  fs::remove_all(dir / "ck");
  // Kill it again and again, mid-step and mid-checkpoint, resuming each time.
  std::mt19937 rng(2024);
  int killed = 0, runs = 0;
  std::string got;
  while (true) {
    ASSERT_LT(++runs, kills + 200) << "the run never finished";
    const pid_t pid = spawn(args(true), out);
    if (killed < kills) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5 + rng() % 120));  // a random moment, not synchronisation
      ::kill(pid, SIGKILL);
    }
    ::waitpid(pid, &status, 0);
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) {
      ++killed;
      continue;
    }
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
    got = nlohmann::json::parse(std::ifstream(out))["params_digest"];
    if (killed >= kills) break;
    fs::remove_all(dir / "ck");  // it finished before the kill: start over so that kills keep landing mid-run
  }
  EXPECT_GE(killed, kills);
  EXPECT_EQ(got, want);
  // SIGKILL cannot be caught, so a killed run leaves its swap directory behind; the next run's store
  // removes it (provably stale: marker, owner gone). At most the last killed run's remains.
  std::size_t swap_dirs = 0;
  for (const auto& e : fs::directory_iterator(dir / "swap")) swap_dirs += e.is_directory();
  EXPECT_EQ(swap_dirs, 0u);
  for (const auto& e : fs::directory_iterator(dir / "ck"))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos);
}

TEST_F(Checkpoints, SurvivesSigkillAtRandomMomentsAndResumesExactly) { sigkill_resumes_exactly({}); }

// The same with 8-bit optimizer states: each resume re-encodes the checkpoint's decoded m and v into
// exactly what the killed run held.
TEST_F(Checkpoints, SurvivesSigkillWith8BitStatesAndResumesExactly) {
  sigkill_resumes_exactly({"zero_optimization.optimizer_states=8bit", "fp16.initial_scale_power=8"});
}

// A second Ctrl-C stops at once — the process ends by the signal — and still removes the NVMe swap
// directories.
TEST_F(Checkpoints, SecondCtrlCStopsAtOnceAndRemovesTheSwapDirectories) {
  const std::string conf = (dir / "run.json").string();
  std::ofstream(conf) << cfg(100000);
  // Steps of 400 micro batches: long enough that the second Ctrl-C lands while the first one waits
  // for the step to end.
  const std::string err = (dir / "err.txt").string();
  const pid_t pid =
      spawn({ZINF_BIN, "train", "--config", conf, "--set", "train.checkpoint_interval=1", "--set",
             "gradient_accumulation_steps=400", "--set", "zero_optimization.offload_optimizer.device=nvme", "--set",
             "zero_optimization.offload_param.device=nvme"},
            (dir / "out.txt").string(), err);
  for (int i = 0; i < 6000 && !fs::exists(dir / "ck" / "step-00000001"); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(fs::exists(dir / "ck" / "step-00000001"));
  ASSERT_FALSE(fs::is_empty(dir / "swap"));
  ::kill(pid, SIGINT);
  auto said = [&] {
    std::ifstream f(err);
    return std::string(std::istreambuf_iterator<char>(f), {}).find("a second signal stops at once") !=
           std::string::npos;
  };
  for (int i = 0; i < 2000 && !said(); ++i)  // the first Ctrl-C was taken (the handler says so)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(said());
  ::kill(pid, SIGINT);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status)) << "exited with " << (WIFEXITED(status) ? WEXITSTATUS(status) : -1)
                                   << " instead of stopping at once";
  EXPECT_EQ(WTERMSIG(status), SIGINT);
  EXPECT_TRUE(fs::is_empty(dir / "swap"));  // the swap directories went with it
}

// Ctrl-C during the first evaluation stops after the current evaluation batch, not after a step and
// another full evaluation. With a million evaluation batches, only that can end the run.
TEST_F(Checkpoints, CtrlCDuringTheFirstEvaluationStopsAfterTheCurrentBatch) {
  const std::string conf = (dir / "run.json").string();
  std::ofstream(conf) << cfg(100000);
  const std::string out = (dir / "out.json").string(), err = (dir / "err.txt").string();
  const pid_t pid = spawn({ZINF_BIN, "train", "--json", "--config", conf, "--set", "train.eval_batches=1000000",
                           "--set", "zero_optimization.offload_optimizer.device=nvme"},
                          out, err);
  auto built = [&] {  // the "model:" line: the model is built and a signal now stops the run gracefully
    std::ifstream f(err);
    return std::string(std::istreambuf_iterator<char>(f), {}).find("\nmodel: ") != std::string::npos;
  };
  for (int i = 0; i < 6000 && !built(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(built());
  ::kill(pid, SIGINT);
  int status = 0;
  pid_t done = 0;
  for (int i = 0; i < 6000 && done == 0; ++i) {  // bounded: a run that ignores the stop is killed, and fails
    done = ::waitpid(pid, &status, WNOHANG);
    if (done == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (done == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    FAIL() << "the run did not stop within a minute of Ctrl-C during its first evaluation";
  }
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 130);
  const auto j = nlohmann::json::parse(std::ifstream(out));
  EXPECT_TRUE(j["interrupted"].get<bool>());
  EXPECT_EQ(j["steps"].get<std::int64_t>(), 0);
  EXPECT_TRUE(fs::is_empty(dir / "swap"));
}

// nvme_path is created when it does not exist (as DeepSpeed does), and a run whose optimizer and
// parameters share one swap path does not call its own second directory stale.
TEST_F(Checkpoints, NvmePathIsCreatedAndARunsOwnDirectoriesAreNotStale) {
  const fs::path fresh = dir / "new" / "swap";
  std::vector<std::string> log;
  const TrainResult r =
      run(2,
          {"zero_optimization.offload_optimizer.device=nvme", "zero_optimization.offload_param.device=nvme",
           "zero_optimization.offload_optimizer.nvme_path=\"" + fresh.string() + "\"",
           "zero_optimization.offload_param.nvme_path=\"" + fresh.string() + "\""},
          "", &log);
  EXPECT_EQ(r.steps, 2);
  EXPECT_TRUE(fs::is_directory(fresh));
  EXPECT_TRUE(fs::is_empty(fresh));
  std::string offload, created;
  for (const auto& l : log) {
    if (l.rfind("offload:", 0) == 0) offload = l;
    if (l.find("created " + fresh.string()) != std::string::npos) created = l;
  }
  EXPECT_EQ(created,
            "zero_optimization.offload_optimizer.nvme_path: created " + fresh.string() + ", which did not exist");
  EXPECT_EQ(offload.find("stale"), std::string::npos) << offload;
}

// train.steps 0 only evaluates: a checkpoint of any step, with the loss the run ended with.
TEST_F(Checkpoints, StepsZeroEvaluatesACheckpoint) {
  const TrainResult trained = run(4);
  const TrainResult evaluated = run(0, {}, "latest");
  EXPECT_EQ(evaluated.resumed_from, 4);
  EXPECT_EQ(evaluated.val_loss, trained.val_loss);
  EXPECT_EQ(evaluated.params_digest, trained.params_digest);
}

// A llama-family run resumes bitwise, and its checkpoint is refused by a GPT-2 config.
TEST_F(Checkpoints, LlamaResumesExactlyAndOtherFamiliesAreRefused) {
  const std::vector<std::string> llama = {"model.family=llama", "model.n_kv_head=1", "model.d_ff=40",
                                          "model.tie_embeddings=false"};
  const TrainResult full = run(4, llama);
  fs::remove_all(dir / "ck" / "step-00000004");
  const TrainResult resumed = run(4, llama, "latest");
  EXPECT_EQ(resumed.resumed_from, 2);
  EXPECT_EQ(resumed.params_digest, full.params_digest);
  try {
    run(4, {}, (dir / "ck" / "step-00000002").string());
    FAIL() << "a GPT-2 config resumed a llama checkpoint";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the model family differs (checkpoint llama, config gpt2)"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace zinf
