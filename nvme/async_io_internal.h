// async_io_internal.h — pieces shared by the AsyncIo back ends (internal to zinf_nvme).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include "zinf/nvme/async_io.h"

namespace zinf::nvme::detail {

// One request: a block_size piece of a transfer.
struct Request {
  std::shared_ptr<IoOp> op;
  bool write = false;
  int fd = -1;
  char* buf = nullptr;
  std::uint64_t len = 0;
  std::uint64_t offset = 0;
  std::uint64_t done = 0;  // bytes already transferred (short transfers resume from here)
  const std::string* path = nullptr;
};

// "write /swap/zinf-1/store.0 offset 1048576 length 65536: No space left on device (errno 28)"
std::string describe(const Request& r, int err);

// Splits a transfer into requests of at most block_size bytes, all pointing at one new IoOp.
struct Split {
  std::shared_ptr<IoOp> op;
  std::deque<Request> requests;
};
Split split(bool write, int fd, void* buf, std::uint64_t len, std::uint64_t offset, std::size_t block_size,
            const std::string& path, std::function<void()> on_done);

std::unique_ptr<AsyncIo> make_uring_io(const AsyncIoOptions& o, FaultPlan* faults);  // throws IoError
std::unique_ptr<AsyncIo> make_posix_io(const AsyncIoOptions& o, FaultPlan* faults);

}  // namespace zinf::nvme::detail
