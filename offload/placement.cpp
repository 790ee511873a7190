// placement.cpp — the byte model behind `zinf plan` (zinf/offload/placement.h).
//
// N = parameters, L = the largest layer unit, cb = bytes of the compute dtype.
// States (docs/design.md, "States and tiers"):
//   param16  cb·N   device | pinned host (offload_param=cpu) | NVMe (offload_param=nvme)
//   grad16   cb·N   device when the optimizer is on the device; otherwise the host keeps every
//                   landed gradient until the global-norm barrier (GA = 1), or none at all (GA > 1:
//                   Reduce accumulates straight into grad32)
//   grad32   4·N    only with GA > 1, beside the optimizer (device or host)
//   master   4·N    with the optimizer (device | host | NVMe); aliased to param16 in fp32 on device
//   m, v     4·N    each, with the optimizer
#include "zinf/offload/placement.h"

#include "subgroup_layout.h"

#include <algorithm>
#include <cmath>

#include "zinf/error.h"

namespace zinf::offload {
namespace {

TierBytes on(Tier t, std::uint64_t bytes) {
  TierBytes b{};
  b[static_cast<int>(t)] = bytes;
  return b;
}

}  // namespace

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

Plan make_plan(const PlanInput& in) {
  ZINF_CHECK(!in.unit_params.empty());
  ZINF_CHECK(in.compute_bytes == 2 || in.compute_bytes == 4);
  ZINF_CHECK(in.persistent.empty() || in.persistent.size() == in.unit_params.size());
  Plan p;
  const bool mixed = in.compute_bytes == 2;
  const std::uint64_t cb = static_cast<std::uint64_t>(in.compute_bytes);
  const bool opt_off = in.optimizer != OffloadDevice::none;
  const bool param_off = in.param != OffloadDevice::none;
  const bool ga = in.grad_accum > 1;
  const bool work = mixed && in.fp32_work;
  ZINF_CHECK(in.world >= 1 && in.rank >= 0 && in.rank < in.world && in.stage >= 0 && in.stage <= 3);
  const bool parallel = in.world > 1;
  const bool shard_states = parallel && in.stage >= 1, shard_grads = parallel && in.stage >= 2, shard_params = parallel && in.stage >= 3;
  const bool fp32_sum = ga || parallel;  // the Update reads an fp32 sum of micro batches (and ranks)
  auto persistent = [&](std::size_t u) { return !in.persistent.empty() && in.persistent[u]; };
  auto kept = [&](std::size_t u) { return persistent(u) || (shard_params && in.unit_params[u] <= in.persistence_threshold); };
  auto windowed = [&](std::size_t u) { return (param_off || shard_params) && !kept(u); };
  std::uint64_t max_unit = 0, max_win = 0, max_np = 0;  // largest unit, windowed unit, non-persistent unit
  for (std::size_t u = 0; u < in.unit_params.size(); ++u) {
    const std::uint64_t n = static_cast<std::uint64_t>(in.unit_params[u]);
    p.n_params += in.unit_params[u];
    max_unit = std::max(max_unit, n);
    if (windowed(u)) max_win = std::max(max_win, n);
    if (!persistent(u)) max_np = std::max(max_np, n);
  }
  p.largest_unit = static_cast<std::int64_t>(max_unit);
  p.largest_windowed = static_cast<std::int64_t>(max_win);
  auto up = [](std::uint64_t x, std::uint64_t a) { return (x + a - 1) / a * a; };
  const std::uint64_t bucket = std::min(up(std::max<std::int64_t>(in.reduce_bucket_size, 1), 4096), up(max_unit, 4096));
  const std::uint64_t sg = std::min(up(std::max<std::int64_t>(in.sub_group_size, 1), 4096), up(max_unit, 4096));
  p.bucket = static_cast<std::int64_t>(bucket);
  p.sub_group = static_cast<std::int64_t>(sg);
  p.window_slots = (param_off || shard_params) ? std::max(2, 1 + in.prefetch_depth) : 0;

  // ---- states, unit by unit ----
  Row param{"param16", mixed ? "16-bit" : "fp32", {}, param_off ? "persistent units on the device, the rest in their home" : ""};
  Row workr{"fp32 work", "fp32", {}, "CPU device: fp32 copy of the resident 16-bit weights"};
  Row grad{"grad", "fp32", {}, opt_off ? "device: persistent units; host: the Update's input" : ""};
  Row grad16{"grad16", "16-bit", {}, ""};
  Row grad32{"grad32", "fp32", {}, "gradient accumulation buffer"};
  Row master{"master", "fp32", {}, ""};
  Row mrow{"adam.m", "fp32", {}, ""}, vrow{"adam.v", "fp32", {}, ""};
  const int D = static_cast<int>(Tier::device), P = static_cast<int>(Tier::pinned), H = static_cast<int>(Tier::host),
            N = static_cast<int>(Tier::nvme);
  std::uint64_t comm_part = 0;  // this rank's largest part of a reduce bucket
  for (std::size_t u = 0; u < in.unit_params.size(); ++u) {
    const std::uint64_t n = static_cast<std::uint64_t>(in.unit_params[u]);
    const bool win = windowed(u);
    const std::uint64_t mine = shard_of(n, in.world, in.rank).len();
    const std::uint64_t sl = shard_states ? mine : n, gl = shard_grads ? mine : n, pl = shard_params && win ? mine : n;
    comm_part = std::max(comm_part, std::min(bucket, mine));
    if (!win) {
      param.bytes[D] += n * cb;
      if (work) workr.bytes[D] += n * 4;
    } else if (in.param == OffloadDevice::cpu) {
      param.bytes[P] += std::max<std::uint64_t>(4096, up(pl * cb, 4096));
    } else if (in.param == OffloadDevice::nvme) {
      param.bytes[N] += up(pl * cb, 4096);
    } else {
      param.bytes[D] += pl * cb;  // a stage-3 shard on the device
    }
    if (!opt_off) {
      if (!shard_grads || persistent(u)) {  // partitioned: blocks pass through the gradient slots
        grad.bytes[D] += n * 4;
        if (mixed) grad16.bytes[D] += n * 2;
      }
      if (fp32_sum) grad32.bytes[D] += gl * 4;
      if (mixed || param_off || shard_params) master.bytes[D] += sl * 4;
      mrow.bytes[D] += sl * 4;
      vrow.bytes[D] += sl * 4;
    } else {
      if (persistent(u)) grad.bytes[D] += n * 4;  // other units' gradients pass through the grad window
      if (fp32_sum || !mixed) grad32.bytes[H] += gl * 4; else grad16.bytes[H] += gl * 2;
      if (in.optimizer == OffloadDevice::cpu) {
        master.bytes[H] += sl * 4;
        mrow.bytes[H] += sl * 4;
        vrow.bytes[H] += sl * 4;
      } else {
        for (std::uint64_t o = 0; o < sl; o += sg) {  // one tensor per sub-group: master|m|v, padded
          const std::uint64_t pad = detail::SubGroupLayout(std::min(sg, sl - o)).padded;
          master.bytes[N] += 4 * pad;
          mrow.bytes[N] += 4 * pad;
          vrow.bytes[N] += 4 * pad;
        }
      }
    }
  }
  if (!mixed && !opt_off && !param_off) master.note = "fp32 training: param16 is the master";
  for (Row* r : {&param, &workr, &grad, &grad16, &grad32, &master, &mrow, &vrow}) {
    std::uint64_t any = 0;
    for (auto b : r->bytes) any += b;
    if (any) p.states.push_back(*r);
  }

  // ---- buffers ----
  p.buffers.push_back({"activations", "", on(Tier::device, in.activation_bytes), "estimate for one micro batch"});
  if (param_off || shard_params) {
    const std::uint64_t slots = static_cast<std::uint64_t>(p.window_slots);
    p.buffers.push_back({"param window", "", on(Tier::device, slots * max_win * (cb + (work ? 4 : 0))),
                         std::to_string(slots) + " slots x largest block"});
    if (in.param == OffloadDevice::nvme || (shard_params && param_off))
      p.buffers.push_back({"param staging", "", on(Tier::pinned, slots * std::max<std::uint64_t>(4096, up(max_win * cb, 4096))),
                           in.param == OffloadDevice::nvme ? "NVMe reads, one per slot" : "gathered shards, one per slot"});
  }
  if (!opt_off && shard_grads && max_np > 0)
    p.buffers.push_back({"grad window", "", on(Tier::device, 2 * max_np * (4 + (mixed ? 2 : 0))), "2 slots x largest block (+ its 16-bit rounding)"});
  if (opt_off) {
    if (max_np > 0) p.buffers.push_back({"grad window", "", on(Tier::device, 2 * max_np * 4), "2 slots x largest block"});
    p.buffers.push_back({"grad landing", "", on(Tier::pinned, 2 * bucket * cb), "2 x reduce bucket"});
    p.buffers.push_back({"grad out staging", "", on(Tier::device, bucket * cb), "one bucket, rounded on the device"});
  }
  if (opt_off || in.param == OffloadDevice::nvme)
    p.buffers.push_back({"param upload", "", on(Tier::pinned, 2 * up(sg * cb, 4096)), "2 x sub-group: the Update's output"});
  if (in.optimizer == OffloadDevice::nvme)
    p.buffers.push_back({"optimizer swap", "", on(Tier::pinned, static_cast<std::uint64_t>(in.optimizer_buffer_count) * detail::SubGroupLayout::bytes_for(sg)),
                         "buffer_count x sub-group master|m|v"});
  if (fp32_sum && opt_off) p.buffers.push_back({"reduce scratch", "", on(Tier::host, bucket * 4), "fp32 of one bucket"});
  if (parallel)
    p.buffers.push_back({"comm receive", "", on(opt_off ? Tier::host : Tier::device, static_cast<std::uint64_t>(in.world) * comm_part * 4),
                         "ranks x this rank's part of a bucket"});

  for (const auto& r : p.states)
    for (int t = 0; t < kTiers; ++t) p.model_states[t] += r.bytes[t];
  p.totals = p.model_states;
  for (const auto& r : p.buffers)
    for (int t = 0; t < kTiers; ++t) p.totals[t] += r.bytes[t];
  p.pinned_pool = p.totals[P];  // everything pinned comes from the one pool
  (void)H;
  return p;
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
      v.problems.push_back(std::string(name) + ": needs " + std::to_string(need) + " B, has " + std::to_string(have) + " B");
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
                                           bool offload_optimizer, bool offload_param, bool zero_init,
                                           double f) {
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
