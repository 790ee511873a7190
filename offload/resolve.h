// resolve.h — the placement resolved once into what each stage does (internal to zinf_offload).
// The Layout (buffer_specs.h) says where every buffer lives; the StagePlan says, from it, which
// variant of each stage runs: the gradient route and its Reduce, the device's work on a gradient,
// the Update's input, each unit's landing, the window's prefetch, the early start of the Update, the
// norm's sum; make_compute_format (compute_format.h) picks the compute copy's number format. The
// stages pick their strategy objects by these variants when they are made, and their per-step code
// calls through them: it never asks which tier it is on. resolve.cpp is where the stages' placement
// tests are made (beside buffer_specs.cpp, which lays the buffers out), once, at construction.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "zinf/cpu_adam/adam.h"
#include "zinf/offload/buffer_specs.h"
#include "zinf/offload/dataflow.h"
#include "zinf/offload/engine.h"

namespace zinf::offload::detail {

struct StagePlan {
  // ---- the gradient path (gradient_path.cpp) ----
  // How a unit's gradient becomes the Update's input (GradientPath's routes).
  enum class Route { device, ordered_device, accum, host } route = Route::device;
  // The host route's Reduce of a landed bucket: a 16-bit copy (GA 1, one rank), the fp32 sum of one
  // rank, or the cross-rank reduction then the sum of this rank's part.
  enum class HostReduce { copy, sum_one_rank, sum_across_ranks } host_reduce = HostReduce::copy;
  // The device's work on a micro batch's gradient, in order (the optimizer on the device, or
  // device_accum): GradOut — fp32 as it is, or rounded to 16 bits (and widened back in place when it
  // is summed) —, then the reduction across ranks bucket by bucket, then the add into the fp32 sum of
  // micro batches.
  enum class DeviceAction { gradout_fp32, gradout16, gradout16_widen, reduce, sum };
  std::vector<DeviceAction> device_actions;
  // What a cross-rank reduction leaves on this rank: every rank's reduced bucket (gathered after the
  // reduce-scatter), or this rank's part only (partitioned gradients).
  enum class Reduced { whole, own_part } reduced = Reduced::whole;
  // The Update's input: which of a unit's gradient buffers, and its type.
  // ring: gradient streaming's ring slot of the unit, or its gradient read back from NVMe (gradient_stream.h).
  enum class Input { grad, grad16, grad_sum, host_grad, ring } input = Input::grad;
  cpu_adam::GradType input_type = cpu_adam::GradType::fp32;
  // Who sums a host input's norm parts: the Reduce worker as each unit's last micro batch is in, or
  // the barrier (and the speculative Update, which sums them itself).
  enum class HostNorm { reduce_worker, barrier } host_norm = HostNorm::reduce_worker;
  Handoff reduce_to_update = Handoff::host_wait;  // the Update's wait for a reduced gradient

  // ---- the norm barrier (engine.cpp) ----
  // Every rank holds every unit's reduced gradient (each sums its own), or only its shards (their
  // block sums are gathered).
  enum class NormSum { local, gathered } norm_sum = NormSum::local;
  // Checkpoints: the optimizer states this rank holds are the whole units, or its shards (gathered).
  enum class StateRead { whole, gathered } state_read = StateRead::whole;
  // From the last micro batch's forward (Engine::begin_forward), the Update may start early.
  // What may start, in this order of preference: the speculative Update (when the trainer expects a
  // step), the NVMe SwapIn ahead. Empty: nothing starts before the barrier.
  enum class EarlyStart { speculate, swap_in };
  std::vector<EarlyStart> early;

  // ---- the update pipeline and the tiers ----
  enum class Updater { host, device } updater = Updater::host;
  int swap_ahead = 0;  // the swapper's read-ahead: unlimited (-1, overlap exact) or none

  // ---- the parameter homes (param_homes.cpp) ----
  enum class DeviceHome { uploaded, in_place } device_home = DeviceHome::in_place;
  // The windowed units' home: none (no windows), the device (stage-3 shards without offload_param),
  // pinned host memory or NVMe.
  enum class OffloadHome { none, device, pinned, nvme } offload_home = OffloadHome::none;
  // A pinned or NVMe home's Fetch: NVMe → pinned staging in h2d stream order, a read of pageable
  // staging before the copy, or (partitioned parameters) this rank's shard then every rank's gathered.
  enum class Fetch { in_stream, read_first, gather } fetch = Fetch::in_stream;
  // A resident unit's landing: in h2d stream order (its whole copy is this rank's); the other ranks'
  // parts gathered here by the Update worker; or left for the trainer to gather at first use. A
  // windowed unit's shard lands with its Uploads and is gathered at Fetch.
  enum class Landing { in_stream, gather_here, gather_by_trainer, shard };
  std::vector<Landing> landing;  // per unit
  // The handoffs the homes claim where they depend on the placement.
  bool device_home_claims = false;      // some unit's compute copy lives on the device
  bool upload_to_fetch = false;         // the Update's Upload reaches a window slot's Fetch in stream order
  bool working_weights_claims = false;  // the device Update's landing derives fp32 working weights
  Handoff update_to_param_write = Handoff::host_wait;

  // ---- the parameter window (param_window.cpp) ----
  // Per unit, the windowed units a use of it prefetches, nearest first (overlap exact): [0] forward,
  // [1] backward. Empty without overlap.
  std::vector<std::vector<std::size_t>> prefetch[2];
  // Partitioned parameters: a prefetch waits for its unit's landing (every rank gathers the same
  // units in the same order), instead of fetching on demand when it has not landed.
  enum class PrefetchWait { skip_unlanded, wait_landing } prefetch_wait = PrefetchWait::skip_unlanded;
  enum class FetchDone { async, synchronous } fetch_done = FetchDone::async;
  // Where the model reads a unit's weights: its own buffer, or a window slot.
  enum class Weights { resident, window };
  std::vector<Weights> weights;  // per unit
  Precision weights_precision = Precision::fp32;
};

struct EngineState;

// The plan of the stages for `layout`; `cfg` says whether the device transport is stream-ordered.
StagePlan resolve_stages(const Layout& layout, const EngineConfig& cfg);
// Whether every device collective is issued by the trainer's thread (a stream-ordered transport with
// several ranks).
bool resolve_ordered_collectives(const Layout& layout, const EngineConfig& cfg);
// Refuses a placement the engine cannot run with these kernels (one line, before anything is allocated).
void check_placement(const Layout& layout, bool kernels_take_states);
// The communicators of the threads that run collectives (none with one rank), in one order on every rank.
void open_communicators(EngineState& s);
// The placement in words, for Engine::describe.
std::string describe_placement(const Layout& layout, std::size_t pinned_capacity);

}  // namespace zinf::offload::detail
