// shape.cpp — presets and exact parameter counts for the GPT-2 architecture (model/shape.h).
#include <algorithm>

#include "model/shape.h"
#include "zinf/error.h"

namespace zinf {

namespace {
// A Llama-family shape; rope_factor != 1 selects Llama 3's scaling (low 1, high 4, original 8192).
ModelShape llama(int L, int H, int KV, int C, int F, int V, double theta, bool tied, bool qkv_bias, double eps,
                 double rope_factor) {
  ModelShape s{L, H, C, V, 2048};
  s.family = ModelFamily::llama;
  s.n_kv_head = KV, s.d_ff = F, s.tie_embeddings = tied, s.qkv_bias = qkv_bias;
  s.rope_theta = theta, s.norm_eps = eps, s.rope_factor = rope_factor;
  if (rope_factor != 1) s.rope.type = "llama3";
  return s;
}
}  // namespace

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
      // The Llama family, at their published shapes (fine-tuning sequence length 2048).
      {"llama-3.2-1b", llama(16, 32, 8, 2048, 8192, 128256, 500000, true, false, 1e-5, 32), "Llama 3.2 1B"},
      {"llama-3.1-8b", llama(32, 32, 8, 4096, 14336, 128256, 500000, false, false, 1e-5, 8), "Llama 3.1 8B"},
      {"llama-3.1-70b", llama(80, 64, 8, 8192, 28672, 128256, 500000, false, false, 1e-5, 8), "Llama 3.1 70B"},
      {"llama-2-13b", llama(40, 40, 40, 5120, 13824, 32000, 10000, false, false, 1e-5, 1), "Llama 2 13B"},
      {"mistral-7b", llama(32, 32, 8, 4096, 14336, 32000, 10000, false, false, 1e-5, 1), "Mistral 7B v0.1"},
      {"qwen2.5-7b", llama(28, 28, 4, 3584, 18944, 152064, 1000000, false, true, 1e-6, 1), "Qwen2.5 7B"},
      {"tinyllama-1.1b", llama(22, 32, 4, 2048, 5632, 32000, 10000, false, false, 1e-5, 1), "TinyLlama 1.1B"},
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
  if (s.family == ModelFamily::llama) {
    const std::int64_t KVD = std::int64_t{s.kv_heads()} * s.head_dim(), F = s.d_ff;
    // attn_norm (C) + wq (C²) + wk, wv (2·C·KVD) + wo (C²) + ffn_norm (C) + gate, up, down (3·C·F) [+ q, k, v biases]
    return 2 * C + 2 * C * C + 2 * C * KVD + 3 * C * F + (s.qkv_bias ? C + 2 * KVD : 0);
  }
  // ln_1 (2C) + attn qkv (3C² + 3C) + attn proj (C² + C) + ln_2 (2C) + fc (4C² + 4C) + proj (4C² + C)
  return 12 * C * C + 13 * C;
}

namespace {
std::int64_t embedding_params(const ModelShape& s) {
  const std::int64_t C = s.d_model;
  return std::int64_t{s.vocab_size} * C + (s.family == ModelFamily::gpt2 ? std::int64_t{s.seq_len} * C : 0);
}
std::int64_t final_params(const ModelShape& s) {
  const std::int64_t C = s.d_model;
  if (s.family == ModelFamily::gpt2) return 2 * C;
  return C + (s.tie_embeddings ? 0 : std::int64_t{s.vocab_size} * C);
}
}  // namespace

std::vector<LayerUnit> layer_units(const ModelShape& s) {
  std::vector<LayerUnit> u;
  u.reserve(static_cast<std::size_t>(s.n_layer) + 2);
  u.push_back({"embedding", embedding_params(s)});
  for (int l = 0; l < s.n_layer; ++l) u.push_back({"block." + std::to_string(l), block_params(s)});
  u.push_back({s.family == ModelFamily::gpt2 ? "ln_f" : "final", final_params(s)});
  return u;
}

std::int64_t count_params(const ModelShape& s) {
  return embedding_params(s) + s.n_layer * block_params(s) + final_params(s);
}

std::int64_t largest_unit_params(const ModelShape& s) {
  return std::max({embedding_params(s), block_params(s), final_params(s)});
}

}  // namespace zinf
