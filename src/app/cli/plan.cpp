// plan.cpp — `zinf plan --config C [--set k=v]... [--json]`: where every byte of the training state
// lives, whether it fits this machine, and what runs out first.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>

#include "commands.h"
#include "zinf/comm.h"
#include "app/config/config.h"
#include "app/plan/plan.h"

namespace zinf::cli {
namespace {

struct PlanArgs {
  ConfigArgs config;
  bool json = false;
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

int run_plan(const PlanArgs& a) {
  const World w = detect_world();
  if (w.rank != 0) return 0;  // under mpirun: one plan, from rank 0
  Config c = load_config(a.config.path, a.config.overrides, a.world > 0 ? a.world : w.size);
  for (const auto& n : c.notes) std::fprintf(stderr, "note: %s\n", n.c_str());
  MachineInfo m = query_machine();
  RunPlan r = plan_run(c, m);
  const auto& p = r.plan;

  if (a.json) {
    nlohmann::json j;
    j["config"] = c.source;
    j["model"] = {{"preset", c.model.preset}, {"n_layer", r.shape.n_layer}, {"n_head", r.shape.n_head},
                  {"d_model", r.shape.d_model}, {"vocab_size", r.shape.vocab_size}, {"seq_len", r.shape.seq_len},
                  {"params", p.n_params}, {"largest_unit_params", p.largest_unit}};
    j["precision"] = to_string(c.precision());
    j["offload_optimizer"] = to_string(c.zero.offload_optimizer.device);
    j["offload_param"] = to_string(c.zero.offload_param.device);
    j["states"] = nlohmann::json::array();
    for (const auto& row : p.states)
      j["states"].push_back({{"name", row.name}, {"dtype", row.dtype}, {"bytes", tiers_json(row.bytes)}});
    j["buffers"] = nlohmann::json::array();
    for (const auto& row : p.buffers)
      j["buffers"].push_back({{"name", row.name}, {"bytes", tiers_json(row.bytes)}, {"note", row.note}});
    j["model_states"] = tiers_json(p.model_states);
    j["totals"] = tiers_json(p.totals);
    j["pinned_pool_bytes"] = p.pinned_pool;
    j["activations"] = {{"plain", r.activations_plain}, {"checkpointed", r.activations_checkpointed},
                        {"checkpointing", c.model.activation_checkpointing}};
    j["capacity"] = {{"device", r.capacity.device}, {"host", r.capacity.host}, {"pinnable", r.capacity.pinnable},
                     {"nvme", r.capacity.nvme_known ? nlohmann::json(r.capacity.nvme) : nlohmann::json(nullptr)}};
    j["verdict"] = {{"fits", r.verdict.fits}, {"limiting", r.verdict.limiting},
                    {"limiting_fraction", r.verdict.limiting_fraction}, {"problems", r.verdict.problems}};
    j["deepspeed_zero3_estimate"] = {{"cpu", r.deepspeed.cpu}, {"gpu", r.deepspeed.gpu}};
    j["world_size"] = r.world;
    j["per_rank_stages"] = nlohmann::json::array();
    for (const auto& s : r.stages)
      j["per_rank_stages"].push_back({{"stage", s.stage}, {"valid", s.valid}, {"model_states", tiers_json(s.model_states)},
                                      {"totals", tiers_json(s.totals)}, {"zero_paper_model_states", s.zero_paper}});
    j["largest_fit"] = nlohmann::json::array();
    for (const auto& f : r.largest)
      j["largest_fit"].push_back({{"optimizer", to_string(f.optimizer)}, {"param", to_string(f.param)},
                                  {"n_layer", f.n_layer}, {"params", f.params}, {"largest_preset", f.largest_preset}});
    j["notes"] = r.notes;
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }

  std::printf("zinf plan — %s\n", c.source.c_str());
  const std::string family = r.shape.family == ModelFamily::llama
                                 ? "llama, " + std::to_string(r.shape.kv_heads()) + " kv heads, d_ff " + std::to_string(r.shape.d_ff) +
                                       (r.shape.tie_embeddings ? ", tied head" : "") + ", "
                                 : "";
  std::printf("model      %s%s%s%d layers, d_model %d, %d heads, vocab %d, seq %d: %s params (%lld), largest unit %s\n",
              c.model.preset.c_str(), c.model.preset.empty() ? "" : ": ", family.c_str(), r.shape.n_layer, r.shape.d_model,
              r.shape.n_head, r.shape.vocab_size, r.shape.seq_len, format_count(p.n_params).c_str(),
              static_cast<long long>(p.n_params), format_count(p.largest_unit).c_str());
  std::printf("run        %s, micro batch %lld x GA %lld = %lld, ZeRO stage %d, offload_optimizer=%s, offload_param=%s\n",
              std::string(to_string(c.precision())).c_str(), static_cast<long long>(c.micro_batch_size),
              static_cast<long long>(c.gradient_accumulation_steps), static_cast<long long>(c.train_batch_size),
              c.zero.stage, std::string(to_string(c.zero.offload_optimizer.device)).c_str(),
              std::string(to_string(c.zero.offload_param.device)).c_str());
  std::printf("\n  %-16s %-7s %12s %12s %12s %12s\n", "state", "dtype", "device", "pinned", "host", "nvme");
  print_rows(p.states);
  print_total("model states", p.model_states);
  print_rows(p.buffers);
  print_total("total", p.totals);
  std::printf("\nactivations  %s without checkpointing, %s with (this run: %s)\n",
              format_bytes(r.activations_plain).c_str(), format_bytes(r.activations_checkpointed).c_str(),
              c.model.activation_checkpointing ? "with" : "without");
  std::printf("pinned pool  %s of staging buffers, bounded\n", format_bytes(p.pinned_pool).c_str());
  std::printf("capacity     device %s, host %s available, pinnable %s, nvme %s\n",
              format_bytes(r.capacity.device).c_str(), format_bytes(r.capacity.host).c_str(),
              format_bytes(r.capacity.pinnable).c_str(),
              r.capacity.nvme_known ? format_bytes(r.capacity.nvme).c_str() : "unknown");
  const std::string share = std::isfinite(r.verdict.limiting_fraction)
                                ? std::to_string(static_cast<long long>(std::lround(100.0 * r.verdict.limiting_fraction))) + "%"
                                : "";  // nothing of it is available
  if (r.verdict.fits)
    std::printf("verdict      FITS — tightest resource: %s at %s\n", r.verdict.limiting.c_str(), share.c_str());
  else
    std::printf("verdict      DOES NOT FIT — first to run out: %s (%s); %s\n", r.verdict.limiting.c_str(),
                share.empty() ? "none available" : (share + " of capacity").c_str(),
                r.verdict.problems.empty() ? "" : r.verdict.problems.front().c_str());
  std::printf("deepspeed    estimate_zero3_model_states_mem_needs (x1.5 buffer factor): cpu %s, gpu %s\n",
              format_bytes(r.deepspeed.cpu).c_str(), format_bytes(r.deepspeed.gpu).c_str());
  std::printf("\nper rank     %d rank(s), rank 0 (the largest shards), this placement at each ZeRO stage; the ZeRO paper's\n"
              "             model states per GPU (mixed-precision Adam, nothing offloaded) beside them\n",
              r.world);
  std::printf("  %-6s %12s %12s %12s %12s %12s   %s\n", "stage", "device", "pinned", "host", "nvme", "states", "ZeRO paper");
  for (const auto& s : r.stages) {
    std::uint64_t states = 0;
    for (auto b : s.model_states) states += b;
    std::printf("  %-6d %12s %12s %12s %12s %12s   %s%s\n", s.stage, cell(s.totals[0]).c_str(), cell(s.totals[1]).c_str(),
                cell(s.totals[2]).c_str(), cell(s.totals[3]).c_str(), cell(states).c_str(), format_bytes(s.zero_paper).c_str(),
                s.valid ? (s.stage == c.zero.stage ? "   <- this run" : "") : "   (this offload needs a higher stage)");
  }
  std::printf("\nlargest model that fits: of this width (n_layer scaled) | the largest real model (llama-family preset, this seq_len)\n");
  for (const auto& f : r.largest) {
    const std::string real = f.largest_preset.empty() ? "none" : f.largest_preset;
    if (f.n_layer == 0)
      std::printf("  %-30s  not even one block              | %s\n", f.setting.c_str(), real.c_str());
    else
      std::printf("  %-30s  n_layer %-7d %-14s params | %s\n", f.setting.c_str(), f.n_layer, format_count(f.params).c_str(), real.c_str());
  }
  for (const auto& n : r.notes) std::printf("note: %s\n", n.c_str());
  return 0;
}

}  // namespace

void add_config_options(CLI::App& sub, ConfigArgs& args, bool required) {
  auto* opt = sub.add_option("-c,--config", args.path, "Run config: a DeepSpeed ds_config.json with zinf's sections")
                  ->type_name("FILE");
  if (required) opt->required();
  sub.add_option("--set", args.overrides, "Override a config key in dotted form, e.g. --set zero_optimization.stage=3")
      ->type_name("KEY=VALUE");
}

Command add_plan(CLI::App& app) {
  auto args = std::make_shared<PlanArgs>();
  CLI::App* sub = app.add_subcommand(
      "plan",
      "Place the model's training state on this machine before anything runs: bytes per state per tier "
      "(device, pinned host, host, NVMe), activations, pinned pool, a verdict with the first resource to run "
      "out, and the largest model of the same width that fits under each offload setting");
  add_config_options(*sub, args->config, true);
  sub->add_flag("--json", args->json, "Print one JSON object instead of the table");
  sub->add_option("--world", args->world,
                  "Data-parallel ranks to plan for (per-rank bytes; default: the ranks mpirun started, or 1)")
      ->check(CLI::Range(1, 1 << 20));
  return {sub, [args] { return run_plan(*args); }};
}

}  // namespace zinf::cli
