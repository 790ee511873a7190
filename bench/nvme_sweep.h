// nvme_sweep.h — the bandwidth sweep behind `zinf bench nvme` (DeepSpeed's ds_nvme_tune, in
// one binary): request size × queue depth × I/O threads, for read and for write, on an O_DIRECT file
// in a private swap directory; a plain sequential O_DIRECT pread/pwrite pass measured in the same run
// as the reference; and a swap mode that streams the optimizer pattern (read sub-group g+1 ‖ touch g
// ‖ write g−1) through the pipelined swapper.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "zinf/nvme/async_io.h"

namespace zinf::nvme {

struct SweepOptions {
  std::string dir;
  std::uint64_t file_bytes = std::uint64_t{4} << 30;
  std::uint64_t cell_bytes = std::uint64_t{256} << 20;  // moved per cell
  std::vector<std::size_t> block_sizes = {128 << 10, 512 << 10, 1 << 20, 4 << 20, 8 << 20};
  std::vector<int> depths = {1, 4, 16, 64};
  std::vector<int> threads = {1, 2};
  AsyncIoKind engine = AsyncIoKind::automatic;
  std::size_t swap_item = 64 << 20;  // one "sub-group"
  int swap_buffers = 4;
};

struct SweepCell {
  bool write = false;
  std::size_t block = 0;
  int depth = 0, threads = 0;
  double gbps = 0;
};

struct SweepResult {
  std::string engine;  // which I/O back end ran and why
  std::vector<SweepCell> cells;
  SweepCell best_read, best_write;
  SweepCell best_combined_read, best_combined_write;  // the one setting with the highest read + write
  double plain_read_gbps = 0, plain_write_gbps = 0;   // sequential O_DIRECT pread/pwrite, 1 MiB, QD 1
  double swap_gbps = 0;                               // (bytes read + written) / time in swap mode
  double swap_ratio = 0;                              // time at the best raw cells (reads then writes) / swap time
  std::uint64_t swap_bytes = 0;
};

// Throws zinf::IoError / zinf::Error with the path on failure. `progress` gets one line per step.
SweepResult run_sweep(const SweepOptions& o, const std::function<void(const std::string&)>& progress);

}  // namespace zinf::nvme
