// checkpoint_guard_test.cpp — what keeps a checkpoint folder whole against other processes and
// against files that are not what they claim to be: one writer a folder (a second run, a resume or a
// reader beside a live run is refused, naming it; readers share), manifests whose numbers are out of
// range or contradict each other though their checksum matches, FIFOs, folders and NUL bytes where a
// checkpoint's files belong (never waited on: every command runs under `timeout`), a prune killed
// between its rename and its delete, and leftovers that are symbolic links or hold other files
// (left alone).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "app/config/config.h"
#include "app/train/checkpoint.h"
#include "app/train/train.h"
#include "child.h"
#include "shell.h"
#include "zinf/error.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace zinf {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

class CheckpointGuard : public ::testing::Test {
 protected:
  fs::path dir = fs::temp_directory_path() / ("zinf-guard-test-" + std::to_string(::getpid()));
  fs::path ck = dir / "ck";
  std::string conf = (dir / "run.json").string();

  void SetUp() override {
    fs::create_directories(dir / "swap");
    std::ofstream(conf) << cfg();
  }
  void TearDown() override { fs::remove_all(dir); }

  // Two layers, fp16 with a busy loss scaler, a checkpoint every 2 steps, keep_last 3.
  std::string cfg() const {
    return R"({"model": {"n_layer": 2, "n_head": 2, "d_model": 32, "vocab_size": 256, "seq_len": 16},
               "train": {"steps": 4, "eval_interval": 0, "eval_batches": 2, "seed": 5, "checkpoint_interval": 2,
                         "keep_last": 3, "checkpoint_dir": ")" +
           ck.string() + R"("},
               "device": {"type": "cpu", "memory_budget": "256MiB", "threads": 1},
               "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "steps_per_print": 1,
               "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}},
               "fp16": {"enabled": true, "initial_scale_power": 24, "loss_scale_window": 3, "hysteresis": 1},
               "zero_optimization": {"stage": 2, "offload_optimizer": {"nvme_path": ")" +
           (dir / "swap").string() + R"("}}})";
  }
  TrainResult run(int steps, const std::vector<std::string>& overrides = {}, const std::string& resume = "",
                  std::vector<std::string>* log = nullptr) {
    TrainHooks h;
    h.resume = resume;
    if (log) h.log = [log](const std::string& s) { log->push_back(s); };
    std::vector<std::string> o = overrides;
    o.push_back("train.steps=" + std::to_string(steps));
    return train(parse_config(cfg(), o), h);
  }
  // `zinf ARGS` as a user runs it, under a time limit: a command that waits on a FIFO ends with 124
  // instead of holding up the test.
  static test::Result cli(const std::string& args) {
    return test::sh("timeout -k 5 120 " + std::string(ZINF_BIN) + " " + args);
  }
  ModelShape shape() const { return ModelShape{2, 2, 32, 256, 16}; }
  fs::path step(int n) const { return ck / test::checkpoint_name(n); }
};

using test::count_errors;
using test::said;

// The names in a folder, sorted.
std::vector<std::string> entries(const fs::path& d) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(d)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// Rewrites a checkpoint's manifest through `edit` and seals it again with a matching checksum, as
// anyone can (the checksum is XXH64 of the compact form without itself).
void reseal(const fs::path& ck, const std::function<void(json&)>& edit) {
  json m = json::parse(std::ifstream(ck / "manifest.json"));
  m.erase("manifest_xxh64");
  edit(m);
  const std::string text = m.dump();
  char h[17];
  std::snprintf(h, sizeof h, "%016llx", static_cast<unsigned long long>(XXH64(text.data(), text.size(), 0)));
  m["manifest_xxh64"] = h;
  std::ofstream(ck / "manifest.json", std::ios::trunc) << m.dump(1);
}

// ---- one writer a folder ---------------------------------------------------------------------------

// A run writing checkpoints (held still mid-run by its own stdout, which the test reads only when it
// lets the run go on) owns its folder: a second run with another seed, an overwrite, a --resume, and
// eval, export and generate reading the folder are each refused with exit code 2 and one line naming
// the folder and the run's PID and command — and change nothing. The run then ends with its own
// checkpoints whole.
TEST_F(CheckpointGuard, ASecondWriterOrAReaderBesideALiveRunIsRefusedNamingIt) {
  test::Child a({ZINF_BIN, "train", "--config", conf, "--set", "train.steps=100000", "--set",
                 "train.checkpoint_interval=1", "--set", "train.keep_last=4"});
  ASSERT_TRUE(a.read_until("checkpoint: " + step(1).string() + " written")) << a.err();
  ASSERT_TRUE(a.wait_blocked_on_stdout()) << a.err();
  const auto before = test::snapshot(ck);
  const auto newest = list_checkpoints(ck.string()).front().second;
  const std::string holder = "process " + std::to_string(a.pid()) + " (" + ZINF_BIN + " train --config " + conf;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"train --config " + conf + " --set train.seed=9 --set train.steps=38", "in use by another run"},
      {"train --config " + conf + " --set train.overwrite_checkpoints=true", "in use by another run"},
      {"train --config " + conf + " --resume --set train.steps=200000", "in use by another run"},
      {"eval --config " + conf + " --checkpoint latest", "a run is writing checkpoints there"},
      {"eval --config " + conf + " --checkpoint " + newest, "a run is writing checkpoints there"},
      {"export --checkpoint " + newest + " -o " + (dir / "out.safetensors").string(),
       "a run is writing checkpoints there"},
      {"generate --model " + ck.string() + " --prompt a --max-new-tokens 1", "a run is writing checkpoints there"},
  };
  for (const auto& [args, why] : cases) {
    SCOPED_TRACE(args);
    const test::Result r = cli(args);
    EXPECT_EQ(r.rc, 2) << r.err;
    EXPECT_EQ(count_errors(r.err), 1) << r.err;
    EXPECT_NE(r.err.find(ck.string() + ": " + why), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(holder), std::string::npos) << r.err;
    EXPECT_EQ(r.out.find("val_loss"), std::string::npos) << "it started: " << r.out;
  }
  EXPECT_EQ(test::snapshot(ck), before);  // the lock file too: it still names the live run
  EXPECT_FALSE(fs::exists(dir / "out.safetensors"));
  // The run goes on and stops (Ctrl-C) with a checkpoint; every checkpoint it left is whole.
  ::kill(a.pid(), SIGINT);
  const int status = a.finish();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 130) << status << a.err();
  const auto left = list_checkpoints(ck.string());
  ASSERT_EQ(left.size(), 4u);
  EXPECT_EQ(left.front().first, test::stopped_after(a.out()));
  for (const auto& [n, p] : left) EXPECT_NO_THROW(verify_checkpoint(p, shape())) << p;
  for (const auto& name : entries(ck)) EXPECT_TRUE(name == ".zinf-lock" || name.rfind("step-", 0) == 0) << name;
  // Once it has ended, the folder is free again.
  EXPECT_EQ(cli("eval --config " + conf + " --checkpoint latest").rc, 0);
}

// Readers share the folder (an export beside another reader works); a run that would write there is
// refused while one reads, and starts once it has finished.
TEST_F(CheckpointGuard, ReadersShareAFolderAndAWriterWaitsForThem) {
  run(4);  // steps 2 and 4
  const std::string resume = "train --config " + conf + " --resume --set train.steps=6";
  {
    const CheckpointLock reader(ck.string(), CheckpointLock::Mode::read, "test");
    const test::Result e = cli("export --checkpoint " + step(4).string() + " -o " + (dir / "a.safetensors").string());
    EXPECT_EQ(e.rc, 0) << e.err;
    const test::Result r = cli(resume);
    EXPECT_EQ(r.rc, 2) << r.err;
    EXPECT_EQ(count_errors(r.err), 1) << r.err;
    EXPECT_NE(r.err.find(ck.string() + ": being read by another zinf (eval, export or generate: process " +
                         std::to_string(::getpid()) + " ("),
              std::string::npos)
        << r.err;
    EXPECT_FALSE(fs::exists(step(6)));
  }
  const test::Result r = cli(resume);
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(fs::exists(step(6)));
}

// ---- manifests: every number in range and consistent ------------------------------------------------

// A manifest sealed again after an edit passes its checksum; its numbers still have to be possible.
// Each impossible one makes the checkpoint corrupt: refused with one line naming the key when named
// (exit 2), passed over with a note by `latest`. Nothing is allocated or replayed from it first (a
// resume replaying 2^63 data draws would never start its first step).
TEST_F(CheckpointGuard, AManifestWithImpossibleNumbersIsCorruptThoughItsChecksumMatches) {
  run(4);  // steps 2 and 4
  const fs::path four = step(4);
  const std::string original = test::slurp((four / "manifest.json").string());
  const json m = json::parse(original);
  const std::int64_t s = m["step"], iter = m["scaler"]["iter"];
  struct Case {
    const char* name;
    std::function<void(json&)> edit;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"rows_drawn near 2^63", [](json& j) { j["rows_drawn"] = (std::uint64_t{1} << 63) - 1; }, "rows_drawn"},
      {"rows_drawn past 2^63", [](json& j) { j["rows_drawn"] = std::uint64_t{1} << 63; }, "rows_drawn"},
      {"rows_drawn as a string", [](json& j) { j["rows_drawn"] = "16"; }, "rows_drawn"},
      {"rows_drawn fewer than the steps", [&](json& j) { j["rows_drawn"] = s - 1; }, "rows_drawn"},
      {"opt_steps past step", [&](json& j) { j["opt_steps"] = s + 1; }, "opt_steps"},
      {"opt_steps and skipped not adding up to step",
       [](json& j) { j["opt_steps"] = j["opt_steps"].get<std::int64_t>() - 1; }, "opt_steps"},
      {"skipped negative", [](json& j) { j["skipped"] = -1; }, "skipped"},
      {"skipped a fraction", [](json& j) { j["skipped"] = 1.5; }, "skipped"},
      {"step negative", [](json& j) { j["step"] = -1; }, "step"},
      {"loss scale 0", [](json& j) { j["scaler"]["scale"] = 0; }, "scaler.scale"},
      {"loss scale 1e308", [](json& j) { j["scaler"]["scale"] = 1e308; }, "scaler.scale"},
      {"loss scale -1", [](json& j) { j["scaler"]["scale"] = -1; }, "scaler.scale"},
      {"loss scale as a string", [](json& j) { j["scaler"]["scale"] = "1024"; }, "scaler.scale"},
      {"scaler iteration past step", [&](json& j) { j["scaler"]["iter"] = s + 1; }, "scaler.iter"},
      {"last overflow not before the iteration", [&](json& j) { j["scaler"]["last_overflow_iter"] = iter; },
       "scaler.last_overflow_iter"},
      {"hysteresis negative", [](json& j) { j["scaler"]["hysteresis"] = -1; }, "scaler.hysteresis"},
      {"precision against its config", [](json& j) { j["precision"] = "bf16"; }, "precision"},
      {"an fp32 run with a loss scale",
       [](json& j) {
         j["precision"] = "fp32";
         j["config"]["fp16"]["enabled"] = false;
         j["scaler"]["scale"] = 1024;
       },
       "scaler.scale"},
      {"a state format against its config", [](json& j) { j["optimizer_states"] = "bf16"; }, "optimizer_states"},
      {"states_bytes against its model",
       [](json& j) { j["states_bytes"] = j["states_bytes"].get<std::uint64_t>() + 4; }, "states_bytes"},
      {"a tensor moved",
       [](json& j) { j["tensors"][1]["offset"] = j["tensors"][1]["offset"].get<std::uint64_t>() + 4; }, "tensor"},
      {"a model its tensors are not", [](json& j) { j["model"]["n_layer"] = 3; }, "tensors"},
      {"a checksum that is not one", [](json& j) { j["tensors"][0]["xxh64"] = "zz"; },
       "tensor embedding/master: xxh64"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    reseal(four, c.edit);
    try {
      verify_checkpoint(four.string(), shape());
      ADD_FAILURE() << "accepted";
    } catch (const CorruptCheckpoint& e) {
      EXPECT_NE(std::string(e.what()).find(four.string() + "/manifest.json: " + c.says), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not refused as corrupt: " << e.what();
    }
    const ResumeChoice latest = choose_checkpoint(ck.string(), "latest", shape());
    EXPECT_EQ(latest.path, step(2).string());
    EXPECT_TRUE(said(latest.notes, "passed over as corrupt"));
    const test::Result r = cli("export --checkpoint " + four.string() + " -o " + (dir / "x.safetensors").string());
    EXPECT_EQ(r.rc, 2) << r.err;
    EXPECT_EQ(count_errors(r.err), 1) << r.err;
    EXPECT_NE(r.err.find(c.says), std::string::npos) << r.err;
    std::ofstream(four / "manifest.json", std::ios::trunc) << original;
  }
  // Through the command line, end to end: the spinning case, named and as `latest`.
  reseal(four, [](json& j) { j["rows_drawn"] = (std::uint64_t{1} << 63) - 1; });
  test::Result r = cli("eval --config " + conf + " --checkpoint " + four.string());
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_EQ(count_errors(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("rows_drawn: 9223372036854775807 is not an integer between"), std::string::npos) << r.err;
  r = cli("eval --config " + conf + " --checkpoint latest");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("rows_drawn: 9223372036854775807 is not an integer between"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("passed over as corrupt"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("resume: " + step(2).string()), std::string::npos) << r.err;
  // The untouched manifest still loads.
  std::ofstream(four / "manifest.json", std::ios::trunc) << original;
  EXPECT_NO_THROW(verify_checkpoint(four.string(), shape()));
}

// ---- only regular files -----------------------------------------------------------------------------

// A FIFO or a folder as manifest.json or states.bin: eval, export and generate naming the checkpoint
// are refused at once with one line (exit 2), never waiting on the FIFO; `latest` passes it over.
TEST_F(CheckpointGuard, FifosAndFoldersWhereACheckpointsFilesBelongAreRefusedAtOnce) {
  run(4);  // steps 2 and 4
  const fs::path four = step(4);
  for (const char* file : {"manifest.json", "states.bin"}) {
    for (const bool fifo : {true, false}) {
      SCOPED_TRACE(std::string(file) + (fifo ? " as a FIFO" : " as a folder"));
      const fs::path p = four / file, real = four / (std::string(file) + ".real");
      fs::rename(p, real);
      if (fifo)
        ASSERT_EQ(::mkfifo(p.c_str(), 0644), 0);
      else
        fs::create_directory(p);
      const std::string why = p.string() + (fifo ? ": is a FIFO (named pipe)" : ": is a directory");
      for (const std::string& args :
           {"eval --config " + conf + " --checkpoint " + four.string(),
            "export --checkpoint " + four.string() + " -o " + (dir / "x.safetensors").string(),
            "generate --model " + four.string() + " --prompt a --max-new-tokens 1"}) {
        const test::Result r = cli(args);
        EXPECT_EQ(r.rc, 2) << args << "\n" << r.err;
        EXPECT_EQ(count_errors(r.err), 1) << args << "\n" << r.err;
        EXPECT_NE(r.err.find(why), std::string::npos) << args << "\n" << r.err;
      }
      const test::Result r = cli("eval --config " + conf + " --checkpoint latest");
      EXPECT_EQ(r.rc, 0) << r.err;
      EXPECT_NE(r.err.find(why), std::string::npos) << r.err;
      EXPECT_NE(r.err.find("resume: " + step(2).string()), std::string::npos) << r.err;
      fs::remove(p);
      fs::rename(real, p);
    }
  }
  // --resume passes it over too, and keeps it (moved aside as corrupt) for inspection.
  fs::rename(four / "states.bin", dir / "states.bin");
  ASSERT_EQ(::mkfifo((four / "states.bin").c_str(), 0644), 0);
  const test::Result r = cli("train --config " + conf + " --resume --set train.steps=6");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("resume: " + step(2).string()), std::string::npos) << r.out;
  EXPECT_TRUE(fs::is_fifo(ck / (test::checkpoint_name(4) + ".corrupt") / "states.bin"));
}

// A manifest followed by NUL bytes (its checksum still matching the document before them) is
// malformed, like one followed by any other bytes.
TEST_F(CheckpointGuard, AManifestFollowedByNulBytesIsMalformed) {
  run(4);
  const fs::path four = step(4);
  const std::string original = test::slurp((four / "manifest.json").string());
  for (const std::string& tail : {std::string(4, '\0'), std::string("\0{}", 3), std::string(" x")}) {
    SCOPED_TRACE(tail.size());
    std::ofstream(four / "manifest.json", std::ios::trunc | std::ios::binary) << original << tail;
    EXPECT_THROW(verify_checkpoint(four.string(), shape()), CorruptCheckpoint);
    EXPECT_EQ(choose_checkpoint(ck.string(), "latest", shape()).path, step(2).string());
    const test::Result r = cli("export --checkpoint " + four.string() + " -o " + (dir / "x.safetensors").string());
    EXPECT_EQ(r.rc, 2) << r.err;
    EXPECT_EQ(count_errors(r.err), 1) << r.err;
    if (tail[0] == '\0') {
      EXPECT_NE(r.err.find("manifest.json: holds a NUL byte at offset " + std::to_string(original.size())),
                std::string::npos)
          << r.err;
    }
  }
}

// ---- prune and start-up cleanup ----------------------------------------------------------------------

// keep_last renames a checkpoint aside before deleting it: a run killed between the two (the test
// hook sends SIGKILL there) leaves the newer checkpoints whole and a step-N.pruned-PID folder, which
// the next run removes — also half deleted — without moving anything aside as corrupt.
TEST_F(CheckpointGuard, APruneKilledBetweenItsRenameAndItsDeleteLosesNothing) {
  test::Child a(
      {ZINF_BIN, "train", "--config", conf, "--set", "train.checkpoint_interval=1", "--set", "train.keep_last=1"},
      {"ZINF_TEST_KILL_IN_PRUNE=1"});
  const int status = a.finish();
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status << a.err();
  const std::string pruned = test::checkpoint_name(1) + ".pruned-" + std::to_string(a.pid());
  EXPECT_EQ(entries(ck), (std::vector<std::string>{".zinf-lock", pruned, test::checkpoint_name(2)}));
  EXPECT_NO_THROW(verify_checkpoint(step(2).string(), shape()));
  EXPECT_NO_THROW(verify_checkpoint((ck / pruned).string(), ModelShape{2, 2, 32, 256, 16}));
  fs::remove(ck / pruned / "states.bin");  // as a kill during the delete leaves it
  const test::Result r = cli("train --config " + conf +
                             " --resume --set train.checkpoint_interval=1 --set "
                             "train.keep_last=1");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("resume: " + step(2).string()), std::string::npos) << r.out;
  EXPECT_EQ(entries(ck), (std::vector<std::string>{".zinf-lock", test::checkpoint_name(4)}));
}

// Start-up cleanup removes a dead run's temporary only when it is provably a checkpoint's: a
// leftover name that is a symbolic link is not followed (the link and its target stay), and a folder
// holding other files is neither removed nor renamed back; each is one line.
TEST_F(CheckpointGuard, StartUpCleanupLeavesLinksAndForeignFoldersAlone) {
  run(2);
  const pid_t p = ::fork();
  if (p == 0) ::_exit(0);
  ::waitpid(p, nullptr, 0);
  const std::string dead = std::to_string(p);
  const fs::path target = dir / "elsewhere";
  fs::copy(step(2), target);
  const fs::path tmp_link = ck / (test::checkpoint_name(7) + ".tmp-" + dead);
  const fs::path pruned_link = ck / (test::checkpoint_name(5) + ".pruned-" + dead);
  fs::create_directory_symlink(target, tmp_link);
  fs::create_directory_symlink(target, pruned_link);
  const fs::path foreign = ck / (test::checkpoint_name(3) + ".old-" + dead);
  fs::copy(step(2), foreign);
  std::ofstream(foreign / "notes.txt") << "mine";
  const fs::path ours = ck / (test::checkpoint_name(6) + ".tmp-" + dead);
  fs::copy(step(2), ours);
  std::vector<std::string> log;
  EXPECT_EQ(run(4, {}, "latest", &log).resumed_from, 2);
  EXPECT_TRUE(fs::is_symlink(tmp_link));
  EXPECT_TRUE(fs::is_symlink(pruned_link));
  EXPECT_TRUE(fs::exists(target / "manifest.json"));
  EXPECT_TRUE(fs::exists(target / "states.bin"));
  EXPECT_TRUE(fs::exists(foreign / "notes.txt"));
  EXPECT_FALSE(fs::exists(step(3))) << "a folder holding other files was renamed back as a checkpoint";
  EXPECT_FALSE(fs::exists(ours));
  EXPECT_TRUE(said(log, tmp_link.string() + " left alone (a symbolic link, not followed)"));
  EXPECT_TRUE(said(log, pruned_link.string() + " left alone (a symbolic link, not followed)"));
  EXPECT_TRUE(said(log, foreign.string() + " left alone (holds notes.txt"));
}

}  // namespace
}  // namespace zinf
