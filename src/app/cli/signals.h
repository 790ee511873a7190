// signals.h — how `zinf` ends on a signal.
//
//   SIGINT, SIGTERM, SIGUSR1   while a run can stop at a step boundary: stop after the current step or
//                              evaluation batch, with a checkpoint when train.checkpoint_dir is set,
//                              and exit with 128 + the signal's number. The ranks of a job agree on
//                              the step (train()). Before that (setup: nothing to save) and on a
//                              second signal: at once.
//   SIGHUP, SIGQUIT            at once.
// "At once" removes this process's scratch first — the NVMe swap directories and an environment
// launch's rendezvous files — and then ends the process by the signal itself (the shell reports
// 128 + its number). A signal ignored when zinf starts (nohup, a background job) stays ignored.
//
// Under Open MPI's mpirun, whose SIGINT and SIGTERM reach the ranks as SIGTERM followed by SIGKILL
// odls_base_sigkill_timeout seconds later, a rank that has not stopped shortly before the SIGKILL
// removes its scratch and ends by itself.
#pragma once

#include <atomic>

namespace zinf::cli {

// Installs the handlers; call first thing in main, before anything creates scratch files.
void install_signal_handlers();
// Set by the first stopping signal: TrainHooks::stop.
const std::atomic<bool>& stop_requested();
// TrainHooks::stoppable: set by train() once a stop can wait for the step's end.
std::atomic<bool>& run_stoppable();
// Called when train() has returned: what is left is closing (mpirun's deadline then ends the rank
// quietly — nothing is lost any more).
void note_run_finished();
// TrainHooks::stop_signal: the signal that set stop_requested().
const std::atomic<int>& stop_signal();
// The exit code of a run that stopped on a signal: 128 + the signal's number — `sig` (the job's, from
// TrainResult::stop_signal), else the one this process received.
int stopped_exit_code(int sig = 0);

}  // namespace zinf::cli
