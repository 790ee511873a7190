// zinf/offload/buffer_specs.h — every buffer the offload engine allocates, as one list: the byte
// model that `zinf plan` sums into its rows (make_plan, placement.h) and that the engine allocates
// from (each stage asks for its buffers' specs instead of sizing them itself), so the plan and a
// run cannot drift apart.
//
// From the placement inputs (PlanInput) come first the layout — which units stay resident and which
// visit a window slot, the range of each unit this rank keeps of each state, the effective
// sub-group and bucket sizes, the window's slot count — and then one BufferSpec per buffer, or per
// set of equal buffers: what it holds, the tier it lives on, its size as the engine asks for it,
// how many there are, the unit it belongs to, and the plan row it is counted in.
// Pure functions; thread-safe.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "zinf/offload/placement.h"

namespace zinf::offload {

// One unit's place in the layout. Ranges are this rank's (global element offsets): its shard under
// the ZeRO stage (see shard_of), or the whole unit.
struct UnitLayout {
  std::uint64_t n = 0;
  bool persistent = false;     // the model keeps it on the device under param offload (embedding, final norm)
  bool kept = false;           // resident and whole: persistent, or partitioned parameters at or under the threshold
  bool windowed = false;       // its compute copy lives off the device (or sharded) and visits a window slot
  bool grad_windowed = false;  // its gradient passes through a device gradient slot instead of a buffer of its own
  Shard state_range;           // the optimizer states this rank keeps (master, m, v)
  Shard grad_range;            // the reduced gradient this rank keeps for its Update
  Shard param_range;           // the compute copy in this unit's home
};

struct Layout {
  bool pin_memory = true;           // PlanInput::pin_memory (the plan's columns only; the specs keep Tier::pinned)
  Tier pool_tier = Tier::pinned;    // where the staging pool's pages count: pinned, or host memory without pin_memory
  Precision precision = Precision::fp16;  // PlanInput::precision
  bool mixed = false;               // fp16/bf16: the compute copy is 16-bit
  std::uint64_t compute_bytes = 4;  // bytes per element of the compute copy
  bool fp32_work = false;           // 16-bit runs keep fp32 working weights beside the resident copy
  bool device_blocks = false;       // device buffers take whole allocator blocks (footprint)
  bool optimizer_offloaded = false, param_offloaded = false;
  OffloadDevice optimizer = OffloadDevice::none, param = OffloadDevice::none;
  bool exact = true;          // PlanInput::overlap is Overlap::exact
  int optimizer_buffers = 0;  // the swapper's buffers (optimizer on NVMe; one without overlap)
  cpu_adam::StateFormat states = cpu_adam::StateFormat::fp32;  // how m and v are stored
  std::int64_t grad_accum = 1;  // micro batches per step
  int prefetch_depth = 1;       // parameter units fetched ahead (with windows)
  int world = 1, rank = 0, stage = 0;
  bool parallel = false;                                                 // more than one rank
  bool shard_states = false, shard_grads = false, shard_params = false;  // by the ZeRO stage, with several ranks
  bool fp32_sum = false;                    // the Update reads an fp32 sum of micro batches (and ranks)
  // PlanInput::device_grad_accum where it applies (optimizer off the device, one rank, GA > 1): an
  // fp32 sum per unit on the device, and GradOut of that sum (fp32) once per step.
  bool device_accum = false;
  // PlanInput::layer_major where it applies (optimizer off the device, GA > 1): the Reduce sums each
  // unit's micro batches as they come one after another; `head_unit` (PlanInput) has GA device
  // gradient buffers, its micro batches' gradients being open together.
  bool layer_major = false;
  int head_unit = -1;
  bool windows = false;                     // some units visit a parameter window slot
  // Effective reduce-bucket and sub-group sizes, elements: the configured ones, at most the largest unit;
  // with one rank the bucket, and with the optimizer in host memory the sub-group, at most 4M elements
  // (they only pace the staging then).
  std::uint64_t bucket = 0, sub_group = 0;
  int window_slots = 0;                     // parameter window slots (0 without windows)
  std::uint64_t max_unit = 0;               // the largest unit
  std::uint64_t max_windowed = 0;           // the largest unit that visits the parameter window
  std::uint64_t max_grad_windowed = 0;      // the largest non-persistent unit (the gradient slots' size)
  std::uint64_t comm_scratch = 0;           // elements: every rank's contribution to this rank's part of a bucket
  std::uint64_t n_params = 0;
  std::uint64_t batch_tokens = 0;  // tokens per micro batch of the training loop's batch slots (0: none)
  // The speculative Update (PlanInput::speculative, with the optimizer off the device and overlap exact): NVMe
  // sub-group tensors hold two slots; host memory backs up at most `backup_subgroups` sub-groups.
  bool speculative = false;
  std::uint64_t backup_subgroups = 0;
  // Gradient streaming (PlanInput::gradient_streaming; with or without `speculative`): no host gradient, a ring
  // of `stream_slots` pinned buffers of the largest unit's gradient, and each unit's gradient on NVMe,
  // `stream_grad_bytes` bytes per element (2: the 16-bit gradient at GA 1; 4: the fp32 sum, or fp32).
  bool streaming = false;
  std::uint64_t stream_slots = 0, stream_grad_bytes = 0;
  std::uint64_t checkpoint_device = 0, checkpoint_pinned = 0;  // activation checkpoints (PlanInput)
  std::vector<UnitLayout> units;
};

// Throws (ZINF_CHECK) on inputs no engine could run: no units, a
// rank outside the world, a stage outside 0–3, a persistence list of the wrong length.
Layout make_layout(const PlanInput& in);

// What a buffer holds.
enum class Buffer {
  // one per unit
  param,      // the compute copy in its home: device (resident, or a stage-3 shard), pinned host or NVMe
  work,       // fp32 working weights of a resident 16-bit unit
  grad,       // the model's fp32 gradient on the device (units whose gradient has no slot)
  grad16,     // its 16-bit rounding on the device: the device Update's input
  grad_sum,   // the fp32 sum of micro batches (and ranks) on the device
  host_grad,  // the Update's input in host memory: the fp32 sum, or the landed 16-bit gradient
  nvme_grad,  // gradient streaming: the Update's input of the unit on NVMe (read back for a second pass)
  master,
  adam_m,
  adam_v,              // optimizer states on the device or in host memory (m, v: the state format, then
                       // any scales of it)
  optimizer_subgroup,  // NVMe: one tensor per sub-group holding master | m | v (| scales) (SubGroupLayout);
                       // two such slots, one after the other, with the speculative Update
  // shared
  activations,       // one micro batch's activations (the caller's estimate; the model allocates them)
  ops_scratch,       // one block the model's ops allocate for themselves (the caller's estimate)
  checkpoint_slots,  // the activation checkpoints on the device (the caller's estimate; the model's)
  checkpoint_host,   // those in pinned host memory, cpu_checkpointing (the caller's; a pool of the model's)
  param_slot,        // a parameter window slot: one unit's compute copy
  work_slot,         // its fp32 working weights (16-bit runs)
  param_staging,     // a slot's pinned staging: NVMe reads, or the gathered shards
  grad_slot,         // a device gradient slot: one unit's fp32 gradient
  grad16_slot,       // its 16-bit rounding (the optimizer on the device, gradients partitioned)
  grad_landing,      // pinned landing buffers of the GradOut copies, one bucket each
  grad_out_staging,  // one bucket rounded on the device before it leaves
  param_upload,      // pinned slots of the Update's new compute copy, one sub-group each
  optimizer_swap,    // the swapper's pinned buffers, one sub-group's master | m | v each
  reduce_scratch,    // the fp32 of one landed bucket (host)
  comm_receive,      // every rank's part of a bucket, received for the cross-rank reduction
  speculation_backup,  // host memory: the old master | m | v of speculatively updated sub-groups, one each
  grad_ring,         // gradient streaming: pinned buffers of one unit's reduced gradient each
  token_staging,     // the training loop's pinned token and target staging, two slots (the caller's)
  token_slot,        // their device copies, two slots (the caller's)
};

// The rows of `zinf plan`, in its order: model states first, then buffers.
enum class PlanRow {
  param16,
  fp32_work,
  grad,
  grad16,
  grad32,
  master,
  adam_m,
  adam_v,  // states
  activations,
  activation_checkpoints,
  ops_scratch,
  param_window,
  param_staging,
  grad_window,
  grad_landing,
  grad_out_staging,
  param_upload,
  optimizer_swap,
  reduce_scratch,
  comm_receive,
  speculation_backup,
  grad_ring,
  token_batches,
};
constexpr int kPlanRows = static_cast<int>(PlanRow::token_batches) + 1;
constexpr bool is_state_row(PlanRow r) { return r <= PlanRow::adam_v; }

constexpr std::size_t kShared = static_cast<std::size_t>(-1);

struct BufferSpec {
  Buffer what = Buffer::param;
  Tier tier = Tier::device;
  std::uint64_t bytes = 0;     // each buffer, as the engine asks its tier for it
  std::uint64_t count = 1;     // equal buffers
  std::size_t unit = kShared;  // the unit it belongs to; kShared for shared buffers
  PlanRow row = PlanRow::param16;
  int rows = 1;  // the buffer holds rows `row`, `row`+1, … (master | m | v)
  std::array<std::uint64_t, 3> parts{};  // rows > 1: each buffer's bytes in each of its rows
};

// What a buffer of `bytes` takes on its tier: the pinned pool hands out 4 KiB blocks (at least one),
// an NVMe extent is padded to 4 KiB; host memory as asked; device memory as asked, or the allocator's
// block for it with `device_blocks` (the CUDA device, cuda_block_bytes).
std::uint64_t footprint(Tier t, std::uint64_t bytes, bool device_blocks = false);

// Every buffer of the layout, unit by unit in forward order, then the shared ones. The NVMe
// sub-group tensors of a unit come as one spec for its whole sub-groups and one for its last,
// shorter one (in that order); everything else is one spec per buffer kind and unit.
// `activation_bytes`: the caller's estimate (a spec of its own, allocated by no one here); so is each
// of `ops_scratch`'s blocks (one spec each, after the activations) and the activation checkpoints
// (Layout::checkpoint_device, checkpoint_pinned; between the two). The token batches (with
// PlanInput::batch_tokens) come last; the training loop allocates them, not the engine.
void for_each_buffer(const Layout& layout, std::uint64_t activation_bytes,
                     const std::function<void(const BufferSpec&)>& fn,
                     const std::vector<std::uint64_t>& ops_scratch = {});

// The list, with its layout and a per-unit index: what the engine allocates from.
class BufferSpecs {
 public:
  explicit BufferSpecs(const PlanInput& in);
  const Layout& layout() const { return layout_; }
  const std::vector<BufferSpec>& all() const { return specs_; }
  std::span<const BufferSpec> of_unit(std::size_t unit) const;
  // The spec of `what` for `unit` (kShared: a shared buffer); null when the engine has no such buffer.
  const BufferSpec* find(Buffer what, std::size_t unit = kShared) const;

 private:
  Layout layout_;
  std::vector<BufferSpec> specs_;
  std::vector<std::size_t> unit_begin_;  // specs_ index of each unit's first spec; the last: the shared ones
};

// The plan of a list: its specs summed into the plan's rows, as make_plan(PlanInput) sums them.
Plan make_plan(const BufferSpecs& specs);

}  // namespace zinf::offload
