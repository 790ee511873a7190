// placement.cpp — the byte model behind `zinf plan` (zinf/offload/placement.h).
//
// N = parameters, L = the largest layer unit, cb = bytes of the compute dtype.
// States (shared/DESIGN.md §1):
//   param16  cb·N   device | pinned host (offload_param=cpu) | NVMe (offload_param=nvme)
//   grad16   cb·N   device when the optimizer is on the device; otherwise the host keeps every
//                   landed gradient until the global-norm barrier (GA = 1), or none at all (GA > 1:
//                   Reduce accumulates straight into grad32)
//   grad32   4·N    only with GA > 1, beside the optimizer (device or host)
//   master   4·N    with the optimizer (device | host | NVMe); aliased to param16 in fp32 on device
//   m, v     4·N    each, with the optimizer
#include "zinf/offload/placement.h"

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

Tier home_of(OffloadDevice d) {
  switch (d) {
    case OffloadDevice::none: return Tier::device;
    case OffloadDevice::cpu: return Tier::host;
    case OffloadDevice::nvme: return Tier::nvme;
  }
  return Tier::device;
}

const char* dtype_name(int cb) { return cb == 4 ? "fp32" : "16-bit"; }

}  // namespace

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
  Plan p;
  for (auto u : in.unit_params) {
    p.n_params += u;
    p.largest_unit = std::max(p.largest_unit, u);
  }
  const std::uint64_t N = static_cast<std::uint64_t>(p.n_params);
  const std::uint64_t L = static_cast<std::uint64_t>(p.largest_unit);
  const std::uint64_t cb = static_cast<std::uint64_t>(in.compute_bytes);
  const bool opt_off = in.optimizer != OffloadDevice::none;
  const bool param_off = in.param != OffloadDevice::none;
  const bool ga = in.grad_accum > 1;
  const Tier opt_tier = home_of(in.optimizer);

  // ---- states ----
  Tier param_tier = in.param == OffloadDevice::cpu ? Tier::pinned : home_of(in.param);
  p.states.push_back({"param16", dtype_name(in.compute_bytes), on(param_tier, cb * N),
                      param_off ? "the device holds a window of layer units" : ""});
  if (!opt_off)
    p.states.push_back({"grad16", dtype_name(in.compute_bytes), on(Tier::device, cb * N), ""});
  else if (!ga)
    p.states.push_back({"grad16", dtype_name(in.compute_bytes), on(Tier::host, cb * N),
                        "landed gradients, held until the global-norm barrier"});
  else
    p.states.push_back({"grad16", dtype_name(in.compute_bytes), {}, "accumulated straight into grad32"});
  if (ga)
    p.states.push_back({"grad32", "fp32", on(opt_tier == Tier::nvme ? Tier::host : opt_tier, 4 * N),
                        "gradient accumulation buffer"});
  const bool master_aliased = !opt_off && in.compute_bytes == 4;
  p.states.push_back({"master", "fp32", master_aliased ? TierBytes{} : on(opt_tier, 4 * N),
                      master_aliased ? "fp32 training: param16 is the master" : ""});
  p.states.push_back({"adam.m", "fp32", on(opt_tier, 4 * N), ""});
  p.states.push_back({"adam.v", "fp32", on(opt_tier, 4 * N), ""});

  // ---- buffers ----
  p.buffers.push_back({"activations", "", on(Tier::device, in.activation_bytes),
                       "estimate for one micro batch"});
  const std::int64_t units = static_cast<std::int64_t>(in.unit_params.size());
  if (param_off) {
    std::int64_t depth = in.prefetch_bucket_size / std::max<std::int64_t>(1, p.largest_unit);
    depth = std::clamp<std::int64_t>(depth, 1, std::max<std::int64_t>(1, units - 1));
    p.prefetch_depth = static_cast<int>(depth);
    p.buffers.push_back({"param window", "", on(Tier::device, static_cast<std::uint64_t>(1 + depth) * L * cb),
                         "computing unit + " + std::to_string(depth) + " prefetched"});
  }
  if (opt_off) {
    p.buffers.push_back({"grad window", "", on(Tier::device, 2 * L * cb),
                         "unit being computed + one draining on d2h"});
    const std::uint64_t bucket = std::min<std::uint64_t>(static_cast<std::uint64_t>(in.reduce_bucket_size), N);
    p.buffers.push_back({"grad landing", "", on(Tier::pinned, 2 * bucket * cb), "2 x reduce_bucket_size"});
    if (!param_off) {
      const std::uint64_t sg = std::min<std::uint64_t>(static_cast<std::uint64_t>(in.sub_group_size), N);
      p.buffers.push_back({"param upload", "", on(Tier::pinned, 2 * sg * cb), "2 x sub_group_size, fused Update output"});
    }
  }
  if (in.optimizer == OffloadDevice::nvme) {
    const std::uint64_t sg = std::min<std::uint64_t>(static_cast<std::uint64_t>(in.sub_group_size), N);
    p.buffers.push_back({"optimizer swap", "", on(Tier::pinned, static_cast<std::uint64_t>(in.optimizer_buffer_count) * sg * 4),
                         "buffer_count x sub_group_size x 4 B"});
  }
  if (in.param == OffloadDevice::nvme) {
    if (p.largest_unit > in.param_buffer_size)
      throw ConfigError("zero_optimization.offload_param.buffer_size: " + std::to_string(in.param_buffer_size) +
                        " elements is smaller than the largest layer unit (" + std::to_string(p.largest_unit) +
                        " elements); raise it to at least that");
    p.buffers.push_back({"param swap", "", on(Tier::pinned, static_cast<std::uint64_t>(in.param_buffer_count) * L * cb),
                         "offload_param.buffer_count x largest unit"});
  }

  for (const auto& r : p.states)
    for (int t = 0; t < kTiers; ++t) p.model_states[t] += r.bytes[t];
  p.totals = p.model_states;
  for (const auto& r : p.buffers) {
    for (int t = 0; t < kTiers; ++t) p.totals[t] += r.bytes[t];
    p.pinned_pool += r.bytes[static_cast<int>(Tier::pinned)];
  }
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
