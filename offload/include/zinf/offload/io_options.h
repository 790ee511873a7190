// zinf/offload/io_options.h — DeepSpeed's `aio` section mapped onto zinf's NVMe engine.
//
//   aio.block_size            → bytes per io_uring request (SQE); larger transfers are split
//   aio.queue_depth           → requests in flight per ring
//   aio.intra_op_parallelism  → rings (I/O threads); DeepSpeed's documented alias thread_count too
//   aio.single_submit         → one io_uring_submit per request instead of one per batch
//   aio.overlap_events        → zinf always refills the ring on each completion (DeepSpeed's "overlap"
//                               mode); false is accepted and changes nothing
//   aio.use_gds               → not used (reads go through the pinned pool)
//   aio.engine (zinf)         → auto | uring | posix
//   aio.sqpoll (zinf)         → IORING_SETUP_SQPOLL: a kernel thread submits (costs a core while busy)
#pragma once

#include <string>

#include "zinf/config.h"
#include "zinf/nvme/store.h"

namespace zinf::offload {

inline nvme::StoreOptions store_options(const AioConfig& a, const std::string& nvme_path) {
  nvme::StoreOptions o;
  o.parent = nvme_path;
  o.engine = a.engine == IoEngineKind::uring   ? nvme::EngineKind::uring
             : a.engine == IoEngineKind::posix ? nvme::EngineKind::posix
                                               : nvme::EngineKind::automatic;
  o.io.block_size = static_cast<std::size_t>(a.block_size);
  o.io.queue_depth = a.queue_depth;
  o.io.threads = a.intra_op_parallelism;
  o.io.single_submit = a.single_submit;
  o.io.sqpoll = a.sqpoll;
  return o;
}

}  // namespace zinf::offload
