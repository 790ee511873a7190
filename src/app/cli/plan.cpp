// plan.cpp — `zinf plan --config C [--set k=v]... [--json | --dataflow [--dot]]`: where every byte of
// the training state lives, whether it fits this machine, and what runs out first; or one training
// step of this placement as a dataflow graph (zinf/offload/dataflow.h).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>

#include "app/config/config.h"
#include "app/plan/plan.h"
#include "commands.h"
#include "zinf/backends/world.h"
#include "zinf/comm.h"
#include "zinf/offload/buffer_specs.h"
#include "zinf/offload/dataflow.h"

namespace zinf::cli {
namespace {

// `zinf plan --help`.
constexpr const char* kPlanAbout =
    "Place the model's training state on this machine before anything runs: bytes per state per tier "
    "(device, pinned host, host, NVMe), activations, pinned pool, a verdict with the first resource to run "
    "out, and the largest model of the same width that fits under each offload setting";

struct PlanArgs {
  ConfigArgs config;
  bool json = false;
  bool dataflow = false;  // the step's supernodes, resources and handoffs instead of the bytes
  bool dot = false;       // with dataflow: as Graphviz
  int world = 0;  // 0: the launcher's world (1 for a process started alone)
};

std::string cell(std::uint64_t b) { return b ? format_bytes(b) : "-"; }

void print_rows(const std::vector<offload::Row>& rows) {
  for (const auto& r : rows) {
    std::printf("  %-16s %-7s", r.name.c_str(), r.dtype.c_str());
    for (int t = 0; t < offload::kTiers; ++t) std::printf(" %12s", cell(r.bytes[t]).c_str());
    std::printf("  %s\n", r.note.c_str());
  }
}

void print_total(const char* name, const offload::TierBytes& b) {
  std::printf("  %-16s %-7s", name, "");
  for (int t = 0; t < offload::kTiers; ++t) std::printf(" %12s", cell(b[t]).c_str());
  std::printf("\n");
}

nlohmann::json tiers_json(const offload::TierBytes& b) {
  nlohmann::json j;
  for (int t = 0; t < offload::kTiers; ++t) j[offload::tier_name(static_cast<offload::Tier>(t))] = b[t];
  return j;
}

nlohmann::json plan_json(const Config& config, const RunPlan& run) {
  const auto& p = run.plan;
  nlohmann::json j;
  j["config"] = config.source;
  j["model"] = {{"preset", config.model.preset}, {"n_layer", run.shape.n_layer},         {"n_head", run.shape.n_head},
                {"d_model", run.shape.d_model},  {"vocab_size", run.shape.vocab_size},   {"seq_len", run.shape.seq_len},
                {"params", p.n_params},          {"largest_unit_params", p.largest_unit}};
  j["device"] = {{"type", to_string(run.device.type)}, {"reason", run.device.reason}};
  j["precision"] = to_string(config.precision());
  j["offload_optimizer"] = to_string(config.zero.offload_optimizer.device);
  j["offload_param"] = to_string(config.zero.offload_param.device);
  j["states"] = nlohmann::json::array();
  for (const auto& row : p.states)
    j["states"].push_back({{"name", row.name}, {"dtype", row.dtype}, {"bytes", tiers_json(row.bytes)}});
  j["buffers"] = nlohmann::json::array();
  for (const auto& row : p.buffers)
    j["buffers"].push_back({{"name", row.name}, {"bytes", tiers_json(row.bytes)}, {"note", row.note}});
  j["model_states"] = tiers_json(p.model_states);
  j["totals"] = tiers_json(p.totals);
  j["pinned_pool_bytes"] = p.pinned_pool;
  j["pin_memory"] = p.pinned;
  j["activations"] = {{"plain", run.activations_plain},
                      {"checkpointed", run.activations_checkpointed},
                      {"cpu_checkpointed", run.activations_cpu_checkpointed},
                      {"cpu_checkpointing", config.model.cpu_checkpointing},
                      {"checkpointing", config.model.activation_checkpointing}};
  j["capacity"] = {{"device", run.capacity.device},
                   {"host", run.capacity.host},
                   {"pinnable", run.capacity.pinnable},
                   {"nvme", run.capacity.nvme_known ? nlohmann::json(run.capacity.nvme) : nlohmann::json(nullptr)}};
  j["verdict"] = {{"fits", run.verdict.fits},
                  {"limiting", run.verdict.limiting},
                  {"limiting_fraction", run.verdict.limiting_fraction},
                  {"problems", run.verdict.problems}};
  j["deepspeed_zero3_estimate"] = {{"cpu", run.deepspeed.cpu}, {"gpu", run.deepspeed.gpu}};
  j["world_size"] = run.world;
  j["per_rank_stages"] = nlohmann::json::array();
  for (const auto& s : run.stages)
    j["per_rank_stages"].push_back({{"stage", s.stage},
                                    {"valid", s.valid},
                                    {"model_states", tiers_json(s.model_states)},
                                    {"totals", tiers_json(s.totals)},
                                    {"zero_paper_model_states", s.zero_paper}});
  j["largest_fit"] = nlohmann::json::array();
  for (const auto& f : run.largest)
    j["largest_fit"].push_back({{"optimizer", to_string(f.optimizer)},
                                {"param", to_string(f.param)},
                                {"gradient_streaming", f.streaming},
                                {"n_layer", f.n_layer},
                                {"params", f.params},
                                {"largest_preset", f.largest_preset}});
  auto per_param_json = [](const PerParam& q) {
    nlohmann::json x;
    for (int t = 0; t < offload::kTiers; ++t)
      x[offload::tier_name(static_cast<offload::Tier>(t))] = q.tier[static_cast<std::size_t>(t)];
    x["host_pinned"] = q.host_pinned;
    x["optimizer_states"] = cpu_adam::state_format_name(q.states);
    return x;
  };
  j["bytes_per_param"] = per_param_json(run.per_param);
  j["bytes_per_param_by_states"] = nlohmann::json::array();
  for (const auto& q : run.per_states) j["bytes_per_param_by_states"].push_back(per_param_json(q));
  const HostFootprint& f = run.footprint;
  j["host_memory"] = {{"predicted_peak_rss", f.total()},
                      {"host", f.host},
                      {"pinned", f.pinned},
                      {"device_in_host_memory", f.device},
                      {"transient", f.transient},
                      {"transient_note", f.transient_note},
                      {"data", f.data},
                      {"runtime", f.runtime}};
  j["notes"] = run.notes;
  return j;
}

// The model and the run's settings, then where each state lives per tier.
void print_placement(const Config& config, const RunPlan& run) {
  const auto& p = run.plan;
  const ModelShape& shape = run.shape;
  const std::string family = shape.family == ModelFamily::llama
                                 ? "llama, " + std::to_string(shape.kv_heads()) + " kv heads, d_ff " +
                                       std::to_string(shape.d_ff) + (shape.tie_embeddings ? ", tied head" : "") + ", "
                                 : "";
  std::printf("model      %s%s%s%d layers, d_model %d, %d heads, vocab %d, seq %d: %s params (%lld), largest unit %s\n",
              config.model.preset.c_str(), config.model.preset.empty() ? "" : ": ", family.c_str(), shape.n_layer,
              shape.d_model, shape.n_head, shape.vocab_size, shape.seq_len, format_count(p.n_params).c_str(),
              static_cast<long long>(p.n_params), format_count(p.largest_unit).c_str());
  std::printf("device     %s (%s)\n", std::string(to_string(run.device.type)).c_str(), run.device.reason.c_str());
  std::printf(
      "run        %s, micro batch %lld x GA %lld = %lld, ZeRO stage %d, offload_optimizer=%s, offload_param=%s\n",
      std::string(to_string(config.precision())).c_str(), static_cast<long long>(config.micro_batch_size),
      static_cast<long long>(config.gradient_accumulation_steps), static_cast<long long>(config.train_batch_size),
      config.zero.stage, std::string(to_string(config.zero.offload_optimizer.device)).c_str(),
      std::string(to_string(config.zero.offload_param.device)).c_str());
  std::printf("\n  %-16s %-7s %12s %12s %12s %12s\n", "state", "dtype", "device", "pinned", "host", "nvme");
  print_rows(p.states);
  print_total("model states", p.model_states);
  print_rows(p.buffers);
  print_total("total", p.totals);
}

// Activations, the pinned pool, the machine's capacity, the verdict, and DeepSpeed's estimate.
void print_verdict(const Config& config, const RunPlan& run) {
  std::printf(
      "\nactivations  %s without checkpointing, %s with, %s on the device with the checkpoints in host memory (this "
      "run: %s)\n",
      format_bytes(run.activations_plain).c_str(), format_bytes(run.activations_checkpointed).c_str(),
      format_bytes(run.activations_cpu_checkpointed).c_str(),
      !config.model.activation_checkpointing ? "without"
      : config.model.cpu_checkpointing       ? "with, in host memory"
                                             : "with");
  if (run.plan.pinned)
    std::printf("pinned pool  %s of staging buffers, bounded\n", format_bytes(run.plan.pinned_pool).c_str());
  else
    std::printf("staging      %s of buffers, bounded; pageable (pin_memory false), in the host column\n",
                format_bytes(run.plan.pinned_pool).c_str());
  std::printf("capacity     device %s, host %s available, pinnable %s, nvme %s\n",
              format_bytes(run.capacity.device).c_str(), format_bytes(run.capacity.host).c_str(),
              format_bytes(run.capacity.pinnable).c_str(),
              run.capacity.nvme_known ? format_bytes(run.capacity.nvme).c_str() : "unknown");
  const std::string share =
      std::isfinite(run.verdict.limiting_fraction)
          ? std::to_string(static_cast<long long>(std::lround(100.0 * run.verdict.limiting_fraction))) + "%"
          : "";  // nothing of it is available
  if (run.verdict.fits)
    std::printf("verdict      FITS — tightest resource: %s at %s\n", run.verdict.limiting.c_str(), share.c_str());
  else
    std::printf("verdict      DOES NOT FIT — first to run out: %s (%s); %s\n", run.verdict.limiting.c_str(),
                share.empty() ? "none available" : (share + " of capacity").c_str(),
                run.verdict.problems.empty() ? "" : run.verdict.problems.front().c_str());
  std::printf("deepspeed    estimate_zero3_model_states_mem_needs (x1.5 buffer factor): cpu %s, gpu %s\n",
              format_bytes(run.deepspeed.cpu).c_str(), format_bytes(run.deepspeed.gpu).c_str());
}

std::string per_param_cells(const PerParam& q) {
  char b[160];
  std::snprintf(b, sizeof b, "device %6.2f  pinned %6.2f  host %6.2f  nvme %6.2f  | host + pinned %6.2f", q.tier[0],
                q.tier[1], q.tier[2], q.tier[3], q.host_pinned);
  return b;
}

// Bytes per parameter on each tier, the same with the optimizer states in each format, and the host
// memory a run of this config is predicted to hold at its peak.
void print_per_param(const RunPlan& run) {
  std::printf("\nbytes/param  %s  (optimizer_states %s)\n", per_param_cells(run.per_param).c_str(),
              cpu_adam::state_format_name(run.per_param.states));
  if (!run.per_states.empty())
    std::printf("  by zero_optimization.optimizer_states (master + m + v: fp32 12, bf16 8, 8bit 6.03 B/param):\n");
  for (const auto& q : run.per_states)
    std::printf("  %-10s %s%s\n", cpu_adam::state_format_name(q.states), per_param_cells(q).c_str(),
                q.states == run.per_param.states ? "   <- this run" : "");
  const HostFootprint& f = run.footprint;
  std::printf("host memory  peak RSS of `zinf train`, predicted: %s = host %s + pinned %s",
              format_bytes(f.total()).c_str(), format_bytes(f.host).c_str(), format_bytes(f.pinned).c_str());
  if (f.device) std::printf(" + device %s (the CPU device's memory is host memory)", format_bytes(f.device).c_str());
  std::printf("\n             + transient %s (%s) + data %s + runtime %s (code, libraries, threads)\n",
              format_bytes(f.transient).c_str(), f.transient_note.c_str(), format_bytes(f.data).c_str(),
              format_bytes(f.runtime).c_str());
}

// Rank 0's bytes at each ZeRO stage beside the ZeRO paper's figure.
void print_stages(const Config& config, const RunPlan& run) {
  std::printf(
      "\nper rank     %d rank(s), rank 0 (the largest shards), this placement at each ZeRO stage; the ZeRO paper's\n"
      "             model states per GPU (mixed-precision Adam, nothing offloaded) beside them\n",
      run.world);
  std::printf("  %-6s %12s %12s %12s %12s %12s   %s\n", "stage", "device", "pinned", "host", "nvme", "states",
              "ZeRO paper");
  for (const auto& s : run.stages) {
    std::uint64_t states = 0;
    for (auto b : s.model_states) states += b;
    std::printf(
        "  %-6d %12s %12s %12s %12s %12s   %s%s\n", s.stage, cell(s.totals[0]).c_str(), cell(s.totals[1]).c_str(),
        cell(s.totals[2]).c_str(), cell(s.totals[3]).c_str(), cell(states).c_str(), format_bytes(s.zero_paper).c_str(),
        s.valid ? (s.stage == config.zero.stage ? "   <- this run" : "") : "   (this offload needs a higher stage)");
  }
}

void print_largest_fits(const RunPlan& run) {
  std::printf(
      "\nlargest model that fits: of this width (n_layer scaled) | the largest real model (llama-family preset, this "
      "seq_len)\n");
  for (const auto& f : run.largest) {
    const std::string real = f.largest_preset.empty() ? "none" : f.largest_preset;
    if (f.n_layer == 0)
      std::printf("  %-36s  not even one block              | %s\n", f.setting.c_str(), real.c_str());
    else
      std::printf("  %-36s  n_layer %-7d %-14s params | %s\n", f.setting.c_str(), f.n_layer,
                  format_count(f.params).c_str(), real.c_str());
  }
}

int run_plan(const PlanArgs& a) {
  const World world = detect_world();
  if (world.rank != 0) return 0;  // under mpirun: one plan, from rank 0
  const Config config = load_run_config(a.config, a.world > 0 ? a.world : world.size);
  print_notes(config);
  if (a.dataflow) {  // the placement alone decides the graph: the machine is not asked
    const offload::PlanInput in = make_plan_input(config, model_shape(config.model));
    const offload::StepGraph g = offload::step_graph(offload::make_layout(in));
    std::fputs((a.dot ? offload::to_dot(g) : offload::to_text(g)).c_str(), stdout);
    return 0;
  }
  // The machine as this process's rank sees it: the free memory of its own GPU (zinf/backends/gpu.h).
  const RunPlan run = plan_run(config, query_machine(world.local_rank));
  if (a.json) {
    print_json(plan_json(config, run));
    return 0;
  }
  std::printf("zinf plan — %s\n", config.source.c_str());
  print_placement(config, run);
  print_verdict(config, run);
  print_per_param(run);
  print_stages(config, run);
  print_largest_fits(run);
  for (const auto& n : run.notes) std::printf("note: %s\n", n.c_str());
  return 0;
}

}  // namespace

Command add_plan(CLI::App& app) {
  auto [sub, args] = add_subcommand<PlanArgs>(app, "plan", kPlanAbout);
  add_config_options(*sub, args->config);
  auto* json = sub->add_flag("--json", args->json, "Print one JSON object instead of the table");
  auto* dataflow = sub->add_flag("--dataflow", args->dataflow,
                                 "Print one training step of this placement as a dataflow: its supernodes, the "
                                 "resource each runs on, and the handoff that orders each edge between them");
  dataflow->excludes(json);
  sub->add_flag("--dot", args->dot, "With --dataflow: print the graph for Graphviz (dot -Tsvg)")->needs(dataflow);
  sub->add_option("--world", args->world,
                  "Data-parallel ranks to plan for (per-rank bytes; default: the ranks mpirun started, or 1)")
      ->check(CLI::Range(1, 1 << 20));
  return command(sub, args, run_plan);
}

}  // namespace zinf::cli
