// zinf/checkpoint.h — atomic, verified training checkpoints, independent of where the states lived.
//
// A checkpoint is a directory `<checkpoint_dir>/step-<NNNNNNNN>/` holding
//   states.bin     every layer unit's fp32 master, Adam m and v, in unit order (read back through the
//                  offload engine from the device, host memory or NVMe — never by copying swap files)
//   manifest.json  format and version, step, optimizer steps, data position, loss-scaler state, model
//                  shape, the resolved config, and one XXH64 checksum per tensor
// It is written under a temporary name, every file fsync'ed, renamed into place and the directory
// fsync'ed, so a checkpoint either exists whole or not at all; the newest `keep_last` are kept.
// Loading verifies the manifest, the sizes and every checksum, and that the model shape matches.
// Errors are one line naming the file (and the tensor).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "zinf/config.h"
#include "zinf/model.h"

namespace zinf {

struct CheckpointState {
  std::int64_t step = 0;        // training steps completed
  std::int64_t opt_steps = 0;   // optimizer steps applied (skipped steps excluded)
  std::int64_t rows_drawn = 0;  // training windows drawn from the data RNG
  std::int64_t skipped = 0;
  double loss_scale = 1;
  std::int64_t scaler_iter = 0, scaler_last_overflow = -1;
  int scaler_hysteresis = 0;
};

// Reads or writes unit u's (master, m, v), each n floats.
using StatesReader = std::function<void(std::size_t u, float* master, float* m, float* v)>;
using StatesWriter = std::function<void(std::size_t u, const float* master, const float* m, const float* v)>;

// Writes step `s.step` atomically and prunes to `keep_last`. Returns the checkpoint's path.
// Throws zinf::IoError (file, errno) on failure, leaving earlier checkpoints untouched.
std::string save_checkpoint(const std::string& dir, int keep_last, const Config& c, const ModelShape& shape,
                            const CheckpointState& s, const StatesReader& read);

// Verifies a checkpoint directory (manifest, sizes, checksums, shape) and loads it. Throws
// zinf::Error naming the file and tensor on any problem.
CheckpointState load_checkpoint(const std::string& path, const ModelShape& shape, const StatesWriter& write);

// The model shape a checkpoint was written for (from its manifest).
ModelShape checkpoint_shape(const std::string& path);

// Checks a checkpoint without loading it (same checks as load_checkpoint).
void verify_checkpoint(const std::string& path, const ModelShape& shape);

// The newest valid checkpoint under `dir` ("" when there is none); each invalid newer one adds a line
// to `skipped` saying why it was passed over.
std::string latest_valid_checkpoint(const std::string& dir, const ModelShape& shape, std::vector<std::string>* skipped);

// Test hook: the Nth save from now (1-based) fails with ENOSPC half-way through states.bin; 0
// disables. The environment variable ZINF_TEST_CHECKPOINT_ENOSPC_AT sets it for a whole process.
void set_checkpoint_fault(int nth_save);

}  // namespace zinf
