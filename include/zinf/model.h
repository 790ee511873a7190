// zinf/model.h — the GPT model's shape: presets and exact parameter accounting.
//
// The architecture is GPT-2's: token + position embeddings, n_layer pre-LayerNorm blocks (causal
// self-attention, GELU MLP with 4·C hidden), a final LayerNorm, and an LM head tied to the token
// embedding. Parameters are stored as one flat buffer per *layer unit* — the embedding unit, each
// block, the final LayerNorm — and a unit is what the offload scheduler moves.
//
// Shapes: V = vocab_size, T = seq_len (positions), C = d_model, L = n_layer, H = n_head.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zinf {

struct ModelShape {
  int n_layer = 0, n_head = 0, d_model = 0, vocab_size = 0, seq_len = 0;
  bool operator==(const ModelShape&) const = default;
};

struct ModelConfig;
// The shape a run config's `model` section describes (the one way to get it from a config).
ModelShape model_shape(const ModelConfig& m);

struct ModelPreset {
  std::string name;
  ModelShape shape;
  std::string note;
};

// GPT-2 (124M…1.5B, vocab 50257, T 1024) and GPT-3-style shapes (2.7B…175B, T 2048; 30b and 66b
// use OPT's published widths, whose head counts divide them).
const std::vector<ModelPreset>& model_presets();
// Throws ConfigError when the name is unknown.
const ModelPreset& find_model_preset(const std::string& name);

struct LayerUnit {
  std::string name;     // "embedding", "block.0", …, "ln_f"
  std::int64_t params;  // elements in this unit's flat buffer
};

// The layer units in forward order and their exact parameter counts.
std::vector<LayerUnit> layer_units(const ModelShape& s);
// Exact parameter count (tied LM head counted once): V·C + T·C + L·(12C² + 13C) + 2C.
std::int64_t count_params(const ModelShape& s);
std::int64_t block_params(const ModelShape& s);  // 12C² + 13C
std::int64_t largest_unit_params(const ModelShape& s);

}  // namespace zinf
