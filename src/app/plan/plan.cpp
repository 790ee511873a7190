// plan.cpp — `zinf plan` arithmetic joined to the machine (plan.h).
#include "app/plan/plan.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <limits>

#include "zinf/error.h"
#include "zinf/nvme/probe.h"
#include "app/config/engine_config.h"
#include "zinf/offload/engine.h"

namespace zinf {

std::uint64_t estimate_activation_bytes(const ModelShape& s, std::int64_t micro_batch, int compute_bytes,
                                        bool checkpointing) {
  const double B = static_cast<double>(micro_batch), T = s.seq_len, C = s.d_model, H = s.n_head,
               V = s.vocab_size;
  const double scale = compute_bytes / 2.0;
  const double per_block = T * B * C * (34.0 + 5.0 * H * T / C) * scale;
  const double logits = B * T * V * (compute_bytes + 4.0);
  const double embed = B * T * C * compute_bytes;
  double total;
  if (checkpointing)
    total = s.n_layer * (T * B * C * compute_bytes) + per_block + logits + embed;
  else
    total = s.n_layer * per_block + logits + embed;
  return static_cast<std::uint64_t>(total);
}

namespace {
// The model section that describes `s` (the inverse of model_shape()).
void set_model(ModelConfig& m, const ModelShape& s) {
  m.n_layer = s.n_layer, m.n_head = s.n_head, m.d_model = s.d_model, m.vocab_size = s.vocab_size, m.seq_len = s.seq_len;
  m.family = s.family, m.n_kv_head = s.n_kv_head, m.d_ff = s.d_ff, m.tie_embeddings = s.tie_embeddings, m.qkv_bias = s.qkv_bias;
  m.rope_theta = s.rope_theta, m.norm_eps = s.norm_eps, m.rope_factor = s.rope_factor, m.rope_low_freq_factor = s.rope_low_freq_factor;
  m.rope_high_freq_factor = s.rope_high_freq_factor, m.rope_original_max = s.rope_original_max, m.max_positions = s.max_positions;
}
}  // namespace

offload::PlanInput make_plan_input(const Config& c, const ModelShape& shape) {
  Config sized = c;
  set_model(sized.model, shape);
  offload::PlanInput in = offload::Engine::plan_input(engine_config(sized, 1));
  in.world = c.world_size;  // rank 0: the largest shards
  in.rank = 0;
  in.stage = c.zero.stage;
  in.activation_bytes =
      estimate_activation_bytes(shape, c.micro_batch_size, in.compute_bytes, c.model.activation_checkpointing);
  return in;
}

offload::Capacity machine_capacity(const Config& c, const MachineInfo& m) {
  offload::Capacity cap;
  const bool use_gpu = c.device.type != DeviceType::cpu && !m.gpus.empty();
  std::uint64_t host = m.mem_available;
  if (c.device.memory_budget > 0)
    cap.device = c.device.memory_budget;
  else if (use_gpu)
    cap.device = m.gpus[0].free_bytes;
  else
    cap.device = host / 2;  // the CPU device's default budget
  if (!use_gpu) host = host > cap.device ? host - cap.device : 0;  // CPU device memory is host memory
  cap.host = host;
  // Root (CAP_IPC_LOCK) may lock beyond RLIMIT_MEMLOCK; everyone else is bound by the soft limit.
  cap.pinnable = ::geteuid() == 0 ? host : std::min(host, m.memlock_soft);
  return cap;
}

std::uint64_t zero_paper_bytes(std::int64_t params, int stage, int world) {
  const double p = static_cast<double>(params), nd = static_cast<double>(world), k = 12;
  const double b = stage == 0 ? (2 + 2 + k) * p : stage == 1 ? 4 * p + k * p / nd : stage == 2 ? 2 * p + (2 + k) * p / nd : (2 + 2 + k) * p / nd;
  return static_cast<std::uint64_t>(b);
}

RunPlan plan_run(const Config& c, const MachineInfo& m) {
  RunPlan r;
  r.shape = model_shape(c.model);
  r.world = c.world_size;
  offload::PlanInput in = make_plan_input(c, r.shape);
  for (int st = 0; st <= 3; ++st) {
    StagePlan sp;
    sp.stage = st;
    sp.valid = !(in.optimizer != OffloadDevice::none && st == 0) && !(in.param != OffloadDevice::none && st < 3);
    offload::PlanInput si = in;
    si.stage = st;
    const offload::Plan sp_plan = offload::make_plan(si);
    sp.model_states = sp_plan.model_states;
    sp.totals = sp_plan.totals;
    sp.zero_paper = zero_paper_bytes(sp_plan.n_params, st, c.world_size);
    r.stages.push_back(sp);
  }
  r.plan = offload::make_plan(in);
  r.capacity = machine_capacity(c, m);
  r.activations_plain = estimate_activation_bytes(r.shape, c.micro_batch_size, in.compute_bytes, false);
  r.activations_checkpointed = estimate_activation_bytes(r.shape, c.micro_batch_size, in.compute_bytes, true);

  // NVMe capacity: the free space under the configured swap path(s), probed.
  std::string nvme_path = c.zero.offload_optimizer.device == OffloadDevice::nvme ? c.zero.offload_optimizer.nvme_path
                          : c.zero.offload_param.device == OffloadDevice::nvme  ? c.zero.offload_param.nvme_path
                                                                                 : "";
  std::string probe_dir = nvme_path.empty() ? "." : nvme_path;
  if (!nvme_path.empty() && !std::filesystem::exists(probe_dir)) {
    // zinf train creates nvme_path (as DeepSpeed does): measure where it will be created.
    std::filesystem::path p = std::filesystem::absolute(probe_dir);
    while (p.has_parent_path() && p != p.parent_path() && !std::filesystem::exists(p)) p = p.parent_path();
    probe_dir = p.string();
    r.notes.push_back("nvme_path " + nvme_path + " does not exist yet: zinf train creates it (free space measured at " +
                      probe_dir + ")");
  }
  nvme::PathProbe probe = nvme::probe_path(probe_dir);
  if (probe.exists) {
    r.capacity.nvme = probe.free_bytes;
    r.capacity.nvme_known = true;
  }
  if (nvme_path.empty() && probe.exists)
    r.notes.push_back("largest-model NVMe rows assume the free space of the current directory (" +
                      format_bytes(probe.free_bytes) + ")");
  for (const auto& b : r.plan.buffers) {
    const std::uint64_t pinned = b.bytes[static_cast<int>(offload::Tier::pinned)];
    if (b.name == "optimizer swap" && pinned > r.capacity.host / 4) {
      const std::int64_t sg = static_cast<std::int64_t>(r.capacity.host / 4 / 4 /
                                                        static_cast<std::uint64_t>(c.zero.offload_optimizer.buffer_count));
      r.notes.push_back("the optimizer swap buffers take " + format_bytes(pinned) +
                        " pinned (buffer_count x sub_group_size x 4 B); zero_optimization.sub_group_size <= " +
                        std::to_string(sg) + " keeps them under a quarter of host memory");
    }
  }
  r.verdict = offload::judge(r.plan, r.capacity);
  if (!nvme_path.empty() && !probe.writable) {
    r.verdict.fits = false;
    r.verdict.limiting = "nvme";
    r.verdict.problems.insert(r.verdict.problems.begin(), "nvme: " + probe_dir + " is not a directory this user can write to");
  }
  r.deepspeed = offload::deepspeed_zero3_estimate(
      r.plan.n_params, r.plan.largest_unit, c.zero.offload_optimizer.device != OffloadDevice::none,
      c.zero.offload_param.device != OffloadDevice::none, /*zero_init=*/true);

  // Largest model of the same width that fits under each offload setting: search over n_layer.
  struct Setting {
    OffloadDevice opt, param;
  };
  const Setting settings[] = {{OffloadDevice::none, OffloadDevice::none},
                              {OffloadDevice::cpu, OffloadDevice::none},
                              {OffloadDevice::cpu, OffloadDevice::cpu},
                              {OffloadDevice::nvme, OffloadDevice::cpu},
                              {OffloadDevice::nvme, OffloadDevice::nvme}};
  offload::Capacity cap = r.capacity;
  if (!cap.nvme_known) cap.nvme = 0;
  for (const auto& s : settings) {
    LargestFit f;
    f.optimizer = s.opt;
    f.param = s.param;
    f.setting = "optimizer=" + std::string(to_string(s.opt)) + " param=" + std::string(to_string(s.param));
    auto fits = [&](int layers) {
      ModelShape sh = r.shape;
      sh.n_layer = layers;
      offload::PlanInput pi = make_plan_input(c, sh);
      pi.optimizer = s.opt;
      pi.param = s.param;
      try {
        offload::Capacity cc = cap;
        cc.nvme_known = true;
        return offload::judge(offload::make_plan(pi), cc).fits;
      } catch (const Error&) {
        return false;
      }
    };
    int lo = 0, hi = 1;
    while (hi <= (1 << 20) && fits(hi)) lo = hi, hi *= 2;
    while (hi - lo > 1) {
      int mid = lo + (hi - lo) / 2;
      (fits(mid) ? lo : hi) = mid;
    }
    f.n_layer = lo;
    if (lo > 0) {
      ModelShape sh = r.shape;
      sh.n_layer = lo;
      f.params = count_params(sh);
    }
    // The largest real model (a llama-family preset, at this run's sequence length) that fits.
    std::int64_t best = 0;
    for (const auto& p : model_presets()) {
      if (p.shape.family != ModelFamily::llama || count_params(p.shape) <= best) continue;
      ModelShape sh = p.shape;
      sh.seq_len = r.shape.seq_len;
      offload::PlanInput pi = make_plan_input(c, sh);
      pi.optimizer = s.opt;
      pi.param = s.param;
      offload::Capacity cc = cap;
      cc.nvme_known = true;
      if (offload::judge(offload::make_plan(pi), cc).fits) {
        best = count_params(p.shape);
        f.largest_preset = p.name;
      }
    }
    r.largest.push_back(f);
  }
  return r;
}

}  // namespace zinf
