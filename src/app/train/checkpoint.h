// app/train/checkpoint.h — atomic, verified training checkpoints, independent of where the states lived.
//
// A checkpoint is a directory `<checkpoint_dir>/step-<NNNNNNNN>/` holding
//   states.bin     every layer unit's fp32 master, Adam m and v, in unit order (read back through the
//                  offload engine from the device, host memory or NVMe — never by copying swap files)
//   manifest.json  format and version, step, optimizer steps, data position, loss-scaler state, model
//                  shape, precision, the resolved config, one XXH64 checksum per tensor, and an XXH64
//                  checksum of the manifest itself (so an edited or damaged step or data position is
//                  caught like a damaged tensor)
// It is written under a temporary name, every file fsync'ed, renamed into place and the directory
// fsync'ed, so a checkpoint either exists whole or not at all.
//
// A checkpoint that cannot be used is one of two things, and they are handled differently:
//   corrupt       its files are damaged (a missing or unparsable manifest, a checksum mismatch, a
//                 truncated states.bin, a file that is not a regular file) or its manifest holds
//                 numbers no run can have written (out of range, or contradicting each other or its
//                 model): `latest` falls back to an older one, and a run that writes
//                 checkpoints moves it aside as `step-N.corrupt` — reported, never counted by
//                 keep_last, never deleted;
//   incompatible  it is sound but this config cannot continue it (another model family or shape, a
//                 format from a newer zinf): refused, with nothing written or deleted.
// Errors are one line naming the file (and the tensor); both kinds are bad input (exit code 2).
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "app/config/config.h"
#include "model/shape.h"
#include "zinf/error.h"

namespace zinf {

class CorruptCheckpoint : public ConfigError {
 public:
  using ConfigError::ConfigError;
};
class IncompatibleCheckpoint : public ConfigError {
 public:
  using ConfigError::ConfigError;
};

struct CheckpointState {
  std::int64_t step = 0;        // training steps completed
  std::int64_t opt_steps = 0;   // optimizer steps applied (skipped steps excluded)
  std::int64_t rows_drawn = 0;  // training windows drawn from the data RNG
  std::int64_t skipped = 0;
  double loss_scale = 1;
  std::int64_t scaler_iter = 0, scaler_last_overflow = -1;
  int scaler_hysteresis = 0;
  Precision precision = Precision::fp32;  // the precision it was trained in (load only)
  // How that run kept Adam's m and v (load only; the checkpoint holds them in fp32 either way).
  cpu_adam::StateFormat optimizer_states = cpu_adam::StateFormat::fp32;
};

// What a checkpoint's manifest says about it, once the manifest has passed its checks.
struct CheckpointInfo {
  std::string path;
  std::int64_t step = 0;
  ModelShape shape;
  Precision precision = Precision::fp32;
  cpu_adam::StateFormat optimizer_states = cpu_adam::StateFormat::fp32;  // as the manifest records it
  bool unchecked_manifest = false;  // written before manifests carried a checksum (format version 1)
};

// Reads and checks a checkpoint's manifest: format, version, its own checksum. Throws
// CorruptCheckpoint (damaged or missing) or IncompatibleCheckpoint (a newer format).
CheckpointInfo read_checkpoint_info(const std::string& path);

// Reads or writes unit u's (master, m, v), each n floats.
using StatesReader = std::function<void(std::size_t u, float* master, float* m, float* v)>;
using StatesWriter = std::function<void(std::size_t u, const float* master, const float* m, const float* v)>;

// Verifies a checkpoint directory (manifest, sizes, checksums, shape) and loads it; with
// `verify_first`, every checksum is checked before `write` sees the first unit. Throws
// CorruptCheckpoint or IncompatibleCheckpoint naming the file and tensor.
CheckpointState load_checkpoint(const std::string& path, const ModelShape& shape, const StatesWriter& write,
                                bool verify_first = true);

// The model shape a checkpoint was written for (from its manifest).
ModelShape checkpoint_shape(const std::string& path);

// The model's fp32 weights (each unit's master copy, layer_units order) of a verified checkpoint,
// as export and generation read them.
std::vector<std::vector<float>> load_checkpoint_weights(const std::string& path, const ModelShape& shape);

// Checks a checkpoint without loading it (same checks as load_checkpoint).
void verify_checkpoint(const std::string& path, const ModelShape& shape);

// The step-N checkpoint directories under `dir` (step, path), newest first; none when `dir` does not exist.
std::vector<std::pair<std::int64_t, std::string>> list_checkpoints(const std::string& dir);

// Which checkpoint a run starts from, found without writing anything.
struct ResumeChoice {
  std::string path;                  // the checkpoint to load; "" when there is none
  std::int64_t step = 0;             // its step (0: none)
  std::vector<std::string> corrupt;  // newer checkpoints passed over as corrupt (paths)
  std::vector<std::string> notes;    // one line each: why each was passed over, and format notes
};
// `which` is a checkpoint directory or "latest" (the newest valid one under `dir`: corrupt newer ones
// are passed over; an incompatible newest one is refused, never skipped: it is the run's latest
// state). The chosen checkpoint is verified in full. Throws CorruptCheckpoint for an explicit
// directory that is damaged or missing, IncompatibleCheckpoint for one this model cannot continue.
ResumeChoice choose_checkpoint(const std::string& dir, const std::string& which, const ModelShape& shape);

// Renames a corrupt checkpoint to `<name>.corrupt` (or `.corrupt-2`, … when taken) so that it is kept
// for inspection but no longer counts as a checkpoint. Returns the new path.
std::string move_corrupt_aside(const std::string& path);

// A run's checkpoint directory: writes checkpoints and applies keep_last to the ones it can vouch for.
class CheckpointDir {
 public:
  using Log = std::function<void(const std::string&)>;
  CheckpointDir(std::string dir, int keep_last, const ModelShape& shape, Log log);

  // A checkpoint known valid (verified when the run resumed from it): keep_last need not read it again.
  void mark_verified(const std::string& path);
  // Checkpoints this run replaces (train.overwrite_checkpoints): removed by the first save, once the
  // new checkpoint has been written and read back verified — until then they stay untouched.
  void replace_on_first_save(const std::vector<std::string>& paths);

  // Writes step `s.step` atomically, then keeps the newest `keep_last` verified checkpoints: each
  // older one is verified (once per run) before it is renamed step-N.pruned-PID and deleted; a
  // corrupt one is moved aside with a line, not counted, not deleted; one of another model is left
  // alone. The checkpoint just written is the newest valid one and is never pruned. Returns its path.
  // Throws zinf::IoError (file, errno) on failure, leaving earlier checkpoints untouched.
  std::string save(const Config& c, const CheckpointState& s, const StatesReader& read);

 private:
  void prune();
  std::string dir_;
  int keep_last_;
  ModelShape shape_;
  Log log_;
  std::set<std::string> verified_, foreign_;
  std::vector<std::string> replace_;
};

// Puts a checkpoint directory back in order after a run that was killed while saving or pruning: its
// temporary is removed, the checkpoints it had renamed aside to replace are renamed back when it died
// before publishing its own (removed when it had published), and a checkpoint keep_last had renamed
// step-N.pruned-PID to delete is removed. Files of a live process are left alone, and so — with one
// line — is any such name that is a symbolic link (never followed) or holds anything but regular
// manifest.json and states.bin files. Call it only holding the folder's write lock.
void recover_interrupted_saves(const std::string& dir, const std::function<void(const std::string&)>& log);

// The lock of a checkpoint folder: flock(2) on <dir>/.zinf-lock, held from construction to
// destruction and released by the kernel however the process ends. One writer (a run that writes
// checkpoints: `zinf train`, `--resume`, overwrite_checkpoints) holds it exclusively; readers
// (`zinf eval`, `export`, `generate`) share it, so a checkpoint is never pruned while it is read. A
// folder without the file has had no writer that locks: a reader then reads without a lock (and
// creates nothing). Refused — another writer, a writer beside readers, a reader beside a writer —
// is a ConfigError (exit code 2) naming the folder and the holder's PID and command (from
// /proc/locks, else from the file); nothing has been read or written. Only rank 0 of a
// data-parallel job takes it (the other ranks write nothing there).
class CheckpointLock {
 public:
  enum class Mode { write, read };
  // `what` names the folder's role in errors ("train.checkpoint_dir", "--checkpoint").
  CheckpointLock(const std::string& dir, Mode mode, const std::string& what);
  ~CheckpointLock();
  CheckpointLock(const CheckpointLock&) = delete;
  CheckpointLock& operator=(const CheckpointLock&) = delete;

  // A writer, once its run has passed every check: writes "pid N" and "command …" into the lock file
  // (for a person who looks, and for a refusal where /proc/locks is unreadable). A run refused
  // before it leaves the file as it was.
  void announce();

 private:
  int fd_ = -1;
  bool write_ = false;
};

// The folder holding the checkpoint `checkpoint` (its train.checkpoint_dir), whose lock a reader shares.
std::string checkpoint_folder(const std::string& checkpoint);

// Test hook: the Nth save from now (1-based) fails with ENOSPC half-way through states.bin; 0
// disables. The environment variable ZINF_TEST_CHECKPOINT_ENOSPC_AT sets it for a whole process.
void set_checkpoint_fault(int nth_save);

}  // namespace zinf
