// placement.cpp — the byte model behind `zinf plan` (zinf/offload/placement.h): the engine's buffer
// list (buffer_specs.h) summed into the plan's rows, and the verdict against a machine.
//
// The rows (docs/design.md, "States and tiers"), N = parameters, cb = bytes of the compute dtype:
//   param16  cb·N   device | pinned host (offload_param=cpu) | NVMe (offload_param=nvme)
//   grad16   cb·N   device when the optimizer is on the device; otherwise the host keeps every
//                   landed gradient until the global-norm barrier (GA = 1), or none at all (GA > 1:
//                   Reduce accumulates straight into grad32)
//   grad32   4·N    only with GA > 1, beside the optimizer (device or host)
//   master   4·N    with the optimizer (device | host | NVMe); aliased to param16 in fp32 on device
//   m, v     e·N    each, with the optimizer: e = 4 | 2 | 1 by zero_optimization.optimizer_states
//                   (fp32 | bf16 | 8bit, which adds an fp32 scale per 256 elements)
#include "zinf/offload/placement.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "zinf/offload/buffer_specs.h"

#include "zinf/error.h"

namespace zinf::offload {
Shard shard_of(std::uint64_t n, int world, int rank) {
  ZINF_CHECK(world >= 1 && rank >= 0 && rank < world);
  if (world == 1) return {0, n};
  const std::uint64_t w = static_cast<std::uint64_t>(world), r = static_cast<std::uint64_t>(rank);
  const std::uint64_t per = (n + w - 1) / w, step = (per + kShardAlign - 1) / kShardAlign * kShardAlign;
  return {std::min(n, r * step), std::min(n, (r + 1) * step)};
}

const char* tier_name(Tier t) {
  switch (t) {
    case Tier::device: return "device";
    case Tier::pinned: return "pinned";
    case Tier::host: return "host";
    case Tier::nvme: return "nvme";
  }
  return "?";
}

namespace {

// The plan's rows, in PlanRow order, with their names, dtypes and notes and no bytes yet.
struct RowSums {
  std::array<Row, kPlanRows> rows;
  std::array<bool, kPlanRows> used{};  // a spec counts toward it (buffers are listed even when empty)
};

RowSums empty_rows(const Layout& layout) {
  const bool master_is_param = !layout.mixed && !layout.optimizer_offloaded && !layout.param_offloaded;
  const std::string states = cpu_adam::state_format_name(layout.states);
  const std::string states_note = layout.states == cpu_adam::StateFormat::q8 ? "+ one fp32 scale per 256" : "";
  return {{{
      {"param16",
       layout.mixed ? "16-bit" : "fp32",
       {},
       layout.param_offloaded ? "persistent units on the device, the rest in their home" : ""},
      {"fp32 work", "fp32", {}, "CPU device: fp32 copy of the resident 16-bit weights"},
      {"grad",
       "fp32",
       {},
       !layout.optimizer_offloaded ? ""
       : layout.layer_major       ? "device: persistent units, 2 each (the tied head's: 1 per micro batch); host: the Update's input"
                                  : "device: persistent units; host: the Update's input"},
      {"grad16", "16-bit", {}, ""},
      {"grad32", "fp32", {}, "gradient accumulation buffer"},
      {"master", "fp32", {}, master_is_param ? "fp32 training: param16 is the master" : ""},
      {"adam.m", states, {}, states_note},
      {"adam.v", states, {}, states_note},
      {"activations",
       "",
       {},
       layout.layer_major ? "estimate for one micro batch, + every micro batch's residual gradient (x2)"
                          : "estimate for one micro batch"},
      {"activation ckpts",
       "",
       {},
       layout.layer_major ? "block inputs of all " + std::to_string(layout.grad_accum) +
                                " micro batches (layer_major) kept for the recompute; host: cpu_checkpointing"
                          : std::string("block inputs kept for the recompute; host: cpu_checkpointing")},
      {"ops scratch", "", {}, "the ops' own blocks: GEMM workspace, attention backward, partials"},
      {"param window", "", {}, std::to_string(layout.window_slots) + " slots x largest block"},
      {"param staging",
       "",
       {},
       layout.param == OffloadDevice::nvme ? "NVMe reads, one per slot" : "gathered shards, one per slot"},
      {"grad window",
       "",
       {},
       layout.optimizer_offloaded ? "2 slots x largest block" : "2 slots x largest block (+ its 16-bit rounding)"},
      {"grad landing", "", {}, "2 x reduce bucket"},
      {"grad out staging", "", {}, "one bucket, rounded on the device"},
      {"param upload", "", {}, "2 x sub-group: the Update's output"},
      {"optimizer swap", "", {}, "buffer_count x sub-group master|m|v (" + states + ")"},
      {"reduce scratch", "", {}, "fp32 of one bucket"},
      {"comm receive", "", {}, "ranks x this rank's part of a bucket"},
      {"speculation backup",
       "",
       {},
       std::to_string(layout.backup_subgroups) + " x sub-group master|m|v: the speculative Update's rollback"},
      {"grad ring",
       "",
       {},
       std::to_string(layout.stream_slots) +
           (layout.parallel ? " x the largest part of a unit's gradient this rank keeps"
                            : " x largest unit's gradient") +
           ": streamed to the Update (its NVMe copy: grad row)"},
      {"token batches",
       "",
       {},
       std::to_string(layout.layer_major ? std::max<std::int64_t>(2, layout.grad_accum) : 2) +
           " slots x tokens and targets (int32), pinned staging and device copies"},
  }}};
}

// One spec into its row(s): what it takes on its tier, split over the rows it holds by its parts.
// An empty estimate (no activations given) is no allocation, and takes no block.
void add_spec(RowSums& sums, const BufferSpec& b, bool device_blocks) {
  const bool none = b.bytes == 0 && (b.what == Buffer::activations || b.what == Buffer::ops_scratch);
  const std::uint64_t total = none ? 0 : footprint(b.tier, b.bytes, device_blocks) * b.count;
  if (b.rows == 1) {
    sums.rows[static_cast<std::size_t>(b.row)].bytes[static_cast<int>(b.tier)] += total;
    sums.used[static_cast<std::size_t>(b.row)] = true;
    return;
  }
  std::uint64_t parts = 0;  // the parts are padded on the tier already: they sum to its footprint
  for (int k = 0; k < b.rows; ++k) parts += b.parts[static_cast<std::size_t>(k)];
  ZINF_CHECK(b.rows <= 3 && parts * b.count == total);
  for (int k = 0; k < b.rows; ++k) {
    const auto r = static_cast<std::size_t>(static_cast<int>(b.row) + k);
    sums.rows[r].bytes[static_cast<int>(b.tier)] += b.parts[static_cast<std::size_t>(k)] * b.count;
    sums.used[r] = true;
  }
}

Plan finish_plan(const Layout& layout, RowSums sums) {
  Plan p;
  constexpr int kPinned = static_cast<int>(Tier::pinned), kHost = static_cast<int>(Tier::host);
  const auto row_of = [&](PlanRow r) -> Row& { return sums.rows[static_cast<std::size_t>(r)]; };
  // Everything pinned comes from the one pool, but for the token batches' staging and the host
  // activation checkpoints (pools of their own).
  for (const Row& r : sums.rows) p.pinned_pool += r.bytes[kPinned];
  p.pinned_pool -= row_of(PlanRow::token_batches).bytes[kPinned] + row_of(PlanRow::activation_checkpoints).bytes[kPinned];
  // pin_memory false: the same buffers, pageable, so host memory — but for the token batches' few
  // pages, which the trainer registers with the device whatever the setting.
  p.pinned = layout.pin_memory;
  if (!p.pinned)
    for (int r = 0; r < kPlanRows; ++r) {
      if (static_cast<PlanRow>(r) == PlanRow::token_batches) continue;
      TierBytes& b = sums.rows[static_cast<std::size_t>(r)].bytes;
      b[kHost] += b[kPinned];
      b[kPinned] = 0;
    }
  p.n_params = static_cast<std::int64_t>(layout.n_params);
  p.largest_unit = static_cast<std::int64_t>(layout.max_unit);
  p.largest_windowed = static_cast<std::int64_t>(layout.max_windowed);
  p.sub_group = static_cast<std::int64_t>(layout.sub_group);
  p.bucket = static_cast<std::int64_t>(layout.bucket);
  p.window_slots = layout.window_slots;
  for (int r = 0; r < kPlanRows; ++r) {
    const Row& row = sums.rows[static_cast<std::size_t>(r)];
    if (is_state_row(static_cast<PlanRow>(r))) {
      std::uint64_t any = 0;
      for (auto b : row.bytes) any += b;
      if (any) p.states.push_back(row);
    } else if (sums.used[static_cast<std::size_t>(r)]) {
      p.buffers.push_back(row);
    }
  }
  for (const auto& r : p.states)
    for (int t = 0; t < kTiers; ++t) p.model_states[t] += r.bytes[t];
  p.totals = p.model_states;
  for (const auto& r : p.buffers)
    for (int t = 0; t < kTiers; ++t) p.totals[t] += r.bytes[t];
  return p;
}

}  // namespace

Plan make_plan(const PlanInput& in) {
  const Layout layout = make_layout(in);
  RowSums sums = empty_rows(layout);
  for_each_buffer(
      layout, in.activation_bytes, [&](const BufferSpec& b) { add_spec(sums, b, layout.device_blocks); },
      in.ops_scratch);
  return finish_plan(layout, sums);
}

Plan make_plan(const BufferSpecs& specs) {
  RowSums sums = empty_rows(specs.layout());
  for (const BufferSpec& b : specs.all()) add_spec(sums, b, specs.layout().device_blocks);
  return finish_plan(specs.layout(), sums);
}

Verdict judge(const Plan& plan, const Capacity& cap) {
  Verdict v;
  auto check = [&](const char* name, std::uint64_t need, std::uint64_t have, bool known) {
    if (!known || need == 0) return;
    double f = have ? static_cast<double>(need) / static_cast<double>(have) : INFINITY;
    if (f > v.limiting_fraction || v.limiting.empty()) {
      v.limiting_fraction = f;
      v.limiting = name;
    }
    if (need > have) {
      v.fits = false;
      v.problems.push_back(std::string(name) + ": needs " + std::to_string(need) + " B, has " + std::to_string(have) +
                           " B");
    }
  };
  const auto& t = plan.totals;
  check("device", t[0], cap.device, true);
  check("pinned", t[1], cap.pinnable, true);
  check("host", t[1] + t[2], cap.host, true);
  check("nvme", t[3], cap.nvme, cap.nvme_known || t[3] > 0);
  return v;
}

DeepSpeedEstimate deepspeed_zero3_estimate(std::int64_t total_params, std::int64_t largest_layer_params,
                                           bool offload_optimizer, bool offload_param, bool zero_init, double f) {
  // One node, one GPU per node: gpus_factor = 1, total_gpus = 1, num_gpus_per_node = 1.
  const double n = static_cast<double>(total_params);
  const double largest_layer_memory = 4.0 * static_cast<double>(largest_layer_params);
  double cpu = 0, gpu = 0;
  if (offload_optimizer) {
    if (offload_param) {
      gpu = largest_layer_memory;
      cpu = n * (zero_init ? 18.0 : std::max(4.0, 18.0)) * f;
    } else {
      gpu = largest_layer_memory + std::floor(2.0 * n);
      cpu = n * (zero_init ? 16.0 : std::max(4.0, 16.0)) * f;
    }
  } else {
    gpu = largest_layer_memory + std::floor(18.0 * n);
    cpu = zero_init ? static_cast<double>(largest_layer_params) * 4.0 * f : n * 4.0 * f;
  }
  return {static_cast<std::uint64_t>(cpu), static_cast<std::uint64_t>(gpu)};
}

}  // namespace zinf::offload
