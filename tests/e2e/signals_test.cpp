// signals_test.cpp — `zinf train` ended by a signal, as a user, a scheduler or a terminal ends it:
// SIGTERM and SIGUSR1 stop after the step with a checkpoint that resumes to the uninterrupted run
// and exit with 128 + the signal; a second signal, SIGHUP and SIGQUIT end at once, a closed stdout
// (SIGPIPE) ends it with exit 1, and every one of these paths removes the NVMe swap folder.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "child.h"
#include "common/temp_dir.h"
#include "shell.h"

namespace zinf::test {
namespace {

namespace fs = std::filesystem;

// A model small enough for a step of a few milliseconds; progress on every step.
const std::vector<std::string> kSmall = {"model.n_layer=1",
                                         "model.d_model=32",
                                         "model.n_head=2",
                                         "model.seq_len=32",
                                         "train_micro_batch_size_per_gpu=2",
                                         "train.eval_batches=1",
                                         "train.eval_interval=0",
                                         "device.threads=1",
                                         "steps_per_print=1"};

std::vector<std::string> train_args(int steps, const std::vector<std::string>& sets) {
  std::vector<std::string> a = {ZINF_BIN,    "train", "--config",
                                kTinyConfig, "--set", "train.steps=" + std::to_string(steps)};
  for (const auto& list : {kSmall, sets})
    for (const auto& s : list) a.insert(a.end(), {"--set", s});
  return a;
}

std::string shell_line(const std::vector<std::string>& args) {
  std::string s;
  for (const auto& a : args) s += (s.empty() ? "" : " ") + ("'" + a + "'");
  return s;
}

TEST(Signals, SigtermAndSigusr1StopAfterTheStepWithACheckpointThatResumesToTheUninterruptedRun) {
  constexpr int kSteps = 60;
  const Result full = sh(shell_line(train_args(kSteps, {})) + " --json");
  ASSERT_EQ(full.rc, 0) << full.err;
  const std::string digest = nlohmann::json::parse(full.out)["params_digest"];
  for (const int sig : {SIGTERM, SIGUSR1}) {
    SCOPED_TRACE(sig == SIGTERM ? "SIGTERM" : "SIGUSR1");
    TempDir ck("sig-ck");
    const std::string dir_set = "train.checkpoint_dir=\"" + ck.path.string() + "\"";
    Child run(train_args(kSteps, {dir_set}));
    // Once a step is done (the child cannot run more than a pipe's page of lines ahead of this).
    ASSERT_TRUE(run.read_until("step     1/")) << run.out() << run.err();
    ::kill(run.pid(), sig);
    const int status = run.finish();
    ASSERT_TRUE(WIFEXITED(status)) << "ended by signal " << WTERMSIG(status) << "\n" << run.err();
    EXPECT_EQ(WEXITSTATUS(status), 128 + sig) << run.err();
    EXPECT_NE(run.err().find(std::string(sig == SIGTERM ? "SIGTERM" : "SIGUSR1") + ": stopping after the current step"),
              std::string::npos)
        << run.err();
    const long k = stopped_after(run.out());
    ASSERT_GE(k, 1) << run.out();
    ASSERT_LT(k, kSteps) << run.out();
    EXPECT_EQ(ck.entries("step-"), std::vector<std::string>{checkpoint_name(k)});  // the one checkpoint, at that step
    const Result resumed = sh(shell_line(train_args(kSteps, {dir_set})) + " --resume --json");
    ASSERT_EQ(resumed.rc, 0) << resumed.err;
    const auto j = nlohmann::json::parse(resumed.out);
    EXPECT_EQ(j["resumed_from"], k);
    EXPECT_EQ(j["params_digest"], digest);
  }
}

// With the optimizer states on "NVMe" (a folder): the run's private swap folder exists while it
// trains, and is gone however the signal ends it.
std::vector<std::string> nvme_sets(const TempDir& swap) {
  return {"zero_optimization.stage=3", "zero_optimization.offload_optimizer.device=nvme",
          "zero_optimization.offload_optimizer.nvme_path=\"" + swap.path.string() + "\""};
}

TEST(Signals, ASecondSigtermStopsAtOnceAndRemovesTheSwapFolder) {
  TempDir swap("sig-swap"), ck("sig-ck2");
  auto sets = nvme_sets(swap);
  sets.push_back("train.checkpoint_dir=\"" + ck.path.string() + "\"");
  Child run(train_args(100000, sets));
  ASSERT_TRUE(run.read_until("step     1/")) << run.out() << run.err();
  EXPECT_EQ(swap.entries().size(), 1u);
  // Hold the run in its progress line, before it could finish a step: the second signal must end it
  // there, without the checkpoint the first one asked for.
  ASSERT_TRUE(run.wait_blocked_on_stdout());
  ::kill(run.pid(), SIGTERM);
  ASSERT_TRUE(run.wait_err("SIGTERM: stopping after the current step")) << run.err();
  ::kill(run.pid(), SIGTERM);
  const int status = run.finish();
  ASSERT_TRUE(WIFSIGNALED(status)) << "exited with " << WEXITSTATUS(status) << "\n" << run.err();
  EXPECT_EQ(WTERMSIG(status), SIGTERM);  // the shell reports 128 + 15
  EXPECT_NE(run.err().find("SIGTERM: stopping at once"), std::string::npos) << run.err();
  EXPECT_EQ(stopped_after(run.out()), -1) << run.out();
  EXPECT_TRUE(ck.entries("step-").empty());
  EXPECT_TRUE(swap.entries().empty());
}

TEST(Signals, SighupAndSigquitEndAtOnceAndRemoveTheSwapFolder) {
  for (const int sig : {SIGHUP, SIGQUIT}) {
    SCOPED_TRACE(sig == SIGHUP ? "SIGHUP" : "SIGQUIT");
    TempDir swap("sig-swap-" + std::to_string(sig));
    Child run(train_args(100000, nvme_sets(swap)));
    ASSERT_TRUE(run.read_until("step     1/")) << run.out() << run.err();
    EXPECT_EQ(swap.entries().size(), 1u);
    ::kill(run.pid(), sig);
    const int status = run.finish();
    ASSERT_TRUE(WIFSIGNALED(status)) << "exited with " << WEXITSTATUS(status) << "\n" << run.err();
    EXPECT_EQ(WTERMSIG(status), sig);
    EXPECT_TRUE(swap.entries().empty());
  }
}

// mpirun SIGKILLed: the rank (here the child of a shell standing in for mpirun, with mpirun's
// variables set) notices its parent is gone, removes its swap folder and exits with one line, rather
// than being aborted by MPI seconds later with the folder left behind.
TEST(Signals, ARankWhoseLauncherIsKilledRemovesTheSwapFolderAndEnds) {
  TempDir swap("sig-swap-orphan"), work("sig-orphan");
  const fs::path pid_file = work / "rank.pid";
  Child launcher({"/bin/sh", "-c", shell_line(train_args(100000, nvme_sets(swap))) + " & echo $! > '" +
                                       pid_file.string() + "'; wait"},
                 {"OMPI_COMM_WORLD_SIZE=1", "OMPI_COMM_WORLD_RANK=0"});
  ASSERT_TRUE(launcher.read_until("step     1/")) << launcher.out() << launcher.err();
  EXPECT_EQ(swap.entries().size(), 1u);
  const std::string rank = slurp(pid_file);
  ASSERT_FALSE(rank.empty());
  ::kill(launcher.pid(), SIGKILL);  // the shell only: the rank is reparented
  const auto gone = [&] {
    const std::string stat = slurp("/proc/" + std::to_string(std::stol(rank)) + "/stat");
    const auto close = stat.rfind(')');
    return close == std::string::npos || stat.compare(close + 2, 1, "Z") == 0;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(1);
  while (!gone() && std::chrono::steady_clock::now() < deadline) {
    launcher.read_available();  // the rank keeps writing progress into the same pipe
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(gone()) << "the rank outlived its launcher";
  EXPECT_TRUE(swap.entries().empty());
  EXPECT_NE(launcher.err().find("zinf: the launcher (mpirun, process "), std::string::npos) << launcher.err();
}

// `zinf train | head`: once the reader is gone, the next line written ends the run with one line on
// stderr and exit 1 (an error, not a signal's 141), the swap folder removed.
TEST(Signals, AClosedStdoutEndsTheRunWithOneLineAndExit1AndRemovesTheSwapFolder) {
  TempDir swap("sig-swap-pipe");
  Child run(train_args(100000, nvme_sets(swap)));
  ASSERT_TRUE(run.read_until("step     1/")) << run.out() << run.err();
  EXPECT_EQ(swap.entries().size(), 1u);
  run.close_stdout();
  const int status = run.finish();
  ASSERT_TRUE(WIFEXITED(status)) << "ended by signal " << WTERMSIG(status) << "\n" << run.err();
  EXPECT_EQ(WEXITSTATUS(status), 1) << run.err();
  EXPECT_NE(run.err().find("zinf: standard output was closed (SIGPIPE): stopping at once"), std::string::npos)
      << run.err();
  EXPECT_TRUE(swap.entries().empty());
}

// mpirun (Open MPI 4) SIGKILLs its ranks odls_base_sigkill_timeout seconds after the SIGTERM it
// sends them, which would leave the swap folder behind: a rank that has not stopped shortly before
// removes it and ends itself. Here the test is the launcher (the rank's parent, mpirun's variables
// set), and the run is held in its progress line so that it cannot stop in time.
TEST(Signals, UnderMpirunARankThatCannotStopBeforeTheSigkillRemovesTheSwapFolderAndEnds) {
  TempDir swap("sig-swap-mpirun"), ck("sig-ck-mpirun");
  auto sets = nvme_sets(swap);
  sets.push_back("train.checkpoint_dir=\"" + ck.path.string() + "\"");
  Child run(train_args(100000, sets),
            {"OMPI_COMM_WORLD_SIZE=1", "OMPI_COMM_WORLD_RANK=0", "OMPI_MCA_odls_base_sigkill_timeout=1"});
  ASSERT_TRUE(run.read_until("step     1/")) << run.out() << run.err();
  ASSERT_TRUE(run.wait_blocked_on_stdout());
  ::kill(run.pid(), SIGTERM);
  ASSERT_TRUE(run.wait_ended()) << run.err();
  const int status = run.finish();
  ASSERT_TRUE(WIFSIGNALED(status)) << "exited with " << WEXITSTATUS(status) << "\n" << run.err();
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
  EXPECT_NE(run.err().find("mpirun kills the ranks 1 s after its SIGTERM: stopping now, without a checkpoint"),
            std::string::npos)
      << run.err();
  EXPECT_TRUE(ck.entries("step-").empty());
  EXPECT_TRUE(swap.entries().empty());
}

}  // namespace
}  // namespace zinf::test
