// hf_transformers_test.cpp — zinf against transformers itself (the independent checkers'
// transformers and torch): small random Llama, Qwen2, Mistral and GPT-2 models that transformers
// makes and saves (save_pretrained), with every rotary scaling type and Mistral and Qwen2 sliding
// windows shorter than the sequence and the generation, in transformers 5's config.json
// (rope_parameters) and in transformers 4's (rope_theta and rope_scaling at the top). zinf's
// per-token training losses must equal transformers' float64 ones, its greedy generation must pick
// transformers' tokens, and its export must load in transformers as the same class, in the same
// config format, with the same losses. The script is tests/io/hf_transformers_check.py.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/checkers.h"
#include "common/temp_dir.h"
#include "io/hf.h"
#include "model/generate.h"
#include "model/lm.h"
#include "zinf/backends/backend.h"
#include "zinf/backends/cpu.h"
#include "zinf/error.h"

namespace zinf {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using test::TempDir;

const std::string kScript = std::string(ZINF_SOURCE_DIR) + "/tests/io/hf_transformers_check.py";
constexpr int kT = 64;

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::vector<std::vector<float>> load_all(const std::string& dir, const ModelShape& s) {
  HfModelReader r(dir);
  r.check(s);
  std::vector<std::vector<float>> units;
  for (const auto& l : layer_units(s)) units.emplace_back(static_cast<std::size_t>(l.params));
  for (std::size_t u = 0; u < units.size(); ++u) r.load_unit(s, u, units[u].data());
  return units;
}

// zinf's per-token training losses on the CPU device (fp32, reference kernels).
std::vector<float> zinf_losses(const ModelShape& s, std::vector<std::vector<float>>& units, const std::vector<int>& tok,
                               const std::vector<int>& tgt) {
  auto dev = make_cpu_device(64 << 20);
  auto ops = backends::backend_for(DeviceType::cpu).make_ops(*dev, Precision::fp32, 1, Kernels::reference);
  const int B = static_cast<int>(tok.size()) / s.seq_len;
  auto model = make_model(s, B, /*checkpointing=*/false, *dev, *ops);
  std::vector<std::vector<float>> grads;
  std::vector<const float*> w;
  std::vector<float*> g;
  std::vector<std::size_t> n;
  for (auto& u : units) {
    grads.emplace_back(u.size(), 0.0f);
    w.push_back(u.data()), g.push_back(grads.back().data()), n.push_back(u.size());
  }
  ResidentUnits src(w, g, n);
  model->forward(src, tok.data(), tgt.data());
  dev->synchronize();
  return std::vector<float>(model->row_losses(), model->row_losses() + model->rows());
}

// zinf's greedy continuation of `prompt` by the KV-cache decoder `zinf generate` uses.
std::vector<int> zinf_greedy(const ModelShape& s, const std::vector<std::vector<float>>& units,
                             const std::vector<int>& prompt, int n) {
  auto dev = make_cpu_device(64 << 20);
  auto ops = backends::backend_for(DeviceType::cpu).make_ops(*dev, Precision::fp32, 1, Kernels::reference);
  std::vector<ConstTensorView> views;
  for (const auto& u : units) views.emplace_back(u.data(), u.size());
  KvDecoder d(s, *dev, *ops, views, static_cast<int>(prompt.size()) + n);
  return generate(d, prompt, n, SamplingOptions{}, {}).ids;
}

struct Case {
  const char* family;
  const char* rope;
  const char* format;  // v5: rope_parameters; v4: rope_theta and rope_scaling at the top
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.family << " " << c.rope << " " << c.format; }

class TransformersParity : public ::testing::TestWithParam<Case> {};

TEST_P(TransformersParity, LossesGreedyIdsAndExportMatchTransformers) {
  const std::string py = test::checker_python("transformers");
  if (py.empty()) GTEST_SKIP() << test::checker_missing("transformers");
  if (test::checker_python("torch").empty()) GTEST_SKIP() << test::checker_missing("torch");
  const Case c = GetParam();
  TempDir t("hf-transformers-test");
  const std::string dir = t / "m", out = t / "out";
  const auto made = test::run_python(py, "", {kScript, "make", dir, c.family, c.rope, c.format});
  ASSERT_EQ(made.status, 0) << made.output;
  const ModelShape s = hf_shape(dir, kT);
  if (s.family == ModelFamily::llama) {
    EXPECT_EQ(s.rope.type, std::string(c.rope).substr(0, std::string(c.rope).find('-')));
    EXPECT_EQ(s.hf.legacy_rope, std::string(c.format) == "v4");
    EXPECT_EQ(s.rope_theta, 1000.0);
  }
  // The windowed folders: windows shorter than the sequence and than the prompt plus the generation.
  if (std::string(c.family) == "mistral-window") {
    EXPECT_EQ(s.sliding_window, 5);
    EXPECT_EQ(s.window_from, 0);
  }
  if (std::string(c.family) == "qwen2-window") {
    EXPECT_EQ(s.sliding_window, 8);
    EXPECT_EQ(s.window_from, 1);
  }
  auto units = load_all(dir, s);
  const json e = json::parse(slurp(dir + "/expect.json"));
  const auto tok = e["tokens"].get<std::vector<int>>(), tgt = e["targets"].get<std::vector<int>>();
  const auto want = e["losses"].get<std::vector<double>>();
  const auto got = zinf_losses(s, units, tok, tgt);
  ASSERT_EQ(got.size(), want.size());
  double worst = 0, mean_got = 0, mean_want = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, std::abs(got[i] - want[i]) / want[i]);
    mean_got += got[i], mean_want += want[i];
  }
  const double mean_rel = std::abs(mean_got - mean_want) / mean_want;
  std::printf("%s %s %s: mean loss %.6f, relative difference of the mean %.2e, worst per token %.2e\n", c.family,
              c.rope, c.format, mean_want / static_cast<double>(want.size()), mean_rel, worst);
  EXPECT_GT(mean_want / static_cast<double>(want.size()), 1.0);  // far from zero: the comparison means something
  // fp32 against transformers' float64: the mean loss within 1e-6 relative, every token within 1e-5.
  EXPECT_LT(mean_rel, 1e-6);
  EXPECT_LT(worst, 1e-5);
  // Greedy generation: transformers' model.generate(do_sample=False) tokens.
  const auto prompt = e["prompt"].get<std::vector<int>>(), ids = e["generated"].get<std::vector<int>>();
  EXPECT_EQ(zinf_greedy(s, units, prompt, static_cast<int>(ids.size())), ids);
  // The export: the same class and config format in transformers, the same losses.
  write_hf_folder(out, s, units, StDtype::f32);
  const auto checked = test::run_python(py, "", {kScript, "check", dir, out});
  ASSERT_EQ(checked.status, 0) << checked.output;
  const auto at = checked.output.find("max_loss_diff ");
  ASSERT_NE(at, std::string::npos) << checked.output;
  EXPECT_EQ(std::stod(checked.output.substr(at + 14)), 0.0) << "the same weights and settings, the same losses";
}

INSTANTIATE_TEST_SUITE_P(Folders, TransformersParity,
                         ::testing::Values(Case{"llama", "default", "v5"}, Case{"llama", "default", "v4"},
                                           Case{"llama", "linear", "v5"}, Case{"llama", "dynamic", "v4"},
                                           Case{"llama", "llama3", "v5"}, Case{"llama", "llama3", "v4"},
                                           Case{"llama", "yarn", "v5"}, Case{"llama", "yarn-mscale", "v4"},
                                           Case{"llama", "longrope", "v5"}, Case{"qwen2", "yarn", "v5"},
                                           Case{"qwen2", "default", "v4"}, Case{"mistral", "default", "v5"},
                                           Case{"mistral", "linear", "v4"}, Case{"mistral-window", "default", "v5"},
                                           Case{"qwen2-window", "default", "v5"}, Case{"gpt2", "none", "v5"}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           std::string n = std::string(i.param.family) + "_" + i.param.rope + "_" + i.param.format;
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

// What zinf cannot compute is refused by the command line: one line naming the key, a non-zero exit.
TEST(TransformersRefusals, UnsupportedRotaryTypesAndForwardChangingKeysAreOneLineAndAFailedExit) {
  const std::string py = test::checker_python("transformers");
  if (py.empty()) GTEST_SKIP() << test::checker_missing("transformers");
  if (test::checker_python("torch").empty()) GTEST_SKIP() << test::checker_missing("torch");
  TempDir t("hf-transformers-test");
  const std::string dir = t / "m";
  const auto made = test::run_python(py, "", {kScript, "make", dir, "mistral", "default", "v5"});
  ASSERT_EQ(made.status, 0) << made.output;
  const json orig = json::parse(slurp(dir + "/config.json"));
  std::ofstream(t / "run.json") << R"({"model": {"init_from": ")" + dir + R"(", "seq_len": 64},
      "device": {"type": "cpu", "memory_budget": "256MiB", "threads": 1}, "train_batch_size": 2})";
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"rope_parameters", {{"rope_type", "mrope"}, {"rope_theta", 1000.0}}}},
       "rope_parameters.rope_type: 'mrope' is not supported"},
      {{{"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1000.0}, {"mrope_section", {2, 2}}}}},
       "rope_parameters.mrope_section: is not a rotary setting zinf computes"},
      {{{"rope_theta", 10000.0}}, "rope_theta: 10000.0 disagrees with rope_parameters.rope_theta 1000.0"},
      {{{"partial_rotary_factor", 0.5}}, "partial_rotary_factor: 0.5 is not supported"},
      {{{"head_dim", 32}}, "head_dim: 32 differs from hidden_size / num_attention_heads"},
      {{{"hidden_act", "gelu"}}, "hidden_act: \"gelu\" is not silu"},
  };
  for (const auto& [patch, why] : cases) {
    json c = orig;
    c.update(patch);
    std::ofstream(dir + "/config.json") << c.dump();
    const std::string cmd = std::string(ZINF_BIN) + " eval --config " + (t / "run.json") + " 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string text;
    char buf[4096];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) text.append(buf, n);
    const int st = pclose(p);
    EXPECT_NE(st, 0) << patch.dump();
    EXPECT_NE(text.find(why), std::string::npos) << patch.dump() << ": " << text;
    EXPECT_LE(std::count(text.begin(), text.end(), '\n'), 2) << text;  // the error (and at most a hint)
  }
}

}  // namespace
}  // namespace zinf
