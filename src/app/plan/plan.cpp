// plan.cpp — `zinf plan` arithmetic joined to the machine (plan.h).
#include "app/plan/plan.h"

#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <limits>

#include "app/config/device_choice.h"
#include "app/config/engine_config.h"
#include "io/data.h"
#include "zinf/gradient_streaming.h"
#include "model/lm.h"
#include "zinf/backends/backend.h"
#include "zinf/device_memory.h"
#include "zinf/error.h"
#include "zinf/nvme/probe.h"
#include "zinf/nvme/store.h"
#include "zinf/offload/engine.h"
#include "zinf/backends/sysinfo.h"

namespace zinf {

std::uint64_t estimate_activation_bytes(const ModelShape& s, std::int64_t micro_batch, int compute_bytes,
                                        bool checkpointing, Kernels kernels, DeviceType device) {
  const double B = static_cast<double>(micro_batch), T = s.seq_len, C = s.d_model, H = s.n_head, V = s.vocab_size;
  const double Vs = logits_row_stride(s.vocab_size, logits_rows_of(device, kernels));  // the logits' row stride
  // The bytes of one stored activation: the run's precision under the fast kernels; the reference
  // kernels store every activation in fp32, whatever the run's precision.
  const double act = kernels == Kernels::fast ? compute_bytes : 4.0;
  double per_block, logits;
  if (kernels == Kernels::fast) {  // storage dtype S; fp32 statistics, attention state and losses
    per_block = T * B * C * 17.0 * act + 4.0 * (4.0 * B * T + B * H * T);
    logits = B * T * Vs * 2.0 * act + 4.0 * B * T;
  } else {
    per_block = T * B * C * (34.0 + 5.0 * H * T / C) * (act / 2.0);
    logits = B * T * V * (act + 4.0);
  }
  const double embed = B * T * C * act;
  double total;
  if (checkpointing)
    total = s.n_layer * (T * B * C * act) + per_block + logits + embed;
  else
    total = s.n_layer * per_block + logits + embed;
  return static_cast<std::uint64_t>(total);
}

CheckpointBytes estimate_checkpoint_bytes(const ModelShape& s, std::int64_t micro_batch, int compute_bytes,
                                          bool checkpointing, bool cpu_checkpointing, Kernels kernels) {
  if (!checkpointing) return {};
  const std::uint64_t act = kernels == Kernels::fast ? static_cast<std::uint64_t>(compute_bytes) : 4;
  const std::uint64_t row = static_cast<std::uint64_t>(micro_batch) * static_cast<std::uint64_t>(s.seq_len) *
                            static_cast<std::uint64_t>(s.d_model) * act;
  const std::size_t n = static_cast<std::size_t>(s.n_layer) + 1;  // the embedding output and every block's
  return {Checkpoints::device_rows(n, cpu_checkpointing) * row, Checkpoints::host_rows(n, cpu_checkpointing) * row};
}

std::vector<std::uint64_t> estimate_ops_scratch(const Config& c, const ModelShape& shape) {
  if (run_device_type(c) != DeviceType::cuda) return {};  // the CPU device's ops keep their scratch in host memory
  OpsScratchShape s;
  s.llama = shape.family == ModelFamily::llama;
  s.batch = static_cast<std::uint64_t>(c.micro_batch_size);
  s.seq = static_cast<std::uint64_t>(shape.seq_len);
  s.heads = static_cast<std::uint64_t>(shape.n_head);
  s.width = static_cast<std::uint64_t>(shape.d_model);
  s.fast = c.device.kernels == Kernels::fast;
  s.kv_heads = static_cast<std::uint64_t>(shape.kv_heads());
  s.cudnn = s.fast && c.precision() != Precision::fp32 &&
            resolve_attention(c.device.attention, c.device.kernels, backends::cudnn_built()) == Attention::cudnn;
  return ops_scratch_blocks(s);
}

offload::PlanInput make_plan_input(const Config& c, const ModelShape& shape) {
  offload::PlanInput in = plan_input(c, shape, c.world_size, 0);  // rank 0: the largest shards
  in.activation_bytes = estimate_activation_bytes(shape, c.micro_batch_size, in.compute_bytes(),
                                                  c.model.activation_checkpointing, c.device.kernels, c.device.type);
  const CheckpointBytes ckpt =
      estimate_checkpoint_bytes(shape, c.micro_batch_size, in.compute_bytes(), c.model.activation_checkpointing,
                                c.model.cpu_checkpointing, c.device.kernels);
  in.activation_bytes -= std::min(in.activation_bytes, ckpt.device + ckpt.host);  // their own row
  // The layer-major order keeps every micro batch's checkpoints (a row of each checkpoint per micro
  // batch) and, twice, every micro batch's residual gradient.
  const std::int64_t G = c.zero.offload_optimizer.layer_major ? c.gradient_accumulation_steps : 1;
  const CheckpointBytes kept =
      G > 1 ? estimate_checkpoint_bytes(shape, c.micro_batch_size * G, in.compute_bytes(),
                                        c.model.activation_checkpointing, c.model.cpu_checkpointing, c.device.kernels)
            : ckpt;
  if (G > 1)
    in.activation_bytes += 2 * static_cast<std::uint64_t>(G) * static_cast<std::uint64_t>(c.micro_batch_size) *
                           static_cast<std::uint64_t>(shape.seq_len) * static_cast<std::uint64_t>(shape.d_model) *
                           (c.device.kernels == Kernels::fast ? static_cast<std::uint64_t>(in.compute_bytes()) : 4);
  in.checkpoint_device = kept.device;
  in.checkpoint_pinned = kept.host;
  in.ops_scratch = estimate_ops_scratch(c, shape);
  in.batch_tokens = static_cast<std::uint64_t>(c.micro_batch_size) * static_cast<std::uint64_t>(shape.seq_len);
  return in;
}

offload::Capacity machine_capacity(const Config& c, const MachineInfo& m) {
  offload::Capacity cap;
  const bool cuda = resolve_device_type(c.device.type, m.gpus).type == DeviceType::cuda;
  const GpuInfo* gpu = own_gpu_info(m);  // the GPU the CUDA device would drive: its free memory is known
  std::uint64_t host = m.mem_available;
  if (c.device.memory_budget > 0)
    cap.device = c.device.memory_budget;
  else if (cuda)  // as the CUDA device takes it; nothing when this process has no GPU or its free memory is unknown
    cap.device = gpu && gpu->free_known ? cuda_auto_budget(gpu->free_bytes, gpu->total_bytes) : 0;
  else
    cap.device = host / 2;                                      // the CPU device's default budget
  if (!cuda) host = host > cap.device ? host - cap.device : 0;  // CPU device memory is host memory
  cap.host = host;
  // Root (CAP_IPC_LOCK) may lock beyond RLIMIT_MEMLOCK; everyone else is bound by the soft limit.
  cap.pinnable = ::geteuid() == 0 ? host : std::min(host, m.memlock_soft);
  return cap;
}

std::uint64_t zero_paper_bytes(std::int64_t params, int stage, int world) {
  const double p = static_cast<double>(params), nd = static_cast<double>(world), k = 12;
  const double b = stage == 0   ? (2 + 2 + k) * p
                   : stage == 1 ? 4 * p + k * p / nd
                   : stage == 2 ? 2 * p + (2 + k) * p / nd
                                : (2 + 2 + k) * p / nd;
  return static_cast<std::uint64_t>(b);
}

PerParam per_param(const offload::Plan& p, cpu_adam::StateFormat states) {
  PerParam r;
  r.states = states;
  const double n = p.n_params > 0 ? static_cast<double>(p.n_params) : 1.0;
  for (int t = 0; t < offload::kTiers; ++t) r.tier[static_cast<std::size_t>(t)] = static_cast<double>(p.totals[t]) / n;
  r.host_pinned =
      r.tier[static_cast<std::size_t>(offload::Tier::host)] + r.tier[static_cast<std::size_t>(offload::Tier::pinned)];
  return r;
}

offload::Plan plan_with_states(offload::PlanInput in, cpu_adam::StateFormat states) {
  in.optimizer_states = states;
  return offload::make_plan(in);
}

HostFootprint host_footprint(const Config& c, const offload::Plan& p, const ModelShape& s) {
  HostFootprint f;
  f.host = p.totals[static_cast<int>(offload::Tier::host)];
  f.pinned = p.totals[static_cast<int>(offload::Tier::pinned)];
  const bool cpu_device = run_device_type(c) != DeviceType::cuda;
  if (cpu_device) f.device = p.totals[static_cast<int>(offload::Tier::device)];
  // One unit's fp32 master at a time: placing it at start-up, the parameter digest at the end; with
  // checkpoints its master, m and v (saved and resumed unit by unit).
  const bool checkpoints = !c.train.checkpoint_dir.empty();
  const auto unit = static_cast<std::uint64_t>(p.largest_unit);
  f.transient = (checkpoints ? 12 : 4) * unit;
  f.transient_note = checkpoints ? "master, m and v of the largest unit (checkpoints, resume)"
                                 : "fp32 master of the largest unit (start-up, digest)";
  if (cpu_device) {
    // The CPU ops copy a GEMM's weight operand into panels for each call: the LM head's (vocab x d_model,
    // with the backward's copy of the activations beside it), or the widest weight matrix; the weight
    // gradient packs the activations (rows x width).
    const auto C = static_cast<std::uint64_t>(s.d_model), V = static_cast<std::uint64_t>(s.vocab_size);
    const auto F = static_cast<std::uint64_t>(s.family == ModelFamily::llama ? s.d_ff : 4 * s.d_model);
    const std::uint64_t rows = static_cast<std::uint64_t>(c.micro_batch_size) * static_cast<std::uint64_t>(s.seq_len);
    const std::uint64_t ops = 4 * std::max({(V + 7) / 8 * 8 * C + rows * C, (F + 7) / 8 * 8 * C, F * rows});
    if (ops > f.transient) {
      f.transient = ops;
      f.transient_note = "the CPU ops' packed copy of the LM head's weights";
    }
  }
  f.data = data_memory_bytes(c.data);
  const std::uint64_t loaded = startup_resident_bytes();
  f.runtime = (loaded ? loaded : kLoadedBytes) + kRuntimeExtraBytes;
  return f;
}

namespace {

// This run's placement at each ZeRO stage, per rank.
std::vector<StagePlan> stage_plans(const Config& c, const offload::PlanInput& in) {
  std::vector<StagePlan> stages;
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
    stages.push_back(sp);
  }
  return stages;
}

// Where the NVMe capacity was measured: the configured swap path ("" when nothing swaps to NVMe),
// the folder probed, and what the probe found.
struct NvmeProbe {
  std::string nvme_path, probe_dir;
  nvme::PathProbe probe;
};

// NVMe capacity: the free space under the configured swap path(s), probed, into r.capacity.
NvmeProbe probe_nvme_capacity(const Config& c, RunPlan& r) {
  NvmeProbe n;
  n.nvme_path = c.zero.offload_optimizer.device == OffloadDevice::nvme ? c.zero.offload_optimizer.nvme_path
                : c.zero.offload_param.device == OffloadDevice::nvme   ? c.zero.offload_param.nvme_path
                                                                       : "";
  n.probe_dir = n.nvme_path.empty() ? "." : n.nvme_path;
  if (!n.nvme_path.empty() && !std::filesystem::exists(n.probe_dir)) {
    // zinf train creates nvme_path (as DeepSpeed does): measure where it will be created.
    std::filesystem::path p = std::filesystem::absolute(n.probe_dir);
    while (p.has_parent_path() && p != p.parent_path() && !std::filesystem::exists(p)) p = p.parent_path();
    n.probe_dir = p.string();
    r.notes.push_back("nvme_path " + n.nvme_path +
                      " does not exist yet: zinf train creates it (free space measured at " + n.probe_dir + ")");
  }
  n.probe = nvme::probe_path(n.probe_dir);
  if (n.probe.exists) {
    r.capacity.nvme = n.probe.free_bytes;
    r.capacity.nvme_known = true;
  }
  if (n.nvme_path.empty() && n.probe.exists)
    r.notes.push_back("largest-model NVMe rows assume the free space of the current directory (" +
                      format_bytes(n.probe.free_bytes) + ")");
  return n;
}

// A note when the optimizer's pinned swap buffers take more than a quarter of host memory.
void note_large_swap_buffers(const Config& c, RunPlan& r) {
  for (const auto& b : r.plan.buffers) {
    const std::uint64_t pinned = b.bytes[static_cast<int>(offload::Tier::pinned)];
    if (b.name == "optimizer swap" && pinned > r.capacity.host / 4) {
      const std::int64_t sg = static_cast<std::int64_t>(
          r.capacity.host / 4 / 4 / static_cast<std::uint64_t>(c.zero.offload_optimizer.buffer_count));
      r.notes.push_back("the optimizer swap buffers take " + format_bytes(pinned) +
                        " pinned (buffer_count x sub_group_size x 4 B); zero_optimization.sub_group_size <= " +
                        std::to_string(sg) + " keeps them under a quarter of host memory");
    }
  }
}

struct OffloadSetting {
  OffloadDevice optimizer, param;
  bool streaming = false;  // LargestFit::streaming
};

// The config as it would run under `setting`: the offload devices; the optimizer's zinf options kept
// where they apply (off with the optimizer on the device); streaming on or off as the setting says.
Config under(const Config& c, OffloadSetting setting) {
  Config x = c;
  auto& oo = x.zero.offload_optimizer;
  oo.device = setting.optimizer;
  x.zero.offload_param.device = setting.param;
  const bool off = setting.optimizer != OffloadDevice::none;
  oo.gradient_streaming = setting.streaming;
  if (setting.streaming) {  // the variant that takes the least NVMe: no speculation's second state slots
    const bool ga = x.gradient_accumulation_steps > 1;
    oo.speculative = false;
    oo.layer_major = ga && x.model.activation_checkpointing;
    oo.device_grad_accumulation = ga && !oo.layer_major;
  } else {
    oo.speculative = oo.speculative && off;
    oo.layer_major = oo.layer_major && off;
    oo.device_grad_accumulation = oo.device_grad_accumulation && off;
  }
  return x;
}

// Whether a model of `shape` fits `capacity` (its NVMe space taken as known) with this offload setting.
bool fits_under(const Config& c, const ModelShape& shape, OffloadSetting setting, offload::Capacity capacity) {
  const Config x = under(c, setting);
  const auto& oo = x.zero.offload_optimizer;
  if (oo.gradient_streaming &&
      !gradient_streaming_refusal(oo.device, !x.train.overlap_none, x.world_size, x.gradient_accumulation_steps,
                                  oo.device_grad_accumulation, oo.layer_major)
           .empty())
    return false;  // streaming cannot serve this run at all
  offload::PlanInput in = make_plan_input(x, shape);
  capacity.nvme_known = true;
  return offload::judge(offload::make_plan(in), capacity).fits;
}

// The largest model of this width (a search over n_layer), and the largest real model (a llama-family
// preset, at this run's sequence length), that fit under `setting`.
LargestFit largest_fit(const Config& c, const ModelShape& shape, OffloadSetting setting,
                       const offload::Capacity& capacity) {
  LargestFit f;
  f.optimizer = setting.optimizer;
  f.param = setting.param;
  f.streaming = setting.streaming;
  f.setting = "optimizer=" + std::string(to_string(setting.optimizer)) +
              " param=" + std::string(to_string(setting.param)) + (setting.streaming ? " streaming" : "");
  auto fits = [&](int layers) {
    ModelShape sh = shape;
    sh.n_layer = layers;
    try {
      return fits_under(c, sh, setting, capacity);
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
    ModelShape sh = shape;
    sh.n_layer = lo;
    f.params = count_params(sh);
  }
  std::int64_t best = 0;
  for (const auto& p : model_presets()) {
    if (p.shape.family != ModelFamily::llama || count_params(p.shape) <= best) continue;
    ModelShape sh = p.shape;
    sh.seq_len = shape.seq_len;
    if (fits_under(c, sh, setting, capacity)) {
      best = count_params(p.shape);
      f.largest_preset = p.name;
    }
  }
  return f;
}

}  // namespace

std::vector<LargestFit> largest_fits(const Config& c, const ModelShape& shape, const offload::Capacity& capacity) {
  const OffloadSetting settings[] = {{OffloadDevice::none, OffloadDevice::none},
                                     {OffloadDevice::cpu, OffloadDevice::none},
                                     {OffloadDevice::cpu, OffloadDevice::cpu},
                                     {OffloadDevice::nvme, OffloadDevice::cpu},
                                     {OffloadDevice::nvme, OffloadDevice::nvme},
                                     {OffloadDevice::nvme, OffloadDevice::nvme, /*streaming=*/true}};
  std::vector<LargestFit> out;
  for (const auto& setting : settings) out.push_back(largest_fit(c, shape, setting, capacity));
  return out;
}

RunPlan plan_run(const Config& config, const MachineInfo& m) {
  Config c = config;
  resolve_device(c, m.gpus);  // as `zinf train` resolves it, from the GPUs of the same query
  RunPlan r;
  r.device = {c.device.type, c.device.type_reason};
  if (c.device.type == DeviceType::cuda && c.device.memory_budget == 0) {
    const GpuInfo* gpu = own_gpu_info(m);
    if (!gpu)
      r.notes.push_back("device.type cuda: this process has no GPU (" + m.gpu_status +
                        "): the device's capacity is 0; set device.memory_budget to plan for a GPU");
    else if (!gpu->free_known)
      r.notes.push_back("device.type cuda: the free memory of GPU " + std::to_string(gpu->index) +
                        " could not be read: the device's capacity is 0; set device.memory_budget");
  }
  r.shape = model_shape(c.model);
  r.world = c.world_size;
  offload::PlanInput in = make_plan_input(c, r.shape);
  r.stages = stage_plans(c, in);
  r.plan = offload::make_plan(in);
  r.capacity = machine_capacity(c, m);
  r.activations_plain =
      estimate_activation_bytes(r.shape, c.micro_batch_size, in.compute_bytes(), false, c.device.kernels, c.device.type);
  r.activations_checkpointed =
      estimate_activation_bytes(r.shape, c.micro_batch_size, in.compute_bytes(), true, c.device.kernels, c.device.type);
  r.activations_cpu_checkpointed =
      r.activations_checkpointed -
      estimate_checkpoint_bytes(r.shape, c.micro_batch_size, in.compute_bytes(), true, true, c.device.kernels).host;
  const NvmeProbe swap_probe = probe_nvme_capacity(c, r);
  note_large_swap_buffers(c, r);
  r.verdict = offload::judge(r.plan, r.capacity);
  if (!swap_probe.nvme_path.empty() && !swap_probe.probe.writable) {
    r.verdict.fits = false;
    r.verdict.limiting = "nvme";
    r.verdict.problems.insert(r.verdict.problems.begin(),
                              "nvme: " + swap_probe.probe_dir + " is not a directory this user can write to");
  }
  r.deepspeed = offload::deepspeed_zero3_estimate(
      r.plan.n_params, r.plan.largest_unit, c.zero.offload_optimizer.device != OffloadDevice::none,
      c.zero.offload_param.device != OffloadDevice::none, /*zero_init=*/true);

  offload::Capacity capacity = r.capacity;
  if (!capacity.nvme_known) capacity.nvme = 0;
  r.largest = largest_fits(c, r.shape, capacity);
  r.per_param = per_param(r.plan, c.zero.optimizer_states);
  if (!c.zero.optimizer_states_given)
    for (const auto f : kStateFormats) r.per_states.push_back(per_param(plan_with_states(in, f), f));
  r.footprint = host_footprint(c, r.plan, r.shape);
  return r;
}

}  // namespace zinf

namespace zinf {

std::vector<NvmeSpace> nvme_space(const Config& c, const offload::Plan& p) {
  const bool opt = c.zero.offload_optimizer.device == OffloadDevice::nvme;
  const bool par = c.zero.offload_param.device == OffloadDevice::nvme;
  if (!opt && !par) return {};
  // param16 is the parameters' store; every other NVMe byte (master, m, v — two slots each with the
  // speculative Update — and the streamed gradient) is the optimizer's.
  constexpr int kNvme = static_cast<int>(offload::Tier::nvme);
  std::uint64_t param_bytes = 0;
  for (const auto& r : p.states)
    if (r.name == "param16") param_bytes += r.bytes[kNvme];
  if (!par) param_bytes = 0;
  const std::uint64_t optimizer_bytes = p.totals[kNvme] - param_bytes;
  struct Need {
    std::string key, path;
    std::uint64_t bytes;
  };
  std::vector<Need> needs;
  if (opt)
    needs.push_back(
        {"zero_optimization.offload_optimizer.nvme_path", c.zero.offload_optimizer.nvme_path, optimizer_bytes});
  if (par) needs.push_back({"zero_optimization.offload_param.nvme_path", c.zero.offload_param.nvme_path, param_bytes});
  std::vector<NvmeSpace> spaces;
  std::vector<dev_t> devices;
  std::vector<std::string> parents;  // the folders whose stale swap folders were counted
  for (const auto& n : needs) {
    // Where the path is, or will be created (zinf train creates a missing nvme_path).
    std::error_code ec;
    std::filesystem::path at = std::filesystem::absolute(n.path.empty() ? "." : n.path, ec);
    if (ec) continue;
    while (at.has_parent_path() && at != at.parent_path() && !std::filesystem::exists(at, ec)) at = at.parent_path();
    struct stat st {};
    struct statvfs vfs {};
    // Not writable here, or no filesystem of blocks (/proc reports none): the folder's own check says
    // why more usefully than a free space of 0.
    if (::access(at.c_str(), W_OK) != 0 || ::stat(at.c_str(), &st) != 0 || ::statvfs(at.c_str(), &vfs) != 0 ||
        vfs.f_blocks == 0)
      continue;
    const auto same = std::find(devices.begin(), devices.end(), st.st_dev);
    NvmeSpace* s = nullptr;
    if (same == devices.end()) {
      devices.push_back(st.st_dev);
      spaces.emplace_back();
      s = &spaces.back();
      s->probed = at.string();
      s->free = static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize;
      s->missing = !std::filesystem::exists(n.path, ec);
    } else {
      s = &spaces[static_cast<std::size_t>(same - devices.begin())];
    }
    s->keys.push_back(n.key);
    s->paths.push_back(n.path);
    s->needed += n.bytes;
    // The stores remove the leftovers under nvme_path itself (once a folder, however many stores).
    if (std::find(parents.begin(), parents.end(), n.path) == parents.end() &&
        std::filesystem::is_directory(n.path, ec)) {
      parents.push_back(n.path);
      s->reclaimable += nvme::stale_swap_bytes(n.path);
    }
  }
  return spaces;
}

std::string nvme_space_problem(const std::vector<NvmeSpace>& spaces) {
  auto gib = [](std::uint64_t b) {
    char t[32];
    std::snprintf(t, sizeof t, "%.2f GiB", static_cast<double>(b) / static_cast<double>(std::uint64_t{1} << 30));
    return std::string(t);
  };
  for (const auto& s : spaces) {
    if (s.needed <= s.free + s.reclaimable) continue;
    std::string where;
    for (std::size_t i = 0; i < s.keys.size(); ++i)
      where += (i ? " and " : "") + s.keys[i] + " " + s.paths[i];
    std::string line = where + ": the NVMe stores need " + gib(s.needed) + " there, " + gib(s.free) + " is free";
    if (s.reclaimable) line += " (+ " + gib(s.reclaimable) + " in swap folders of runs that are gone)";
    if (s.keys.size() > 1) line += ", one filesystem";
    if (s.missing) line += " (measured at " + s.probed + ", where it will be created)";
    return line;
  }
  return "";
}

}  // namespace zinf
