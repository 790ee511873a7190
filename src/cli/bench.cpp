// bench.cpp — `zinf bench <what>`: user-facing measurements, each as a ratio against a limit
// measured in the same run. `adam` today; `nvme`, `step` and `pcie` join with their issues.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>

#include "commands.h"
#include "zinf/bench.h"
#include "zinf/config.h"
#include "zinf/cpu_adam/simd.h"
#include "zinf/error.h"

namespace zinf::cli {
namespace {

struct AdamArgs {
  std::string params = "256M";
  int threads = 0;
  int reps = 5;
  std::string simd = "auto";
  bool json = false;
};

// "256M" → 256,000,000 parameters (K, M, G are powers of 1000 for counts).
std::int64_t parse_count(const std::string& s) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::logic_error&) {
    throw zinf::ConfigError("--params: '" + s + "' is not a count (e.g. 64M, 1.5G, 1000000)");
  }
  std::string unit = s.substr(used);
  double mult = unit.empty() ? 1 : unit == "K" || unit == "k" ? 1e3 : unit == "M" || unit == "m" ? 1e6 : unit == "G" || unit == "g" ? 1e9 : 0;
  if (mult == 0 || v <= 0) throw zinf::ConfigError("--params: '" + s + "' is not a count (e.g. 64M, 1.5G, 1000000)");
  return static_cast<std::int64_t>(v * mult);
}

int run_adam(const AdamArgs& a) {
  if (a.simd != "auto") cpu_adam::set_simd_cap(cpu_adam::parse_simd_level(a.simd));
  AdamBenchOptions o;
  o.params = parse_count(a.params);
  o.threads = a.threads;
  o.reps = a.reps;
  AdamBenchResult r = run_adam_bench(o, [&](const std::string& line) {
    if (!a.json) std::fprintf(stderr, "bench adam: %s\n", line.c_str());
  });
  if (a.json) {
    nlohmann::json j = {{"params", r.params}, {"threads", r.threads}, {"simd", r.simd},
                        {"bytes_per_param", r.bytes_per_param}, {"ratio", r.ratio},
                        {"speedup_vs_naive", r.speedup_vs_naive}};
    auto row = [](const AdamBenchRow& x) {
      return nlohmann::json{{"seconds", x.seconds}, {"params_per_s", x.params_per_s}, {"gb_per_s", x.gb_per_s}};
    };
    j["fused"] = row(r.fused);
    j["memory_limit"] = row(r.traffic);
    j["naive"] = row(r.naive);
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("zinf bench adam — %lld params, %d threads, %s path, %.0f B/param, best of %d\n",
              static_cast<long long>(r.params), r.threads, r.simd.c_str(), r.bytes_per_param, a.reps);
  std::printf("  %-38s %10s %12s %10s\n", "", "Gparam/s", "GB/s", "s");
  auto line = [](const char* name, const AdamBenchRow& x) {
    std::printf("  %-38s %10.3f %12.2f %10.4f\n", name, x.params_per_s / 1e9, x.gb_per_s, x.seconds);
  };
  line("(a) fused Update (fp16 grad in/out)", r.fused);
  line("(b) memory limit (same streams)", r.traffic);
  line("(c) plain C++ Adam loop", r.naive);
  std::printf("  ratio (a)/(b) = %.3f   speedup (a)/(c) = %.2fx\n", r.ratio, r.speedup_vs_naive);
  return 0;
}

}  // namespace

Command add_bench(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("bench", "Measure what this machine can do, as ratios against limits measured in the same run");
  sub->require_subcommand(1);
  auto args = std::make_shared<AdamArgs>();
  CLI::App* adam = sub->add_subcommand(
      "adam",
      "The fused host Update (Adam/AdamW, fp16 gradients in, fp16 parameter copy out, 28 bytes per parameter) "
      "against (b) a kernel with the same loads and stores but trivial math — the memory-movement limit of the "
      "pass — and (c) Adam written as a plain C++ loop. Reports params/s, GB/s and the ratio (a)/(b); the fused "
      "path is checked against the scalar reference before timing");
  adam->add_option("--params", args->params, "Parameters to update, e.g. 64M, 256M (K/M/G = 10^3/10^6/10^9)")->capture_default_str();
  adam->add_option("--threads", args->threads, "Host threads (0 = physical cores)")->capture_default_str();
  adam->add_option("--reps", args->reps, "Repetitions; the best is reported")->check(CLI::Range(1, 1000))->capture_default_str();
  adam->add_option("--simd", args->simd, "Cap the SIMD path: auto, avx512, avx2, scalar")->capture_default_str();
  adam->add_flag("--json", args->json, "Print one JSON object (the ratio as `ratio`)");
  return {adam, [args] { return run_adam(*args); }};
}

}  // namespace zinf::cli
