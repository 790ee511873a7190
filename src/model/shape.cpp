// shape.cpp — presets and exact parameter counts for the GPT-2 architecture (zinf/model.h).
#include <algorithm>

#include "zinf/config.h"
#include "zinf/error.h"
#include "zinf/model.h"

namespace zinf {

ModelShape model_shape(const ModelConfig& m) { return {m.n_layer, m.n_head, m.d_model, m.vocab_size, m.seq_len}; }

const std::vector<ModelPreset>& model_presets() {
  static const std::vector<ModelPreset> presets = {
      {"gpt2-124m", {12, 12, 768, 50257, 1024}, "GPT-2 small"},
      {"gpt2-350m", {24, 16, 1024, 50257, 1024}, "GPT-2 medium"},
      {"gpt2-774m", {36, 20, 1280, 50257, 1024}, "GPT-2 large"},
      {"gpt2-1.5b", {48, 25, 1600, 50257, 1024}, "GPT-2 XL"},
      {"2.7b", {32, 32, 2560, 50257, 2048}, "GPT-3 2.7B"},
      {"6.7b", {32, 32, 4096, 50257, 2048}, "GPT-3 6.7B"},
      {"13b", {40, 40, 5120, 50257, 2048}, "GPT-3 13B (width 5120)"},
      {"30b", {48, 56, 7168, 50257, 2048}, "OPT-30B shape"},
      {"66b", {64, 72, 9216, 50257, 2048}, "OPT-66B shape"},
      {"175b", {96, 96, 12288, 50257, 2048}, "GPT-3 175B"},
  };
  return presets;
}

const ModelPreset& find_model_preset(const std::string& name) {
  for (const auto& p : model_presets())
    if (p.name == name) return p;
  throw ConfigError("model.preset: unknown preset '" + name + "'");
}

std::int64_t block_params(const ModelShape& s) {
  const std::int64_t C = s.d_model;
  // ln_1 (2C) + attn qkv (3C² + 3C) + attn proj (C² + C) + ln_2 (2C) + fc (4C² + 4C) + proj (4C² + C)
  return 12 * C * C + 13 * C;
}

std::vector<LayerUnit> layer_units(const ModelShape& s) {
  const std::int64_t C = s.d_model;
  std::vector<LayerUnit> u;
  u.reserve(static_cast<std::size_t>(s.n_layer) + 2);
  u.push_back({"embedding", std::int64_t{s.vocab_size} * C + std::int64_t{s.seq_len} * C});
  for (int l = 0; l < s.n_layer; ++l) u.push_back({"block." + std::to_string(l), block_params(s)});
  u.push_back({"ln_f", 2 * C});
  return u;
}

std::int64_t count_params(const ModelShape& s) {
  const std::int64_t C = s.d_model;
  return std::int64_t{s.vocab_size} * C + std::int64_t{s.seq_len} * C + s.n_layer * block_params(s) + 2 * C;
}

std::int64_t largest_unit_params(const ModelShape& s) {
  const std::int64_t C = s.d_model;
  return std::max({std::int64_t{s.vocab_size} * C + std::int64_t{s.seq_len} * C, block_params(s), 2 * C});
}

}  // namespace zinf
