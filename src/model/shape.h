// model/shape.h — the GPT model's shape: presets and exact parameter accounting.
//
// Two architectures. GPT-2: token + position embeddings, n_layer pre-LayerNorm blocks (causal
// self-attention, GELU MLP with 4·C hidden), a final LayerNorm, and an LM head tied to the token
// embedding. Llama (Llama 2/3, Mistral, Qwen2, …): token embedding, pre-RMSNorm blocks (rotary
// positions, grouped-query attention with KV key/value heads, SwiGLU MLP with F hidden), a final
// RMSNorm, and an LM head tied to the embedding or its own. Parameters are stored as one flat buffer
// per *layer unit* — the embedding unit, each block, the final unit (norm, and an untied head) — and
// a unit is what the offload scheduler moves.
//
// Shapes: V = vocab_size, T = seq_len (positions), C = d_model, L = n_layer, H = n_head,
// KV = key/value heads, D = C / H, F = d_ff.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zinf/types.h"

namespace zinf {

// The rotary scaling of the Llama family, as transformers names it (rope_type and its parameters);
// rope_factor, rope_low_freq_factor, rope_high_freq_factor and rope_original_max of ModelShape are
// the shared factor, llama3's two band factors and original_max_position_embeddings.
//   default  theta^(-2i/D)                          dynamic  default while seq_len <= max_positions
//   linear   default / factor                       llama3   Llama 3's banded slow-down
//   yarn     extrapolation/interpolation blend, cos and sin scaled by attention_factor
//   longrope default / short_factor[i] (long_factor[i] past original_max), cos and sin scaled
struct RopeParams {
  std::string type = "default";  // default, linear, dynamic, yarn, longrope, llama3
  double attention_factor = 0;   // yarn, longrope: 0 = derived from the factor as transformers does
  double beta_fast = 32, beta_slow = 1, mscale = 0, mscale_all_dim = 0;  // yarn (mscale 0: absent)
  bool truncate = true;                                                   // yarn
  std::vector<double> short_factor, long_factor;  // longrope: D/2 each
  bool operator==(const RopeParams&) const = default;
};

// Where a Hugging Face folder's model came from, so that an export writes it back the same way.
struct HfOrigin {
  std::string model_type;      // "llama", "mistral", "qwen2" ("": not from a folder; export derives it)
  bool legacy_rope = false;    // rope_theta / rope_scaling at the top (transformers 4), not rope_parameters
  // Qwen2 with use_sliding_window: max_window_layers and sliding_window as config.json gave them
  // (-1 and 0 otherwise).
  int max_window_layers = -1, window = 0;
  bool operator==(const HfOrigin&) const = default;
};

struct ModelShape {
  int n_layer = 0, n_head = 0, d_model = 0, vocab_size = 0, seq_len = 0;
  ModelFamily family = ModelFamily::gpt2;
  // The llama family (ignored for gpt2): see ModelConfig.
  int n_kv_head = 0, d_ff = 0;
  bool tie_embeddings = true, qkv_bias = false;
  double rope_theta = 10000, norm_eps = 1e-5;
  double rope_factor = 1, rope_low_freq_factor = 1, rope_high_freq_factor = 4, rope_original_max = 8192;
  int max_positions = 0;  // the positions the model was made for (config.json's max_position_embeddings; 0 = seq_len)
  // The rotary scaling beyond theta (config.json's rope_parameters / rope_scaling), and where the
  // model came from. Empty or zero fields are "absent" (see RopeParams).
  RopeParams rope{};
  // Mistral / Qwen2: the attention window in tokens (0: none) of the layers from window_from on
  // (Mistral: all; Qwen2: those config.json's max_window_layers / layer_types make sliding): query
  // position t attends key position s iff s <= t and t - s < sliding_window, as transformers masks it.
  int sliding_window = 0, window_from = 0;
  HfOrigin hf{};
  bool operator==(const ModelShape&) const = default;
  int kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int head_dim() const { return d_model / n_head; }
  // The window layer l attends within (0: none). A window as long as the sequence masks nothing, so
  // it is 0 too and such a model runs exactly as one without a window.
  int layer_window(int l) const {
    return sliding_window > 0 && sliding_window < seq_len && l >= window_from ? sliding_window : 0;
  }
};

// The largest shape zinf accepts from any source — a config, a Hugging Face config.json, a
// checkpoint — checked before anything is sized from it. Each is far beyond any published model and
// small enough that the sizes computed from them (parameters, activations, rows × width) fit 64-bit
// arithmetic. docs/config.md lists them.
namespace shape_limits {
constexpr std::int64_t layers = 4096, heads = 4096, width = 1 << 20, vocab = 1 << 24, positions = 1 << 20,
                       ff_width = 1 << 22;
}

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
// Exact parameter count (a tied LM head counted once). GPT-2: V·C + T·C + L·(12C² + 13C) + 2C.
// Llama: V·C + L·(2C + 2C² + 2·C·KV·D + 3·C·F [+ C + 2·KV·D with q/k/v biases]) + C [+ V·C untied].
std::int64_t count_params(const ModelShape& s);
std::int64_t block_params(const ModelShape& s);
std::int64_t largest_unit_params(const ModelShape& s);

}  // namespace zinf
