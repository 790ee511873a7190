// buffer_specs.cpp — the layout and the buffer list of the offload engine (zinf/offload/buffer_specs.h).
//
// N = a unit's parameters, cb = bytes of the compute dtype, S/G/P = this rank's ranges of the
// optimizer states, the reduced gradient and the compute copy's home (docs/design.md, "States and
// tiers"):
//   param    cb·P   device (resident units: the whole unit) | pinned host (offload_param=cpu) |
//                   NVMe (offload_param=nvme) | device (a stage-3 shard without offload_param)
//   work     4·N    16-bit runs: fp32 working weights of a resident unit
//   grad     4·N    the model's gradient on the device, for units whose gradient has no slot
//   grad16   2·N    16-bit runs with the optimizer on the device: the Update's input
//   grad_sum 4·G    the fp32 sum of micro batches (and ranks), beside the optimizer on the device
//   host_grad       the optimizer off the device: 4·G (an fp32 sum, or fp32 training), else 2·G,
//                   kept until the global-norm barrier
//   master   4·S    with the optimizer; aliased to the compute copy in fp32 on the device
//   m, v     e·S    each, with the optimizer, e = 4 | 2 | 1 bytes by the state format (fp32 | bf16 |
//                   q8, which adds one fp32 scale per 256 elements); NVMe: master|m|v (|scales) in
//                   one padded tensor per sub-group (SubGroupLayout)
#include "zinf/offload/buffer_specs.h"

#include <algorithm>

#include "subgroup_layout.h"
#include "zinf/device_memory.h"
#include "zinf/error.h"

namespace zinf::offload {
namespace {

constexpr std::uint64_t kChunkAlign = 4096;  // elements: sub-group and bucket boundaries (16 KiB of fp32)
constexpr std::uint64_t kBlock = 4096;       // bytes: a pinned block, an NVMe extent's padding
constexpr std::uint64_t kTwo = 2;            // gradient slots, landing buffers and upload slots: two, alternating
// Elements of one piece of the host staging: with one rank the reduce bucket only paces GradOut, and
// with the optimizer in host memory the sub-group only paces the Update and its Upload, so neither
// needs the largest unit's size; 4M elements (8 MiB of 16-bit values) keep each copy long enough to
// run at the link's rate and the staging a few MiB whatever the model.
constexpr std::uint64_t kStagingPiece = std::uint64_t{1} << 22;

std::uint64_t round_up(std::uint64_t x, std::uint64_t a) { return (x + a - 1) / a * a; }

void check_input(const PlanInput& in) {
  ZINF_CHECK(!in.unit_params.empty());
  ZINF_CHECK(in.persistent.empty() || in.persistent.size() == in.unit_params.size());
  ZINF_CHECK(in.world >= 1 && in.rank >= 0 && in.rank < in.world && in.stage >= 0 && in.stage <= 3);
}

// Which units stay resident, which visit a window, and the ranges this rank keeps of each.
void lay_out_units(const PlanInput& in, Layout& layout) {
  std::uint64_t comm_part = 0;  // this rank's largest part of a reduce bucket
  for (std::size_t i = 0; i < in.unit_params.size(); ++i) {
    UnitLayout u;
    u.n = static_cast<std::uint64_t>(in.unit_params[i]);
    u.persistent = !in.persistent.empty() && in.persistent[i];
    u.kept = u.persistent || (layout.shard_params && in.unit_params[i] <= in.persistence_threshold);
    u.windowed = layout.windows && !u.kept;
    // Off the device (or partitioned), a block's gradient only passes through a gradient slot.
    u.grad_windowed = (layout.optimizer_offloaded || layout.shard_grads) && !u.persistent;
    const Shard mine = shard_of(u.n, layout.world, layout.rank), whole{0, u.n};
    u.state_range = layout.shard_states ? mine : whole;
    u.grad_range = layout.shard_grads ? mine : whole;
    u.param_range = layout.shard_params && u.windowed ? mine : whole;
    layout.n_params += u.n;
    layout.max_unit = std::max(layout.max_unit, u.n);
    if (u.windowed) layout.max_windowed = std::max(layout.max_windowed, u.n);
    if (!u.persistent) layout.max_grad_windowed = std::max(layout.max_grad_windowed, u.n);
    layout.units.push_back(u);
  }
  layout.bucket =
      std::min(round_up(static_cast<std::uint64_t>(std::max<std::int64_t>(in.reduce_bucket_size, 1)), kChunkAlign),
               round_up(layout.max_unit, kChunkAlign));
  layout.sub_group =
      std::min(round_up(static_cast<std::uint64_t>(std::max<std::int64_t>(in.sub_group_size, 1)), kChunkAlign),
               round_up(layout.max_unit, kChunkAlign));
  if (!layout.parallel) layout.bucket = std::min(layout.bucket, kStagingPiece);
  if (layout.optimizer == OffloadDevice::cpu) layout.sub_group = std::min(layout.sub_group, kStagingPiece);
  for (const auto& u : layout.units)  // the receive scratch: every rank's contribution to this rank's part of a bucket
    comm_part = std::max(comm_part, std::min(layout.bucket, shard_of(u.n, layout.world, layout.rank).len()));
  layout.comm_scratch = static_cast<std::uint64_t>(layout.world) * comm_part;
}

BufferSpec spec(Buffer what, Tier tier, std::uint64_t bytes, PlanRow row, std::size_t unit = kShared,
                std::uint64_t count = 1) {
  return BufferSpec{.what = what, .tier = tier, .bytes = bytes, .count = count, .unit = unit, .row = row};
}

// Unit i's compute copy and gradient buffers.
void unit_param_and_grads(const Layout& layout, std::size_t i, const std::function<void(const BufferSpec&)>& fn) {
  const UnitLayout& u = layout.units[i];
  const std::uint64_t cb = layout.compute_bytes;
  const Tier home = !u.windowed                           ? Tier::device
                    : layout.param == OffloadDevice::cpu  ? Tier::pinned
                    : layout.param == OffloadDevice::nvme ? Tier::nvme
                                                          : Tier::device;  // a stage-3 shard on the device
  fn(spec(Buffer::param, home, u.param_range.len() * cb, PlanRow::param16, i));
  if (layout.fp32_work && !u.windowed) fn(spec(Buffer::work, Tier::device, u.n * 4, PlanRow::fp32_work, i));
  if (!u.grad_windowed) {
    // Layer-major: the unit the tied head shares has every micro batch's gradient open at once; the
    // other units with buffers of their own take two, so that a micro batch's backward need not wait
    // for the previous one's GradOut and Reduce (the micro-batch order has a whole pass between them).
    const std::uint64_t count = !layout.layer_major                       ? 1
                                : static_cast<int>(i) == layout.head_unit ? static_cast<std::uint64_t>(layout.grad_accum)
                                                                          : kTwo;
    fn(spec(Buffer::grad, Tier::device, u.n * 4, PlanRow::grad, i, count));
  }
  const std::uint64_t kept = u.grad_range.len();
  if (!layout.optimizer_offloaded) {
    if (!u.grad_windowed && layout.mixed) fn(spec(Buffer::grad16, Tier::device, u.n * 2, PlanRow::grad16, i));
    if (layout.fp32_sum) fn(spec(Buffer::grad_sum, Tier::device, kept * 4, PlanRow::grad32, i));
  } else if (layout.streaming) {  // the Update's input on NVMe; in host memory only in the ring (staging)
    fn(spec(Buffer::nvme_grad, Tier::nvme, kept * layout.stream_grad_bytes,
            layout.stream_grad_bytes == 4 ? PlanRow::grad32 : PlanRow::grad16, i));
    if (layout.device_accum) {
      if (!u.grad_windowed && layout.mixed) fn(spec(Buffer::grad16, Tier::device, u.n * 2, PlanRow::grad16, i));
      fn(spec(Buffer::grad_sum, Tier::device, kept * 4, PlanRow::grad32, i));
    }
  } else if (layout.fp32_sum || !layout.mixed) {
    if (layout.device_accum) {  // the micro batches' sum on the device (rounded to 16 bits first, as GradOut does)
      if (!u.grad_windowed && layout.mixed) fn(spec(Buffer::grad16, Tier::device, u.n * 2, PlanRow::grad16, i));
      fn(spec(Buffer::grad_sum, Tier::device, kept * 4, PlanRow::grad32, i));
    }
    fn(spec(Buffer::host_grad, Tier::host, kept * 4, PlanRow::grad32, i));
  } else {
    fn(spec(Buffer::host_grad, Tier::host, kept * 2, PlanRow::grad16, i));
  }
}

// Unit i's optimizer states.
void unit_states(const Layout& layout, std::size_t i, const std::function<void(const BufferSpec&)>& fn) {
  const std::uint64_t n = layout.units[i].state_range.len();
  if (layout.optimizer == OffloadDevice::nvme) {  // one tensor per sub-group: master|m|v(|scales), padded
    const std::uint64_t whole = n / layout.sub_group, last = n % layout.sub_group;
    const std::uint64_t slots = layout.speculative ? 2 : 1;  // the speculative Update writes the other slot
    auto subgroups = [&](std::uint64_t len, std::uint64_t count) {
      const detail::SubGroupLayout l(len, layout.states);
      BufferSpec b = spec(Buffer::optimizer_subgroup, Tier::nvme, slots * l.bytes(), PlanRow::master, i, count);
      b.rows = 3;
      b.parts = {slots * l.master_bytes, slots * l.m_part(), slots * l.m_part()};
      fn(b);
    };
    if (whole) subgroups(layout.sub_group, whole);
    if (last) subgroups(last, 1);
    return;
  }
  const Tier t = layout.optimizer == OffloadDevice::cpu ? Tier::host : Tier::device;
  // fp32 with whole resident parameters on the device: the compute copy is the master (no second copy).
  if (layout.optimizer_offloaded || layout.mixed || layout.param_offloaded || layout.shard_params)
    fn(spec(Buffer::master, t, n * 4, PlanRow::master, i));
  const std::uint64_t state = detail::StateArray::bytes(n, layout.states);
  fn(spec(Buffer::adam_m, t, state, PlanRow::adam_m, i));
  fn(spec(Buffer::adam_v, t, state, PlanRow::adam_v, i));
}

// The parameter window and the gradient slots.
void windows_and_slots(const Layout& layout, const std::function<void(const BufferSpec&)>& fn) {
  const std::uint64_t cb = layout.compute_bytes, slots = static_cast<std::uint64_t>(layout.window_slots);
  if (layout.windows) {
    fn(spec(Buffer::param_slot, Tier::device, layout.max_windowed * cb, PlanRow::param_window, kShared, slots));
    if (layout.fp32_work)
      fn(spec(Buffer::work_slot, Tier::device, layout.max_windowed * 4, PlanRow::param_window, kShared, slots));
    if (layout.param == OffloadDevice::nvme || (layout.shard_params && layout.param_offloaded))
      fn(spec(Buffer::param_staging, Tier::pinned, layout.max_windowed * cb, PlanRow::param_staging, kShared, slots));
  }
  if ((layout.optimizer_offloaded || layout.shard_grads) && layout.max_grad_windowed > 0) {
    fn(spec(Buffer::grad_slot, Tier::device, layout.max_grad_windowed * 4, PlanRow::grad_window, kShared, kTwo));
    if ((!layout.optimizer_offloaded || layout.device_accum) && layout.mixed)
      fn(spec(Buffer::grad16_slot, Tier::device, layout.max_grad_windowed * 2, PlanRow::grad_window, kShared, kTwo));
  }
}

// The staging of the gradient path and the update pipeline.
void staging(const Layout& layout, const std::function<void(const BufferSpec&)>& fn) {
  const std::uint64_t cb = layout.compute_bytes;
  if (layout.optimizer_offloaded) {  // GradOut: 16-bit gradients, or with device_accum the fp32 sum
    const std::uint64_t out_bytes = layout.device_accum ? 4 : cb;
    fn(spec(Buffer::grad_landing, Tier::pinned, layout.bucket * out_bytes, PlanRow::grad_landing, kShared, kTwo));
    if (!layout.device_accum)
      fn(spec(Buffer::grad_out_staging, Tier::device, layout.bucket * cb, PlanRow::grad_out_staging));
  }
  if (layout.optimizer_offloaded || layout.param == OffloadDevice::nvme)
    fn(spec(Buffer::param_upload, Tier::pinned, layout.sub_group * cb, PlanRow::param_upload, kShared, kTwo));
  if (layout.optimizer == OffloadDevice::nvme)
    fn(spec(Buffer::optimizer_swap, Tier::pinned, detail::SubGroupLayout::bytes_for(layout.sub_group, layout.states),
            PlanRow::optimizer_swap, kShared, static_cast<std::uint64_t>(layout.optimizer_buffers)));
  if (layout.fp32_sum && layout.optimizer_offloaded && layout.parallel)  // one rank sums straight into host_grad
    fn(spec(Buffer::reduce_scratch, Tier::host, layout.bucket * 4, PlanRow::reduce_scratch));
  if (layout.backup_subgroups)
    fn(spec(Buffer::speculation_backup, Tier::host, detail::SubGroupLayout::bytes_for(layout.sub_group, layout.states),
            PlanRow::speculation_backup, kShared, layout.backup_subgroups));
  if (layout.streaming) {  // one unit's gradient each (the largest unit's this rank keeps)
    std::uint64_t kept = 0;
    for (const auto& u : layout.units) kept = std::max(kept, u.grad_range.len());
    fn(spec(Buffer::grad_ring, Tier::pinned, kept * layout.stream_grad_bytes, PlanRow::grad_ring, kShared,
            layout.stream_slots));
  }
  if (layout.parallel)
    fn(spec(Buffer::comm_receive, layout.optimizer_offloaded ? Tier::host : Tier::device, layout.comm_scratch * 4,
            PlanRow::comm_receive));
  if (layout.batch_tokens) {  // tokens and targets (int32) of two slots (GA with layer_major): two arrays each
    const std::uint64_t slots = layout.layer_major ? std::max<std::uint64_t>(kTwo, static_cast<std::uint64_t>(layout.grad_accum)) : kTwo;
    const std::uint64_t bytes = layout.batch_tokens * 4, arrays = 2 * slots;
    fn(spec(Buffer::token_staging, Tier::pinned, bytes, PlanRow::token_batches, kShared, arrays));
    fn(spec(Buffer::token_slot, Tier::device, bytes, PlanRow::token_batches, kShared, arrays));
  }
}

}  // namespace

Layout make_layout(const PlanInput& in) {
  check_input(in);
  Layout layout;
  layout.pin_memory = in.pin_memory;
  layout.pool_tier = in.pin_memory ? Tier::pinned : Tier::host;
  layout.precision = in.precision;
  layout.mixed = in.compute_bytes() == 2;
  layout.compute_bytes = static_cast<std::uint64_t>(in.compute_bytes());
  layout.fp32_work = layout.mixed && in.fp32_work;
  layout.device_blocks = in.device_blocks;
  layout.optimizer = in.optimizer;
  layout.states = in.optimizer_states;
  layout.param = in.param;
  layout.optimizer_offloaded = in.optimizer != OffloadDevice::none;
  layout.param_offloaded = in.param != OffloadDevice::none;
  layout.exact = in.overlap == Overlap::exact;
  layout.optimizer_buffers = layout.exact ? in.optimizer_buffer_count : 1;
  layout.grad_accum = in.grad_accum;
  layout.prefetch_depth = in.prefetch_depth;
  layout.world = in.world;
  layout.rank = in.rank;
  layout.stage = in.stage;
  layout.parallel = in.world > 1;
  layout.shard_states = layout.parallel && in.stage >= 1;
  layout.shard_grads = layout.parallel && in.stage >= 2;
  layout.shard_params = layout.parallel && in.stage >= 3;
  layout.fp32_sum = in.grad_accum > 1 || layout.parallel;
  layout.device_accum = in.device_grad_accum && layout.optimizer_offloaded && !layout.parallel && in.grad_accum > 1;
  layout.layer_major = in.layer_major && layout.optimizer_offloaded && in.grad_accum > 1 && !layout.device_accum;
  layout.head_unit = layout.layer_major ? in.head_unit : -1;
  layout.windows = layout.param_offloaded || layout.shard_params;
  layout.window_slots = layout.windows ? std::max(2, 1 + in.prefetch_depth) : 0;
  layout.batch_tokens = in.batch_tokens;
  layout.checkpoint_device = in.checkpoint_device;
  layout.checkpoint_pinned = in.checkpoint_pinned;
  lay_out_units(in, layout);
  // The head's unit keeps buffers of its own (persistent), not the shared gradient slots.
  ZINF_CHECK(layout.head_unit < 0 ||
             (static_cast<std::size_t>(layout.head_unit) < layout.units.size() && layout.units[static_cast<std::size_t>(layout.head_unit)].persistent));
  // Streaming hands each unit's gradient straight to the speculative Update when there is one (the
  // config reader turns it on with streaming unless told not to); without it, the Update reads every
  // gradient back from NVMe.
  layout.streaming = in.gradient_streaming;
  layout.speculative = in.speculative && layout.exact && layout.optimizer_offloaded;
  if (layout.streaming) {
    // Two slots: the Reduce fills one while the speculation still reads the other. Without
    // speculation a slot is free again once its NVMe write is done, before the (serial) Reduce worker
    // takes the next unit: one is enough.
    layout.stream_slots = layout.speculative ? 2 : 1;
    layout.stream_grad_bytes = layout.fp32_sum || !layout.mixed ? 4 : 2;
  }
  if (layout.speculative && layout.optimizer == OffloadDevice::cpu) {
    std::uint64_t all = 0;  // the sub-groups this rank keeps
    for (const auto& u : layout.units) all += (u.state_range.len() + layout.sub_group - 1) / layout.sub_group;
    const std::uint64_t want = in.speculative_backup > 0
                                   ? (static_cast<std::uint64_t>(in.speculative_backup) + layout.sub_group - 1) /
                                         layout.sub_group
                                   : (all + 1) / 2;
    layout.backup_subgroups = std::min(all, want);
  }
  return layout;
}

std::uint64_t footprint(Tier t, std::uint64_t bytes, bool device_blocks) {
  switch (t) {
    case Tier::pinned: return std::max(kBlock, round_up(bytes, kBlock));
    case Tier::nvme: return round_up(bytes, kBlock);
    case Tier::device: return device_blocks ? cuda_block_bytes(bytes) : bytes;
    case Tier::host: return bytes;
  }
  return bytes;
}

void for_each_buffer(const Layout& layout, std::uint64_t activation_bytes,
                     const std::function<void(const BufferSpec&)>& fn, const std::vector<std::uint64_t>& ops_scratch) {
  for (std::size_t i = 0; i < layout.units.size(); ++i) {
    unit_param_and_grads(layout, i, fn);
    unit_states(layout, i, fn);
  }
  fn(spec(Buffer::activations, Tier::device, activation_bytes, PlanRow::activations));
  if (layout.checkpoint_device)
    fn(spec(Buffer::checkpoint_slots, Tier::device, layout.checkpoint_device, PlanRow::activation_checkpoints));
  if (layout.checkpoint_pinned)
    fn(spec(Buffer::checkpoint_host, Tier::pinned, layout.checkpoint_pinned, PlanRow::activation_checkpoints));
  for (std::uint64_t b : ops_scratch) fn(spec(Buffer::ops_scratch, Tier::device, b, PlanRow::ops_scratch));
  windows_and_slots(layout, fn);
  staging(layout, fn);
}

BufferSpecs::BufferSpecs(const PlanInput& in) : layout_(make_layout(in)) {
  unit_begin_.assign(layout_.units.size() + 1, 0);
  for_each_buffer(
      layout_, in.activation_bytes,
      [&](const BufferSpec& b) {
        specs_.push_back(b);
        if (b.unit != kShared) unit_begin_[b.unit + 1] = specs_.size();
      },
      in.ops_scratch);
  for (std::size_t i = 1; i < unit_begin_.size(); ++i) unit_begin_[i] = std::max(unit_begin_[i], unit_begin_[i - 1]);
}

std::span<const BufferSpec> BufferSpecs::of_unit(std::size_t unit) const {
  ZINF_CHECK(unit + 1 < unit_begin_.size());
  return std::span<const BufferSpec>(specs_).subspan(unit_begin_[unit], unit_begin_[unit + 1] - unit_begin_[unit]);
}

const BufferSpec* BufferSpecs::find(Buffer what, std::size_t unit) const {
  std::span<const BufferSpec> range =
      unit == kShared ? std::span<const BufferSpec>(specs_).subspan(unit_begin_.back()) : of_unit(unit);
  for (const BufferSpec& b : range)
    if (b.what == what) return &b;
  return nullptr;
}

}  // namespace zinf::offload
