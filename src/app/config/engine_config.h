// engine_config.h — a run config's settings for the layers below it: the offload engine's
// configuration (placement, sizes, overlap, the NVMe stores) and DeepSpeed's `aio` section mapped
// onto the NVMe engine. Shared by `zinf train`, `zinf plan` and `zinf bench step`.
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

#include "app/config/config.h"
#include "model/shape.h"
#include "zinf/nvme/store.h"
#include "zinf/offload/engine.h"

namespace zinf {

nvme::StoreOptions store_options(const AioConfig& a, const std::string& nvme_path);
// Parameter units fetched ahead under param offload: stage3_prefetch_bucket_size / one block, 1…4.
int prefetch_depth(const Config& c, const ModelShape& s);
// Whether the run page-locks its host staging: DeepSpeed's pin_memory of offload_optimizer and of
// offload_param (both true by default); false in either keeps the engine's pool unlocked (and
// unregistered with the device) and the activation checkpoints' host rows (cpu_checkpointing, which
// has no key of its own) pageable — but for the optimizer on the device with the parameters
// offloaded: the device's Update writes their host homes through mapped memory (config notes it).
bool pin_memory(const Config& c);
// The placement input of a run of `c` with the model `shape`, for rank `rank` of `world` data-parallel
// ranks: every setting the plan and the engine decide the layout from (the embedding and the final
// LayerNorm are persistent). `zinf plan` and `zinf train` both make theirs here.
offload::PlanInput plan_input(const Config& c, const ModelShape& shape, int world, int rank);
// The engine configuration of rank `rank` of `world` in a run of `c`: its plan_input and the rest.
offload::EngineConfig engine_config(const Config& c, int host_threads, int world = 1, int rank = 0);

}  // namespace zinf
