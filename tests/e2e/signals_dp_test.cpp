// signals_dp_test.cpp — the ranks of a job stopped by a signal: SIGTERM or SIGUSR1 to mpirun stops
// every rank after the same step, with one checkpoint; and an environment launch (RANK / WORLD_SIZE /
// MASTER_ADDR / MASTER_PORT) that fails prints zinf's line only and leaves no rendezvous folder.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "child.h"
#include "common/temp_dir.h"
#include "mpirun.h"
#include "shell.h"

namespace zinf::test {
namespace {

namespace fs = std::filesystem;

class SignalsDp : public MpirunTest {};

// mpirun (Open MPI 4) passes SIGINT and SIGTERM on as SIGTERM, odls_base_sigkill_timeout seconds
// later, and SIGKILLs as long after that; SIGUSR1 it forwards at once. The timeout is kept short here
// (mpirun waits it out twice whatever the ranks do), yet long enough for a tiny step and checkpoint.
TEST_F(SignalsDp, SigtermOrSigusr1ToMpirunStopsEveryRankAfterTheSameStepWithOneCheckpoint) {
  for (const int sig : {SIGTERM, SIGUSR1}) {
    const std::string name = sig == SIGTERM ? "SIGTERM" : "SIGUSR1";
    SCOPED_TRACE(name);
    TempDir ck("sigdp-ck-" + name);
    std::vector<std::string> args = {ZINF_MPIEXEC,
                                     "--oversubscribe",
                                     "--bind-to",
                                     "none",
                                     "--mca",
                                     "odls_base_sigkill_timeout",
                                     sig == SIGTERM ? "2" : "1",
                                     "-np",
                                     "2",
                                     ZINF_BIN,
                                     "train",
                                     "--config",
                                     kTinyConfig};
    for (const std::string s : {"train.steps=100000", "model.n_layer=1", "model.d_model=32", "model.n_head=2",
                                "model.seq_len=32", "train_micro_batch_size_per_gpu=2", "train.eval_batches=1",
                                "train.eval_interval=0", "device.threads=1", "steps_per_print=20"})
      args.insert(args.end(), {"--set", s});
    args.insert(args.end(), {"--set", "train.checkpoint_dir=\"" + ck.path.string() + "\""});
    Child job(args);
    ASSERT_TRUE(job.read_until("step    20/")) << job.out() << job.err();
    ::kill(job.pid(), sig);
    const int status = job.finish();
    ASSERT_TRUE(WIFEXITED(status));
    // mpirun's own exit status: 1 after it ended the job on SIGTERM, the ranks' 128 + 10 after SIGUSR1.
    EXPECT_EQ(WEXITSTATUS(status), sig == SIGTERM ? 1 : 128 + SIGUSR1) << job.err();
    EXPECT_NE(job.err().find(name + ": stopping after the current step"), std::string::npos) << job.err();
    EXPECT_EQ(job.err().find("stopping now, without a checkpoint"), std::string::npos) << job.err();
    ASSERT_EQ(count(job.out(), "interrupted: stopping after step "), 1u) << job.out();
    const long k = stopped_after(job.out());
    const std::string step_dir = checkpoint_name(k);
    EXPECT_EQ(ck.entries("step-"), std::vector<std::string>{step_dir});
    // Complete and valid: it loads, verified, and evaluates.
    const Result ev = sh(std::string(ZINF_BIN) + " eval --json --config " + kTinyConfig + " --checkpoint " +
                         (ck.path / step_dir).string() +
                         " --set model.n_layer=1 --set model.d_model=32 --set model.n_head=2 --set model.seq_len=32"
                         " --set train_micro_batch_size_per_gpu=2 --set train.eval_batches=1 --set device.threads=1");
    ASSERT_EQ(ev.rc, 0) << ev.err;
    EXPECT_EQ(nlohmann::json::parse(ev.out)["of"], "checkpoint step " + std::to_string(k));
  }
}

// Launched by environment variables, a scheduler may signal one rank only: the ranks agree at the
// step's end, all stop after the same step, and all exit with the signal's code.
TEST_F(SignalsDp, SigtermToOneRankOfAnEnvironmentLaunchStopsEveryRank) {
  TempDir ck("sigdp-ck-env");
  const std::string port = std::to_string(20000 + (::getpid() + 3) % 12000);
  std::vector<std::string> args = {ZINF_BIN, "train", "--config", kTinyConfig};
  for (const std::string s : {"train.steps=100000", "model.n_layer=1", "model.d_model=32", "model.n_head=2",
                              "model.seq_len=32", "train_micro_batch_size_per_gpu=2", "train.eval_batches=1",
                              "train.eval_interval=0", "device.threads=1", "steps_per_print=1"})
    args.insert(args.end(), {"--set", s});
  args.insert(args.end(), {"--set", "train.checkpoint_dir=\"" + ck.path.string() + "\""});
  const std::vector<std::string> env = {"MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port, "WORLD_SIZE=2"};
  auto with = [&](const std::string& kv) {
    auto e = env;
    e.push_back(kv);
    return e;
  };
  Child rank1(args, with("RANK=1"));
  Child rank0(args, with("RANK=0"));
  ASSERT_TRUE(rank0.read_until("step     1/")) << rank0.out() << rank0.err() << rank1.err();
  ::kill(rank1.pid(), SIGTERM);
  const int s0 = rank0.finish(), s1 = rank1.finish();
  ASSERT_TRUE(WIFEXITED(s0) && WIFEXITED(s1)) << rank0.err() << rank1.err();
  EXPECT_EQ(WEXITSTATUS(s0), 128 + SIGTERM) << rank0.err();  // rank 0 learnt the signal from rank 1
  EXPECT_EQ(WEXITSTATUS(s1), 128 + SIGTERM) << rank1.err();
  ASSERT_EQ(count(rank0.out(), "interrupted: stopping after step "), 1u) << rank0.out();
  const long k = stopped_after(rank0.out());
  const std::string step_dir = checkpoint_name(k);
  EXPECT_EQ(ck.entries("step-"), std::vector<std::string>{step_dir});
  EXPECT_EQ(rank0.err().find("left the job"), std::string::npos) << rank0.err();
  EXPECT_EQ(rank1.err().find("left the job"), std::string::npos) << rank1.err();
}

// Without mpirun there is no launcher to print a banner or clean up: a failing rank prints its one
// line, tells the others on the rendezvous connections, removes its rendezvous folder and exits.
TEST_F(SignalsDp, AFailedEnvironmentLaunchPrintsOneLineAndLeavesNoRendezvousFolder) {
  TempDir tmp("sigdp-tmp");
  const std::string port = std::to_string(20000 + (::getpid() + 7) % 12000);
  // zinf's rendezvous folders go to the private TMPDIR; Open MPI's own session folders where they go
  // for any launch (its daemons remove those in their own time).
  const std::string env = "TMPDIR=" + tmp.path.string() +
                          " OMPI_MCA_orte_tmpdir_base=" + fs::temp_directory_path().string() +
                          " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port + " WORLD_SIZE=2 ";
  const std::string train =
      std::string(ZINF_BIN) + " train --config " + kTinyConfig + " --set train.steps=40 --set model.n_layer=1";
  // Rank 1 never comes.
  Result r = sh("ZINF_RENDEZVOUS_TIMEOUT=1 " + env + "RANK=0 " + train);
  EXPECT_EQ(r.rc, 2);
  EXPECT_EQ(lines(r.err), 1u) << r.err;
  EXPECT_EQ(
      r.err.rfind("zinf: rank 0: rendezvous at 127.0.0.1:" + port + " (rank 0 of 2): rank(s) 1 did not arrive", 0), 0u)
      << r.err;
  EXPECT_TRUE(tmp.entries("zinf-rendezvous-").empty());
  // Both arrive, connected through MPI, and fail: their configs differ.
  const std::string err1 = (tmp.path / "rank1.err").string();
  r = sh("{ (" + env + "RANK=1 " + train + " --set optimizer.params.lr=0.001 >/dev/null 2>" + err1 +
         "; echo exit status $? >>" + err1 + ") & " + env + "RANK=0 " + train + "; rc=$?; wait; (exit $rc); }");
  EXPECT_EQ(r.rc, 2);
  EXPECT_EQ(lines(r.err), 1u) << r.err;
  EXPECT_NE(r.err.find("zinf: rank 0: " + kTinyConfig + ": the ranks of this job were given different configs"),
            std::string::npos)
      << r.err;
  const std::string e1 = slurp(err1);
  EXPECT_EQ(lines(e1), 2u) << e1;  // its own line, and the shell's "exit status"
  EXPECT_NE(e1.find("zinf: rank 1: " + kTinyConfig + ": the ranks of this job were given different configs"),
            std::string::npos)
      << e1;
  EXPECT_NE(e1.find("exit status 2"), std::string::npos) << e1;
  EXPECT_TRUE(tmp.entries("zinf-rendezvous-").empty());
}

}  // namespace
}  // namespace zinf::test
