// cli_dp_test.cpp — `mpirun -np N zinf …` as a user runs it: ranks train as one rank with their
// accumulation, rank 0 alone prints, a killed rank ends the job without a hang, and bad launches
// (ranks given different configs, a world the launcher does not match) are refused at start, and
// compressed optimizer states (8bit, bf16) shard exactly.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/temp_dir.h"
#include "common/tokenizer_files.h"
#include "model/shape.h"
#include "mpirun.h"
#include "shell.h"
#include "zinf/cpu_adam/adam.h"
#include "zinf/offload/placement.h"

namespace zinf::test {
namespace {

namespace fs = std::filesystem;

const std::string kMpi = std::string(ZINF_MPIEXEC) + " --oversubscribe --bind-to none";

std::string digest_of(const std::string& out) {
  const auto p = out.find("params_digest=");
  return p == std::string::npos ? "" : out.substr(p + 14, 16);
}

class CliDp : public MpirunTest {};

TEST_F(CliDp, MpirunRanksTrainAsOneRankWithTheirAccumulation) {
  const std::string args =
      " train --config " + kTinyConfig + " --set train.steps=3 --set train.eval_batches=2 --set train.eval_interval=0";
  const Result one = sh(std::string(ZINF_BIN) + args + " --set gradient_accumulation_steps=2");
  ASSERT_EQ(one.rc, 0) << one.err;
  for (const std::string stage : {"--set zero_optimization.stage=2",
                                  "--set zero_optimization.stage=3 --set zero_optimization.offload_param.device=cpu"}) {
    const Result two = sh(kMpi + " -np 2 " + ZINF_BIN + args + " " + stage);
    EXPECT_EQ(two.rc, 0) << two.err;
    EXPECT_EQ(digest_of(two.out), digest_of(one.out)) << stage;
    EXPECT_EQ(count(two.out, "final step="), 1u) << "rank 0 alone prints";
    EXPECT_NE(two.out.find("data parallel: 2 ranks over mpi"), std::string::npos) << two.out;
  }
}

// Chat data with masked prompts: the loss is the mean over the whole step's unmasked targets, across
// micro batches and ranks, so two ranks still train as one rank with their accumulation, bit for bit.
TEST_F(CliDp, ChatDataWithMaskedPromptsTrainsAsOneRank) {
  const TempDir dir("cli-dp-chat");
  std::ofstream(dir / "tokenizer.json") << small_tokenizer({{"t", "h"}, {"th", "e"}}, false, false).dump();
  {
    std::ofstream jsonl(dir / "chat.jsonl");
    for (int i = 0; i < 24; ++i)  // prompts and answers of different lengths: every row has its own count
      jsonl << R"({"prompt": "question )" << i << std::string(static_cast<std::size_t>(i % 5), '?')
            << R"(", "completion": "the answer is )" << i * 7 << std::string(static_cast<std::size_t>(i % 3), '!')
            << "\"}\n";
  }
  const std::string args = " train --config " + kTinyConfig + " --set data.path=\"" + (dir / "chat.jsonl") +
                           "\" --set data.tokenizer=\"" + (dir / "tokenizer.json") +
                           "\" --set data.chat_template=\"none\" --set model.vocab_size=320 --set model.seq_len=32"
                           " --set train.steps=3 --set train.eval_batches=2 --set train.eval_interval=0"
                           " --set train_micro_batch_size_per_gpu=4";
  const Result one = sh(std::string(ZINF_BIN) + args + " --set gradient_accumulation_steps=2");
  ASSERT_EQ(one.rc, 0) << one.err;
  ASSERT_NE(one.out.find("chat JSONL"), std::string::npos) << one.out;
  for (const std::string stage : {"--set zero_optimization.stage=2",
                                  "--set zero_optimization.stage=3 --set zero_optimization.offload_param.device=cpu"}) {
    const Result two = sh(kMpi + " -np 2 " + ZINF_BIN + args + " " + stage);
    EXPECT_EQ(two.rc, 0) << two.err;
    EXPECT_FALSE(digest_of(two.out).empty()) << two.out;
    EXPECT_EQ(digest_of(two.out), digest_of(one.out)) << stage;
  }
}

// Compressed optimizer states with data parallelism: each rank keeps m and v of its shards in the
// format, 8bit with one scale per 256 elements counted from the unit's start. Shard boundaries are
// multiples of 65,536 elements, so a rank's blocks are the one-rank run's blocks and two ranks with
// GA 1 train exactly as one rank with GA 2 — in each format, at ZeRO-2 and ZeRO-3. The model's
// blocks are larger than one shard step, so rank 1 keeps a part of every block (checked below);
// the formats really apply (each gives other parameters than fp32).
TEST_F(CliDp, CompressedStatesTrainAsOneRank) {
  const ModelShape shape{2, 4, 128, 256, 32};  // the --set below on configs/tiny.json
  int split = 0;
  for (const LayerUnit& u : layer_units(shape)) {
    const auto n = static_cast<std::uint64_t>(u.params);
    const offload::Shard one = offload::shard_of(n, 2, 0);
    EXPECT_EQ(one.hi % cpu_adam::kQ8Block, 0u) << u.name;  // the 8bit blocks do not straddle ranks
    split += one.hi > 0 && one.hi < n;
  }
  EXPECT_EQ(split, 2) << "both blocks are split between the two ranks";
  const std::string args = " train --config " + kTinyConfig +
                           " --set model.n_layer=2 --set model.seq_len=32 --set train_micro_batch_size_per_gpu=4"
                           " --set train.steps=3 --set train.eval_batches=1 --set train.eval_interval=0";
  const std::string fp32 = digest_of(sh(std::string(ZINF_BIN) + args + " --set gradient_accumulation_steps=2").out);
  ASSERT_FALSE(fp32.empty());
  for (const std::string states : {"8bit", "bf16"}) {
    const std::string mode = " --set zero_optimization.optimizer_states=" + states;
    const Result one = sh(std::string(ZINF_BIN) + args + mode + " --set gradient_accumulation_steps=2");
    ASSERT_EQ(one.rc, 0) << one.err;
    ASSERT_FALSE(digest_of(one.out).empty()) << one.out;
    EXPECT_NE(digest_of(one.out), fp32) << states << " applies";
    for (const std::string stage :
         {"--set zero_optimization.stage=2",
          "--set zero_optimization.stage=3 --set zero_optimization.offload_param.device=cpu"}) {
      const Result two = sh("timeout 300 " + kMpi + " -np 2 " + ZINF_BIN + args + mode + " " + stage);
      EXPECT_EQ(two.rc, 0) << states << " " << stage << "\n" << two.err;
      EXPECT_EQ(digest_of(two.out), digest_of(one.out)) << states << " " << stage;
    }
  }
}

// The speculative Update with two ranks on a model so small that rank 1 keeps no optimizer states
// (shards are 64 Ki-aligned): every rank must take the same path on a skipped (overflowing fp16) or
// clipped step, or their gathers fall out of step. Same digest as without speculation, no hang.
TEST_F(CliDp, SpeculativeUpdateAgreesAcrossRanksThatKeepNoStates) {
  const std::string args = std::string(" ") + ZINF_BIN + " train --config " + kTinyConfig +
                           " --set train.steps=8 --set train.eval_batches=2 --set train.eval_interval=0"
                           " --set model.n_layer=2 --set model.d_model=32 --set model.n_head=2"
                           " --set fp16.enabled=true --set fp16.initial_scale_power=18 --set gradient_clipping=0.5";
  const std::string off = " --set zero_optimization.offload_optimizer.speculative=false";
  const std::string on = " --set zero_optimization.offload_optimizer.speculative=true";
  for (const std::string stage : {"--set zero_optimization.stage=2",
                                  "--set zero_optimization.stage=3 --set zero_optimization.offload_param.device=cpu"}) {
    const Result plain = sh("timeout 300 " + kMpi + " -np 2" + args + off + " " + stage);
    ASSERT_EQ(plain.rc, 0) << plain.err;
    const Result spec = sh("timeout 300 " + kMpi + " -np 2" + args + on + " " + stage);
    ASSERT_EQ(spec.rc, 0) << stage << "\n" << spec.err;
    EXPECT_EQ(digest_of(spec.out), digest_of(plain.out)) << stage;
    EXPECT_NE(plain.out.find("OVERFLOW"), std::string::npos) << "the first steps overflow: " << plain.out;
    EXPECT_NE(spec.out.find("rollbacks"), std::string::npos) << spec.out;
  }
}

TEST_F(CliDp, KillingOneRankEndsTheJobWithoutAHang) {
  const std::string base = fs::temp_directory_path() / ("zinf-cli-dp-kill-" + std::to_string(::getpid()));
  const pid_t job = ::fork();
  ASSERT_GE(job, 0);
  if (job == 0) {
    ::setpgid(0, 0);
    const std::string cmd = "exec " + kMpi + " -np 2 " + ZINF_BIN + " train --config " + kTinyConfig +
                            " --set train.steps=100000 --set steps_per_print=1 >" + base + ".out 2>" + base + ".err";
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  // Wait for training to be under way, then SIGKILL one rank (a child of mpirun).
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (slurp(base + ".out").find("step     2/") == std::string::npos && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::vector<pid_t> ranks;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string stat = slurp(e.path().string() + "/stat");
    const auto close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 2));
    char state;
    pid_t ppid;
    rest >> state >> ppid;
    if (ppid == job && slurp(e.path().string() + "/comm").rfind("zinf", 0) == 0)
      ranks.push_back(std::stoi(e.path().filename()));
  }
  ASSERT_EQ(ranks.size(), 2u) << slurp(base + ".out") << slurp(base + ".err");
  ::kill(ranks.back(), SIGKILL);
  int status = 0;
  deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  pid_t done = 0;
  while ((done = ::waitpid(job, &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  if (done == 0) {
    ::kill(-job, SIGKILL);
    ::waitpid(job, &status, 0);
    ADD_FAILURE() << "the job still ran 60 s after one rank was killed";
  }
  EXPECT_FALSE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  const std::string err = slurp(base + ".err");
  EXPECT_NE(err.find("signal 9"), std::string::npos) << err;  // the launcher names the rank and the signal
  for (pid_t r : ranks) {                                     // gone, or a zombie waiting to be reaped
    std::string stat;
    for (int i = 0; i < 50 && !(stat = slurp("/proc/" + std::to_string(r) + "/stat")).empty(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const auto close = stat.rfind(')');
    EXPECT_TRUE(stat.empty() || (close != std::string::npos && stat.compare(close + 2, 1, "Z") == 0))
        << "rank process " << r << " survived";
  }
  fs::remove(base + ".out");
  fs::remove(base + ".err");
}

// A launcher that sets DeepSpeed's (torchrun's) variables instead of running mpirun: the ranks meet
// at MASTER_ADDR:MASTER_PORT and train exactly as under mpirun.
TEST_F(CliDp, EnvironmentLaunchMeetsAtTheMasterPort) {
  // Below Linux's ephemeral range (32768–60999), where other processes' connections take their ports.
  const std::string port = std::to_string(20000 + ::getpid() % 12000);
  const std::string env = "MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port + " WORLD_SIZE=2 ";
  const std::string train = std::string(ZINF_BIN) + " train --config " + kTinyConfig +
                            " --set train.steps=3 --set train.eval_batches=2 --set train.eval_interval=0";
  const Result one = sh(std::string(ZINF_BIN) + " train --config " + kTinyConfig +
                        " --set train.steps=3 --set train.eval_batches=2 --set train.eval_interval=0 --set "
                        "gradient_accumulation_steps=2");
  ASSERT_EQ(one.rc, 0) << one.err;
  // Rank 1 first, in the background: it waits for rank 0.
  const std::string log1 = fs::temp_directory_path() / ("zinf-cli-dp-env-rank1-" + std::to_string(::getpid()));
  const Result two = sh("((" + env + "RANK=1 LOCAL_RANK=1 " + train + " >/dev/null 2>" + log1 +
                        "; echo exit status $? >>" + log1 + ") &) ; " + env + "RANK=0 LOCAL_RANK=0 " + train);
  EXPECT_EQ(two.rc, 0) << two.err << "rank 1 said:\n" << slurp(log1);
  // Rank 1 ends cleanly too, whichever rank finished first (it may still be closing when rank 0 returns).
  for (int i = 0; i < 300 && slurp(log1).find("exit status") == std::string::npos; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_NE(slurp(log1).find("exit status 0"), std::string::npos) << slurp(log1);
  fs::remove(log1);
  EXPECT_EQ(digest_of(two.out), digest_of(one.out));
  EXPECT_NE(two.out.find("data parallel: 2 ranks over mpi"), std::string::npos) << two.out;
  // No mpirun to end the job when a rank dies: the ranks watch each other. Kill rank 1 mid-run; rank 0
  // must end within a minute with a line naming it.
  const std::string base = fs::temp_directory_path() / ("zinf-cli-dp-env-" + std::to_string(::getpid()));
  const std::string forever =
      std::string(ZINF_BIN) + " train --config " + kTinyConfig + " --set train.steps=100000 --set steps_per_print=1";
  const std::string script = env + "RANK=1 " + forever + " >/dev/null 2>&1 & r1=$!; " + env + "RANK=0 " + forever +
                             " >" + base + ".out 2>" + base +
                             ".err & r0=$!; for i in $(seq 600); do grep -q 'step     2/' " + base +
                             ".out 2>/dev/null && break; sleep 0.1; done; kill -9 $r1; " +
                             "for i in $(seq 600); do kill -0 $r0 2>/dev/null || break; sleep 0.1; done; " +
                             "if kill -0 $r0 2>/dev/null; then kill -9 $r0; echo HUNG; fi; wait $r0; echo rank0=$?";
  const Result killed = sh(script);
  EXPECT_EQ(killed.out.find("HUNG"), std::string::npos) << "rank 0 still ran a minute after rank 1 was killed";
  EXPECT_EQ(killed.out.find("rank0=0"), std::string::npos) << killed.out;
  const std::string err0 = slurp(base + ".err");
  EXPECT_NE(err0.find("zinf: rank 0: rank 1 left the job without finishing"), std::string::npos) << err0;
  fs::remove(base + ".out");
  fs::remove(base + ".err");
  // A rank that never comes: rank 0 names it and fails at start.
  const Result lonely =
      sh("ZINF_RENDEZVOUS_TIMEOUT=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port + " WORLD_SIZE=3 RANK=0 " + train);
  EXPECT_NE(lonely.rc, 0);
  EXPECT_NE(lonely.err.find("rank(s) 1, 2 did not arrive"), std::string::npos) << lonely.err;
}

TEST_F(CliDp, BadLaunchesAreRefusedAtStart) {
  const std::string train = std::string(ZINF_BIN) + " train --config " + kTinyConfig + " --set train.steps=1";
  // Ranks given different configs (MPMD: one launch, two command lines).
  Result r = sh(kMpi + " -np 1 " + train + " : -np 1 " + train + " --set optimizer.params.lr=0.001");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("different configs"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("zinf: rank "), std::string::npos) << r.err;
  // DeepSpeed's variables describing a world mpirun did not start.
  r = sh(kMpi + " -np 2 -x WORLD_SIZE=3 " + train);
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("disagree with mpirun's world"), std::string::npos) << r.err;
  r = sh("WORLD_SIZE=2 RANK=0 " + train);  // no mpirun and no MASTER_ADDR / MASTER_PORT to meet at
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("MASTER_ADDR / MASTER_PORT are not"), std::string::npos) << r.err;
  // A batch size that does not divide among the ranks: DeepSpeed's rule with the world size.
  r = sh(kMpi + " -np 2 " + train + " --set train_batch_size=16 --set gradient_accumulation_steps=1");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("gradient_acc_step * world_size 16 != 16 * 1 * 2"), std::string::npos) << r.err;
}

// A run rank 0 refuses before it starts — a resume under another model shape, a fresh run into a
// directory of checkpoints — ends every rank with exit code 2 (none is left waiting), and the
// checkpoint directory is left exactly as it was.
TEST_F(CliDp, ARefusedResumeEndsEveryRankAndTouchesNoCheckpoint) {
  const std::string ck = fs::temp_directory_path() / ("zinf-cli-dp-ck-" + std::to_string(::getpid()));
  const std::string train =
      kMpi + " -np 2 " + ZINF_BIN + " train --config " + kTinyConfig +
      " --set train.steps=2 --set train.eval_batches=2 --set train.eval_interval=0 --set model.n_layer=1"
      " --set train.checkpoint_dir=\"" +
      ck + "\"";
  const Result first = sh(train);
  ASSERT_EQ(first.rc, 0) << first.err;
  auto listing = [&] {
    std::string s;
    for (const auto& e : fs::recursive_directory_iterator(ck))
      s += e.path().string() + " " + (e.is_regular_file() ? slurp(e.path().string()) : std::string("<dir>")) + "\n";
    return s;
  };
  const std::string before = listing();
  // (timeout: a rank left waiting would hang the job; it ends it with 124 instead)
  Result r = sh("timeout 300 " + train + " --set train.steps=4 --set model.d_model=96 --resume");
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(r.err.find("model shape differs"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("step 2: val_loss"), std::string::npos) << r.out;
  r = sh("timeout 300 " + train + " --set train.steps=4");
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(r.err.find("holds checkpoints"), std::string::npos) << r.err;
  EXPECT_EQ(listing(), before);
  // And the resume it can honour still works.
  r = sh("timeout 300 " + train + " --set train.steps=3 --resume");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("(step 2, loaded and verified"), std::string::npos) << r.out;
  fs::remove_all(ck);
}

TEST_F(CliDp, BenchCommAndPlanReportPerRankFigures) {
  Result r = sh(kMpi + " -np 2 " + ZINF_BIN + " bench comm --sizes 64K,1M --iters 3 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);  // rank 0 alone prints
  EXPECT_EQ(j["backend"], "mpi");
  EXPECT_EQ(j["ranks"], 2);
  ASSERT_EQ(j["rows"].size(), 10u);
  for (const auto& row : j["rows"]) {
    EXPECT_GT(row["busbw_gb_per_s"].get<double>(), 0.0) << row.dump();
    EXPECT_GT(row["copy_gb_per_s"].get<double>(), 0.0) << row.dump();
  }
  // The plan for the ranks mpirun starts (and for a world given by hand): the per-rank share falls.
  r = sh(std::string(ZINF_BIN) + " plan --config " + kTinyConfig + " --world 4 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto p = nlohmann::json::parse(r.out);
  EXPECT_EQ(p["world_size"], 4);
  ASSERT_EQ(p["per_rank_stages"].size(), 4u);
  EXPECT_LT(p["per_rank_stages"][3]["zero_paper_model_states"].get<double>(),
            p["per_rank_stages"][0]["zero_paper_model_states"].get<double>());
  r = sh(kMpi + " -np 2 " + ZINF_BIN + " plan --config " + kTinyConfig + " --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["world_size"], 2);  // one plan, from rank 0
}

}  // namespace
}  // namespace zinf::test
