// zinf/nvme/probe.h — what a directory offers as a swap location: filesystem, free space, and
// whether O_DIRECT and io_uring actually work there (tried, not assumed).
//
// Leaf module: knows nothing of models, devices or the scheduler. Thread-safe (no shared state).
#pragma once

#include <cstdint>
#include <string>

namespace zinf::nvme {

struct PathProbe {
  std::string path;
  bool exists = false;
  std::string filesystem;        // "ext4", "xfs", "tmpfs", … or "0x<magic>"
  std::uint64_t free_bytes = 0;  // available to this user
  std::uint64_t total_bytes = 0;
  std::uint32_t dio_align = 0;  // O_DIRECT memory/offset alignment from statx (0 if unknown)
  bool writable = false;        // a scratch file could be created (not access(): root passes it on read-only mounts)
  bool odirect = false;         // an aligned O_DIRECT write+read round-trip succeeded
  std::string odirect_reason;   // why not, when false
  bool io_uring = false;        // a ring was set up and completed a read
  std::string io_uring_reason;  // why not, when false
};

// Probes `dir` by creating (and removing) a small scratch file in it. Never throws for the
// environment's answers (they go into the reasons); an empty path is a programming error.
PathProbe probe_path(const std::string& dir);

// Whether io_uring can be set up at all in this process (sysctl, seccomp, kernel), with the reason.
bool io_uring_available(std::string* reason);

}  // namespace zinf::nvme
