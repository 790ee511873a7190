// hf.cpp — Hugging Face model folders of the Llama family (hf.h).
#include "io/hf.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <limits>
#include <optional>
#include <set>

#include "io/files.h"
#include "model/llama.h"
#include "zinf/error.h"

namespace zinf {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

json parse_json_object(std::string_view text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw ConfigError(source + ": invalid JSON (" + library_message(e) + ")");
  }
  if (!j.is_object()) throw ConfigError(source + ": expected a JSON object, got " + std::string(j.type_name()));
  return j;
}

// Writes `text` to `path` all-or-nothing.
void write_file(const std::string& path, const std::string& text) {
  OutputFile out(path, "--output");
  out.write(text.data(), text.size());
  out.commit();
}

// The file names a folder export owns: a new export replaces them all, so no shard or index of an
// earlier export survives beside the new weights; anything else in the folder (tokenizer files, a
// README, generation_config.json) is kept.
bool export_replaces(const std::string& name) {
  auto ends = [&](std::string_view sfx) {
    return name.size() >= sfx.size() && name.compare(name.size() - sfx.size(), sfx.size(), sfx) == 0;
  };
  return name == "config.json" || ends(".safetensors") || ends(".safetensors.index.json") ||
         name.find(".tmp-") != std::string::npos;
}

std::string shard_name(std::size_t k, std::size_t n) {
  char b[64];
  std::snprintf(b, sizeof b, "model-%05zu-of-%05zu.safetensors", k, n);
  return b;
}

// The rotary settings of a llama-family shape as transformers names them (without rope_theta);
// {"rope_type": "default"} when there is no scaling.
json rope_json(const ModelShape& s) {
  const ops::RopeScaling sc = llama_rope_scaling(s);
  json r = {{"rope_type", sc.type == "llama3" && s.rope_factor == 1 ? "default" : sc.type}};
  const std::string& t = r["rope_type"].get_ref<const std::string&>();
  if (t == "default") return r;
  r["factor"] = s.rope_factor;
  if (t == "llama3")
    r.update({{"low_freq_factor", s.rope_low_freq_factor}, {"high_freq_factor", s.rope_high_freq_factor}});
  if (t == "llama3" || t == "yarn" || t == "longrope")  // a whole number, as transformers writes it
    r["original_max_position_embeddings"] = s.rope_original_max == std::floor(s.rope_original_max)
                                                ? json(static_cast<std::int64_t>(s.rope_original_max))
                                                : json(s.rope_original_max);
  if ((t == "yarn" || t == "longrope") && s.rope.attention_factor > 0) r["attention_factor"] = s.rope.attention_factor;
  if (t == "yarn") {
    r.update({{"beta_fast", s.rope.beta_fast}, {"beta_slow", s.rope.beta_slow}, {"truncate", s.rope.truncate}});
    if (s.rope.mscale != 0) r["mscale"] = s.rope.mscale;
    if (s.rope.mscale_all_dim != 0) r["mscale_all_dim"] = s.rope.mscale_all_dim;
  }
  if (t == "longrope") r.update({{"short_factor", s.rope.short_factor}, {"long_factor", s.rope.long_factor}});
  return r;
}

// config.json of a llama-family model, as transformers writes LlamaConfig, MistralConfig and
// Qwen2Config: the model_type the folder it came from had (else qwen2 with q/k/v biases, llama
// without). The rotary settings in the form that folder used: rope_parameters (transformers 5) or
// rope_theta and rope_scaling (earlier); a model not from a folder gets both, which every version
// reads the same.
json llama_config(const ModelShape& s, const char* torch_dtype) {
  const std::string type = !s.hf.model_type.empty() ? s.hf.model_type : s.qkv_bias ? "qwen2" : "llama";
  const char* arch = type == "qwen2" ? "Qwen2ForCausalLM" : type == "mistral" ? "MistralForCausalLM" : "LlamaForCausalLM";
  json c = {{"architectures", {arch}},
            {"model_type", type},
            {"hidden_size", s.d_model},
            {"intermediate_size", s.d_ff},
            {"num_attention_heads", s.n_head},
            {"num_key_value_heads", s.kv_heads()},
            {"num_hidden_layers", s.n_layer},
            {"vocab_size", s.vocab_size},
            {"max_position_embeddings", s.max_positions > 0 ? s.max_positions : s.seq_len},
            {"rms_norm_eps", s.norm_eps},
            {"tie_word_embeddings", s.tie_embeddings},
            {"hidden_act", "silu"},
            {"torch_dtype", torch_dtype}};
  if (type == "llama") c["attention_bias"] = false, c["mlp_bias"] = false;
  if (type == "mistral") c["sliding_window"] = s.sliding_window > 0 ? json(s.sliding_window) : json(nullptr);
  if (type == "qwen2") {
    const bool use = s.hf.max_window_layers >= 0;
    c["use_sliding_window"] = use;
    c["sliding_window"] = use ? json(s.hf.window) : json(nullptr);
    c["max_window_layers"] = use ? s.hf.max_window_layers : s.n_layer;
    // Windowed layers from another index than max_window_layers came from layer_types: written back.
    if (s.sliding_window > 0 && s.window_from != s.hf.max_window_layers) {
      json lt = json::array();
      for (int l = 0; l < s.n_layer; ++l) lt.push_back(l >= s.window_from ? "sliding_attention" : "full_attention");
      c["layer_types"] = lt;
    }
  }
  const json rope = rope_json(s);
  const bool both = s.hf.model_type.empty();
  if (!s.hf.legacy_rope || both) {
    json p = {{"rope_theta", s.rope_theta}};
    p.update(rope);
    c["rope_parameters"] = p;
  }
  if (s.hf.legacy_rope || both) {
    c["rope_theta"] = s.rope_theta;
    c["rope_scaling"] = rope["rope_type"] == "default" ? json(nullptr) : rope;
  }
  return c;
}

// config.json of a GPT-2 model, as transformers writes GPT2Config: the positions are the units' wpe
// rows (model.seq_len); n_ctx repeats n_positions for readers that take the older name.
json gpt2_config(const ModelShape& s, const char* torch_dtype) {
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"n_embd", s.d_model},
          {"n_layer", s.n_layer},
          {"n_head", s.n_head},
          {"n_inner", nullptr},
          {"n_positions", s.seq_len},
          {"n_ctx", s.seq_len},
          {"vocab_size", s.vocab_size},
          {"activation_function", "gelu_new"},
          {"layer_norm_epsilon", 1e-5},
          {"scale_attn_weights", true},
          {"scale_attn_by_inverse_layer_idx", false},
          {"reorder_and_upcast_attn", false},
          {"tie_word_embeddings", true},
          {"torch_dtype", torch_dtype}};
}

}  // namespace

bool is_hf_folder(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::exists(fs::path(path) / "config.json", ec);
}

namespace {
// config.json's integer `key`: a positive integer no larger than `hi` (one of shape_limits), or a
// ConfigError naming the file and the key — checked before anything is sized from it.
int positive_int(const json& c, const std::string& src, const char* key, std::int64_t hi) {
  const json& v = c[key];
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(hi)) ||
      v.get<std::int64_t>() <= 0 || v.get<std::int64_t>() > hi)
    throw ConfigError(src + ": " + key + ": expected a positive integer of at most " + std::to_string(hi) + ", got " +
                      v.dump());
  return static_cast<int>(v.get<std::int64_t>());
}

// GPT2Config's keys. zinf's GPT-2 is the original one: MLP width 4·n_embd, the tanh GELU, LayerNorm
// eps 1e-5, attention scaled by 1/sqrt(head width) and nothing else, the LM head tied to wte.
ModelShape gpt2_shape_of(const json& c, const std::string& src, int seq_len) {
  auto fail = [&](const std::string& key, const std::string& why) -> ConfigError {
    return ConfigError(src + ": " + key + ": " + why);
  };
  auto has = [&](const char* key) { return c.contains(key) && !c[key].is_null(); };
  auto get_int = [&](const char* key, std::int64_t hi) -> int {
    if (!has(key)) throw fail(key, "missing");
    return positive_int(c, src, key, hi);
  };
  auto get_bool = [&](const char* key, bool def) {
    if (!has(key)) return def;
    if (!c[key].is_boolean()) throw fail(key, "expected true or false, got " + c[key].dump());
    return c[key].get<bool>();
  };
  ModelShape s;
  s.family = ModelFamily::gpt2;
  s.d_model = get_int("n_embd", shape_limits::width);
  s.n_layer = get_int("n_layer", shape_limits::layers);
  s.n_head = get_int("n_head", shape_limits::heads);
  s.vocab_size = get_int("vocab_size", shape_limits::vocab);
  // n_ctx is the older name of n_positions; transformers reads n_positions.
  const int positions = get_int(has("n_positions") || !has("n_ctx") ? "n_positions" : "n_ctx", shape_limits::positions);
  if (s.d_model % s.n_head != 0) throw fail("n_embd", "not a multiple of n_head");
  if (has("n_inner") && c["n_inner"] != json(4 * std::int64_t{s.d_model}))
    throw fail("n_inner", c["n_inner"].dump() + " is not 4 * n_embd (" + std::to_string(4 * std::int64_t{s.d_model}) +
                              "), the only MLP width zinf's GPT-2 has");
  if (has("activation_function")) {  // both names are the tanh approximation zinf computes
    const json& a = c["activation_function"];
    if (a != "gelu_new" && a != "gelu_pytorch_tanh")
      throw fail("activation_function", a.dump() + " is not gelu_new (the tanh GELU zinf's GPT-2 computes)");
  }
  if (has("layer_norm_epsilon")) {
    const json& e = c["layer_norm_epsilon"];
    if (!e.is_number() || std::abs(e.get<double>() - 1e-5) > 1e-12)
      throw fail("layer_norm_epsilon", e.dump() + " is not 1e-5, the LayerNorm epsilon zinf's GPT-2 uses");
  }
  if (!get_bool("scale_attn_weights", true))
    throw fail("scale_attn_weights", "false is not supported (zinf scales attention by 1/sqrt(head width))");
  if (get_bool("scale_attn_by_inverse_layer_idx", false))
    throw fail("scale_attn_by_inverse_layer_idx", "true is not supported (no per-layer attention scaling)");
  if (get_bool("reorder_and_upcast_attn", false))
    throw fail("reorder_and_upcast_attn", "true is not supported (zinf's attention has one order of operations)");
  if (get_bool("add_cross_attention", false))
    throw fail("add_cross_attention", "true is not supported (zinf's GPT-2 is a decoder without cross-attention)");
  if (!get_bool("tie_word_embeddings", true))
    throw fail("tie_word_embeddings", "false is not supported (zinf's GPT-2 ties the LM head to wte)");
  s.seq_len = seq_len > 0 ? seq_len : positions;
  if (s.seq_len > positions)
    throw ConfigError(src + ": n_positions is " + std::to_string(positions) + ", below model.seq_len " +
                      std::to_string(s.seq_len));
  return s;
}

bool present(const json& o, const char* key) { return o.contains(key) && !o[key].is_null(); }

// The keys of rope_parameters / rope_scaling zinf reads; any other one is refused, since it would
// change the rotary positions in a way zinf does not compute.
const std::set<std::string>& rope_keys() {
  static const std::set<std::string> k = {"rope_type", "type", "rope_theta", "factor", "low_freq_factor",
                                          "high_freq_factor", "original_max_position_embeddings", "attention_factor",
                                          "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate",
                                          "short_factor", "long_factor", "partial_rotary_factor"};
  return k;
}

// The rotary settings: transformers 5 writes them as rope_parameters (rope_theta inside), earlier
// versions as rope_theta and rope_scaling at the top. Both are read; where a file has both, they
// must agree. What transformers computes from them is in model/host_math.h (RopeScaling).
void read_rope(const json& c, const std::string& src, ModelShape& s) {
  auto fail = [&](const std::string& key, const std::string& why) -> ConfigError {
    return ConfigError(src + ": " + key + ": " + why);
  };
  const bool v5 = present(c, "rope_parameters"), v4 = present(c, "rope_scaling");
  for (const char* k : {"rope_parameters", "rope_scaling"})
    if (present(c, k) && !c[k].is_object()) throw fail(k, "expected an object or null, got " + c[k].dump());
  // The merged view, each key from whichever of the two holds it; a key both hold must be equal.
  json p = json::object();
  const char* where = "rope_parameters";
  if (v5) {
    for (auto it = c["rope_parameters"].begin(); it != c["rope_parameters"].end(); ++it)
      if (it.value().is_object())  // transformers' per-layer-type form (one dict per attention kind)
        throw fail("rope_parameters." + it.key(), "rotary settings per layer type are not supported");
    p = c["rope_parameters"];
  }
  if (v4)
    for (auto it = c["rope_scaling"].begin(); it != c["rope_scaling"].end(); ++it) {
      if (p.contains(it.key()) && p[it.key()] != it.value())
        throw fail("rope_scaling." + it.key(), it.value().dump() + " disagrees with rope_parameters." + it.key() + " " +
                                                   p[it.key()].dump() + "; remove one of the two");
      p[it.key()] = it.value();
    }
  if (!v5) where = "rope_scaling";
  if (present(c, "rope_theta")) {
    const json& th = c["rope_theta"];  // a bad number is named as such before any comparison
    if (!th.is_number()) throw fail("rope_theta", "expected a number, got " + th.dump());
    if (!std::isfinite(th.get<double>()) || th.get<double>() <= 0)
      throw fail("rope_theta", "expected a positive number, got " + th.dump());
    if (present(p, "rope_theta") && p["rope_theta"] != c["rope_theta"])
      throw fail("rope_theta", c["rope_theta"].dump() + " disagrees with rope_parameters.rope_theta " +
                                   p["rope_theta"].dump() + "; remove one of the two");
    p["rope_theta"] = c["rope_theta"];
  }
  if (present(c, "partial_rotary_factor")) p["partial_rotary_factor"] = c["partial_rotary_factor"];
  s.hf.legacy_rope = !v5 && (v4 || present(c, "rope_theta"));
  for (auto it = p.begin(); it != p.end(); ++it)
    if (!rope_keys().count(it.key()))
      throw fail(std::string(where) + "." + it.key(), "is not a rotary setting zinf computes; it would change the model");
  const std::string pre = std::string(where) + ".";
  auto num = [&](const char* key, std::optional<double> def) -> double {
    if (!present(p, key)) {
      if (def) return *def;
      throw fail(pre + key, "missing");
    }
    const json& v = p[key];
    const std::string name = std::string(key) == "rope_theta" && !v5 ? key : pre + key;
    if (!v.is_number()) throw fail(name, "expected a number, got " + v.dump());
    const double x = v.get<double>();
    if (!std::isfinite(x) || x <= 0) throw fail(name, "expected a positive number, got " + v.dump());
    return x;
  };
  s.rope_theta = num("rope_theta", 10000.0);
  if (present(p, "partial_rotary_factor") &&
      (!p["partial_rotary_factor"].is_number() || p["partial_rotary_factor"].get<double>() != 1))
    throw fail("partial_rotary_factor",
               p["partial_rotary_factor"].dump() + " is not supported (zinf rotates the whole head width)");
  const json& kind_v = present(p, "rope_type") ? p["rope_type"] : present(p, "type") ? p["type"] : json("default");
  if (!kind_v.is_string()) throw fail(pre + "rope_type", "expected a string, got " + kind_v.dump());
  const std::string kind = kind_v.get<std::string>();
  RopeParams& r = s.rope;
  r.type = kind;
  // transformers takes original_max_position_embeddings from the top of config.json first, then
  // from the rotary settings, then max_position_embeddings.
  const double omax = present(c, "original_max_position_embeddings")
                          ? static_cast<double>(positive_int(c, src, "original_max_position_embeddings",
                                                             std::numeric_limits<int>::max()))
                          : num("original_max_position_embeddings", static_cast<double>(s.max_positions));
  if (kind == "default") return;
  if (kind == "linear" || kind == "dynamic") {
    s.rope_factor = num("factor", std::nullopt);
    return;
  }
  s.rope_original_max = omax;
  if (kind == "llama3") {
    s.rope_factor = num("factor", std::nullopt);
    s.rope_low_freq_factor = num("low_freq_factor", 1.0);
    s.rope_high_freq_factor = num("high_freq_factor", 4.0);
    if (s.rope_factor < 1) throw fail(pre + "factor", "expected at least 1, got " + p["factor"].dump());
    if (s.rope_factor != 1 && s.rope_high_freq_factor <= s.rope_low_freq_factor)
      throw fail(pre + "high_freq_factor", "must exceed low_freq_factor");
    return;
  }
  if (kind != "yarn" && kind != "longrope")
    throw fail(pre + "rope_type",
               "'" + kind + "' is not supported (default, linear, dynamic, yarn, longrope, llama3 are)");
  // Both derive a missing factor from the two context lengths, as transformers does.
  s.rope_factor = num("factor", s.max_positions / omax);
  r.attention_factor = num("attention_factor", 0.0);
  if (kind == "yarn") {
    // transformers reads these with `or`: 0 (or absent) is the default.
    auto or_default = [&](const char* key, double def) {
      if (present(p, key) && p[key].is_number() && p[key].get<double>() == 0) return def;
      return num(key, def);
    };
    r.beta_fast = or_default("beta_fast", 32), r.beta_slow = or_default("beta_slow", 1);
    r.mscale = or_default("mscale", 0), r.mscale_all_dim = or_default("mscale_all_dim", 0);
    if (present(p, "truncate")) {
      if (!p["truncate"].is_boolean()) throw fail(pre + "truncate", "expected true or false, got " + p["truncate"].dump());
      r.truncate = p["truncate"].get<bool>();
    }
    return;
  }
  const std::size_t half = static_cast<std::size_t>(s.head_dim() / 2);
  for (auto [key, dst] : {std::pair{"short_factor", &r.short_factor}, {"long_factor", &r.long_factor}}) {
    if (!present(p, key) || !p[key].is_array() || p[key].size() != half)
      throw fail(pre + key, "expected a list of " + std::to_string(half) + " numbers (head width / 2), got " +
                                (present(p, key) ? p[key].dump() : std::string("nothing")));
    for (const json& v : p[key]) {
      if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() <= 0)
        throw fail(pre + key, "expected positive numbers, got " + v.dump());
      dst->push_back(v.get<double>());
    }
  }
}

// Mistral's and Qwen2's sliding-window attention. Mistral: every layer, sliding_window (absent:
// 4096, transformers' default; null: none). Qwen2: with use_sliding_window, the layers from
// max_window_layers on, or those layer_types names sliding_attention (which must then be the last
// ones: zinf windows the layers from one index on).
void read_sliding_window(const json& c, const std::string& src, const std::string& type, ModelShape& s) {
  auto fail = [&](const std::string& key, const std::string& why) -> ConfigError {
    return ConfigError(src + ": " + key + ": " + why);
  };
  if (type == "llama") return;  // LlamaConfig has no window
  // A window: a positive integer; one past an int is longer than any sequence zinf runs and is held
  // as the largest int.
  auto window_of = [&]() {
    const json& w = c["sliding_window"];
    if (w.is_number_unsigned() && w.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<int>::max()))
      return std::numeric_limits<int>::max();
    return positive_int(c, src, "sliding_window", std::numeric_limits<int>::max());
  };
  bool sliding = false;
  int from = 0;  // the first windowed layer
  if (type == "mistral") {
    sliding = !c.contains("sliding_window") || !c["sliding_window"].is_null();
  } else {
    if (present(c, "use_sliding_window") && !c["use_sliding_window"].is_boolean())
      throw fail("use_sliding_window", "expected true or false, got " + c["use_sliding_window"].dump());
    const bool use = c.value("use_sliding_window", false) && present(c, "sliding_window");
    int first = 28;  // transformers' default max_window_layers
    if (present(c, "max_window_layers")) {
      const json& m = c["max_window_layers"];
      if (!m.is_number_integer() || m.get<std::int64_t>() < 0)
        throw fail("max_window_layers", "expected a non-negative integer, got " + m.dump());
      first = static_cast<int>(std::min<std::int64_t>(m.get<std::int64_t>(), s.n_layer));
    }
    from = first;
    if (present(c, "layer_types")) {
      const json& lt = c["layer_types"];
      if (!lt.is_array() || lt.size() != static_cast<std::size_t>(s.n_layer))
        throw fail("layer_types", "expected a list of num_hidden_layers (" + std::to_string(s.n_layer) +
                                      ") attention kinds, got " + lt.dump());
      from = s.n_layer;
      for (std::size_t l = 0; l < lt.size(); ++l) {
        const json& k = lt[l];
        if (k != "full_attention" && k != "sliding_attention")
          throw fail("layer_types", k.dump() + " is not full_attention or sliding_attention");
        if (k == "sliding_attention" && from == s.n_layer) from = static_cast<int>(l);
        if (k == "full_attention" && from < s.n_layer && use)
          throw fail("layer_types",
                     "a full_attention layer after a sliding_attention one: zinf windows the layers "
                     "from one index on");
      }
      sliding = use && from < s.n_layer;
    } else {
      sliding = use && first < s.n_layer;
    }
    s.hf.max_window_layers = use ? first : -1;
    if (use) s.hf.window = window_of();
  }
  if (!sliding) return;
  s.sliding_window = present(c, "sliding_window") ? window_of() : 4096;
  s.window_from = from;
}

ModelShape hf_shape_of(const json& c, const std::string& src, int seq_len) {
  auto fail = [&](const std::string& key, const std::string& why) -> ConfigError {
    return ConfigError(src + ": " + key + ": " + why);
  };
  auto get_int = [&](const char* key, std::int64_t hi, std::optional<std::int64_t> def = std::nullopt) -> int {
    if (!c.contains(key) || c[key].is_null()) {
      if (def) return static_cast<int>(*def);
      throw fail(key, "missing");
    }
    return positive_int(c, src, key, hi);
  };
  // A positive finite number: every real number in config.json (eps, theta, the scaling factors) is one.
  auto positive = [&](const json& o, const std::string& key, double def, const std::string& prefix = "") {
    if (!o.contains(key) || o[key].is_null()) return def;
    if (!o[key].is_number()) throw fail(prefix + key, "expected a number, got " + o[key].dump());
    const double v = o[key].get<double>();
    if (!std::isfinite(v) || v <= 0) throw fail(prefix + key, "expected a positive number, got " + o[key].dump());
    return v;
  };
  auto get_num = [&](const char* key, double def) { return positive(c, key, def); };
  auto get_bool = [&](const char* key, bool def) {
    if (!c.contains(key) || c[key].is_null()) return def;
    if (!c[key].is_boolean()) throw fail(key, "expected true or false, got " + c[key].dump());
    return c[key].get<bool>();
  };
  if (c.contains("model_type") && !c["model_type"].is_string())
    throw fail("model_type", "expected a string, got " + c["model_type"].dump());
  const std::string type = c.value("model_type", std::string());
  if (type == "gpt2") return gpt2_shape_of(c, src, seq_len);
  if (type != "llama" && type != "mistral" && type != "qwen2")
    throw fail("model_type",
               "'" + type + "' is not a family zinf trains (gpt2, or the llama family: llama, mistral, qwen2)");
  ModelShape s;
  s.family = ModelFamily::llama;
  s.d_model = get_int("hidden_size", shape_limits::width);
  s.d_ff = get_int("intermediate_size", shape_limits::ff_width);
  s.n_head = get_int("num_attention_heads", shape_limits::heads);
  s.n_kv_head = get_int("num_key_value_heads", shape_limits::heads, s.n_head);
  s.n_layer = get_int("num_hidden_layers", shape_limits::layers);
  s.vocab_size = get_int("vocab_size", shape_limits::vocab);
  // Positions the model was trained for may exceed what zinf trains at once; only the sequence it
  // is asked to run at is held to shape_limits::positions (model.seq_len).
  s.max_positions = get_int("max_position_embeddings", std::numeric_limits<int>::max(), 2048);
  s.norm_eps = get_num("rms_norm_eps", 1e-6);
  if (s.norm_eps >= 1)
    throw fail("rms_norm_eps", "expected a small positive number (e.g. 1e-5), got " + c["rms_norm_eps"].dump());
  s.tie_embeddings = get_bool("tie_word_embeddings", false);
  s.qkv_bias = type == "qwen2";
  if (s.d_model % s.n_head != 0) throw fail("hidden_size", "not a multiple of num_attention_heads");
  if (s.n_head % s.n_kv_head != 0) throw fail("num_key_value_heads", "does not divide num_attention_heads");
  if (c.contains("head_dim") && !c["head_dim"].is_null() && c["head_dim"] != s.d_model / s.n_head)
    throw fail("head_dim",
               c["head_dim"].dump() + " differs from hidden_size / num_attention_heads; zinf needs them equal");
  if (c.contains("hidden_act") && !c["hidden_act"].is_null() && c["hidden_act"] != "silu")
    throw fail("hidden_act", c["hidden_act"].dump() + " is not silu (SwiGLU)");
  if (get_bool("mlp_bias", false)) throw fail("mlp_bias", "MLP biases are not supported");
  if (type == "llama" && get_bool("attention_bias", false))
    throw fail("attention_bias", "attention biases (q, k, v and o) are not supported");
  read_rope(c, src, s);
  s.hf.model_type = type;
  s.seq_len = seq_len > 0 ? seq_len : std::min(2048, s.max_positions);
  if (s.seq_len > s.max_positions)
    throw ConfigError(src + ": max_position_embeddings is " + std::to_string(s.max_positions) +
                      ", below model.seq_len " + std::to_string(s.seq_len));
  read_sliding_window(c, src, type, s);
  if ((s.head_dim()) % 2 != 0) throw fail("num_attention_heads", "the head width must be even for rotary positions");
  return s;
}
}  // namespace

ModelShape hf_shape(const std::string& dir, int seq_len) {
  const std::string src = (fs::path(dir) / "config.json").string();
  return hf_shape_from_json(read_input_text(src, "model.init_from"), src, seq_len);
}

ModelShape hf_shape_from_json(std::string_view text, const std::string& src, int seq_len) {
  const json c = parse_json_object(text, src);
  try {
    return hf_shape_of(c, src, seq_len);
  } catch (const json::exception& e) {  // a value of an unexpected type that no check above caught
    throw ConfigError(src + ": " + library_message(e));
  }
}

std::vector<ModelTensor> llama_hf_tensors(const ModelShape& s) {
  const std::int64_t C = s.d_model, V = s.vocab_size, KVD = std::int64_t{s.kv_heads()} * s.head_dim(), F = s.d_ff;
  std::vector<ModelTensor> v;
  v.push_back({"model.embed_tokens.weight", {V, C}, 0, 0, false});
  for (int l = 0; l < s.n_layer; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const std::size_t u = static_cast<std::size_t>(l) + 1;
    std::size_t o = 0;
    auto add = [&](const std::string& name, std::vector<std::int64_t> shape, bool transposed) {
      std::int64_t n = 1;
      for (auto d : shape) n *= d;
      v.push_back({p + name, std::move(shape), u, o, transposed});
      o += static_cast<std::size_t>(n);
    };
    add("input_layernorm.weight", {C}, false);
    add("self_attn.q_proj.weight", {C, C}, true);
    if (s.qkv_bias) add("self_attn.q_proj.bias", {C}, false);
    add("self_attn.k_proj.weight", {KVD, C}, true);
    if (s.qkv_bias) add("self_attn.k_proj.bias", {KVD}, false);
    add("self_attn.v_proj.weight", {KVD, C}, true);
    if (s.qkv_bias) add("self_attn.v_proj.bias", {KVD}, false);
    add("self_attn.o_proj.weight", {C, C}, true);
    add("post_attention_layernorm.weight", {C}, false);
    add("mlp.gate_proj.weight", {F, C}, true);
    add("mlp.up_proj.weight", {F, C}, true);
    add("mlp.down_proj.weight", {C, F}, true);
  }
  const std::size_t fin = static_cast<std::size_t>(s.n_layer) + 1;
  v.push_back({"model.norm.weight", {C}, fin, 0, false});
  if (!s.tie_embeddings) v.push_back({"lm_head.weight", {V, C}, fin, static_cast<std::size_t>(C), false});
  return v;
}

std::vector<ModelTensor> gpt2_hf_tensors(const ModelShape& s, std::int64_t positions, const std::string& prefix) {
  std::vector<ModelTensor> v = gpt2_tensors(s);
  for (auto& t : v) {
    if (t.name == "wpe.weight") t.shape[0] = positions;  // the last tensor of unit 0: nothing after it moves
    t.name = prefix + t.name;
  }
  return v;
}

std::vector<std::string> hf_index_files(std::string_view text, const std::string& source) {
  const json j = parse_json_object(text, source);
  if (!j.contains("weight_map") || !j["weight_map"].is_object())
    throw ConfigError(source + ": weight_map: missing or not an object");
  std::set<std::string> files;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (!it.value().is_string())
      throw ConfigError(source + ": weight_map." + it.key() + ": expected a file name, got " + it.value().dump());
    const std::string f = it.value().get<std::string>();
    // Shards lie beside the index: a path elsewhere is refused, not followed.
    if (f.empty() || f == "." || f == ".." || f.find('/') != std::string::npos)
      throw ConfigError(source + ": weight_map." + it.key() + ": '" + f + "' is not the name of a file in the folder");
    files.insert(f);
  }
  if (files.empty()) throw ConfigError(source + ": weight_map is empty");
  return {files.begin(), files.end()};
}

HfModelReader::HfModelReader(const std::string& dir) : dir_(dir) {
  const fs::path index = fs::path(dir) / "model.safetensors.index.json", single = fs::path(dir) / "model.safetensors";
  std::vector<std::string> names;
  std::error_code ec;
  const bool has_index = fs::exists(index, ec), has_single = fs::exists(single, ec);
  // Hugging Face's loaders (transformers' from_pretrained) take model.safetensors when it is
  // present and read an index only without it; zinf does the same, and says which it read.
  if (has_single) {
    names.push_back("model.safetensors");
    weights_ =
        has_index
            ? "model.safetensors (model.safetensors.index.json beside it is ignored, as Hugging Face's loaders do)"
            : "model.safetensors";
  } else if (has_index) {
    names = hf_index_files(read_input_text(index.string(), "model.init_from"), index.string());
    weights_ = "model.safetensors.index.json, " + std::to_string(names.size()) + " shard(s)";
  } else {
    throw ConfigError(dir + ": holds neither model.safetensors nor model.safetensors.index.json");
  }
  files_.reserve(names.size());
  for (const auto& n : names) files_.emplace_back((fs::path(dir) / n).string(), "model.init_from");
  // GPT-2 files name their tensors with or without the "transformer." of GPT2LMHeadModel (the
  // original upload has none, save_pretrained writes it); the index holds them without it.
  for (std::size_t i = 0; i < files_.size(); ++i)
    for (const auto& t : files_[i].header().tensors) {
      const std::string key = t.name.rfind("transformer.", 0) == 0 ? t.name.substr(12) : t.name;
      if (const Where* w = find(key))
        throw ConfigError(dir + ": tensor " + key + " is in the folder twice (" + w->tensor->name + " in " +
                          fs::path(files_[w->file].path()).filename().string() + ", " + t.name + " in " + names[i] +
                          ")");
      index_.emplace(key, Where{i, &t});
    }
}

std::int64_t HfModelReader::wpe_rows(const ModelShape& s) const {
  const Where* w = find("wpe.weight");
  if (w && w->tensor->shape.size() == 2 && w->tensor->shape[0] >= s.seq_len) return w->tensor->shape[0];
  return s.seq_len;  // absent or too short: the check reports it against the rows the model needs
}

std::vector<ModelTensor> HfModelReader::layout(const ModelShape& s) const {
  return s.family == ModelFamily::gpt2 ? gpt2_hf_tensors(s, wpe_rows(s)) : llama_hf_tensors(s);
}

std::string HfModelReader::file_of(const Where& w) const {
  return dir_ + "/" + fs::path(files_[w.file].path()).filename().string();
}

const HfModelReader::Where* HfModelReader::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &it->second;
}

void HfModelReader::check(const ModelShape& s) const {
  std::vector<std::string> names;
  for (const auto& [n, w] : index_) names.push_back(n);
  std::sort(names.begin(), names.end());
  auto shape_of = [&](const std::string& name) -> const std::vector<std::int64_t>* {
    const Where* w = find(name);
    return w ? &w->tensor->shape : nullptr;
  };
  auto ends = [](const std::string& n, std::string_view sfx) {
    return n.size() >= sfx.size() && n.compare(n.size() - sfx.size(), sfx.size(), sfx) == 0;
  };
  if (s.family == ModelFamily::gpt2) {
    // The causal-mask buffers older GPT-2 files carry, and the LM head some store though it is wte.
    auto ignorable = [&](const std::string& n) {
      return ends(n, ".attn.bias") || ends(n, ".attn.masked_bias") || n == "lm_head.weight";
    };
    check_tensor_set(dir_, layout(s), shape_of, names, ignorable,
                     "the folder must hold the GPT-2 model its config.json describes",
                     "the folder's tensors must have the shapes its config.json describes (wpe.weight: at least "
                     "model.seq_len rows)");
    if (const Where* head = find("lm_head.weight");
        head && head->tensor->shape != std::vector<std::int64_t>{s.vocab_size, s.d_model})
      throw ConfigError(file_of(*head) + ": tensor " + head->tensor->name +
                        " does not have wte.weight's shape; zinf's GPT-2 ties the LM head to wte");
    return;
  }
  auto ignorable = [&](const std::string& n) {
    const bool buffer = ends(n, "rotary_emb.inv_freq");
    return buffer || (s.tie_embeddings && n == "lm_head.weight");  // some tied files store the head anyway
  };
  check_tensor_set(
      dir_, llama_hf_tensors(s), shape_of, names, ignorable,
      "the folder must hold the model its config.json describes; zinf trains the llama family without MLP or "
      "output-projection biases",
      "the folder's tensors must have the shapes its config.json describes");
}

void HfModelReader::load_unit(const ModelShape& s, std::size_t u, float* dst) const {
  for (const auto& t : layout(s)) {
    if (t.unit != u) continue;
    const Where* w = find(t.name);
    if (!w) throw ConfigError(dir_ + ": tensor " + t.name + " is missing");
    std::size_t n = 1;
    for (auto d : t.shape) n *= static_cast<std::size_t>(d);
    if (t.name == "wpe.weight" && t.shape[0] > s.seq_len) {  // training uses the first seq_len positions
      std::vector<float> all(n);
      files_[w->file].read(*w->tensor, all.data(), false);
      n = static_cast<std::size_t>(s.seq_len) * static_cast<std::size_t>(s.d_model);
      std::copy(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(n), dst + t.offset);
    } else {
      files_[w->file].read(*w->tensor, dst + t.offset, t.transposed);
    }
    check_finite_tensor(dst + t.offset, n, file_of(*w), w->tensor->name);
  }
  // A GPT-2 file that stores the LM head must store wte there: zinf has no separate head to put it in.
  const Where* head = s.family == ModelFamily::gpt2 && u == 0 ? find("lm_head.weight") : nullptr;
  if (head) {
    const std::size_t n = static_cast<std::size_t>(s.vocab_size) * static_cast<std::size_t>(s.d_model);
    std::vector<float> h(n);
    files_[head->file].read(*head->tensor, h.data(), false);
    for (std::size_t i = 0; i < n; ++i)
      if (std::memcmp(&h[i], dst + i, sizeof(float)) != 0)
        throw ConfigError(
            file_of(*head) + ": tensor " + head->tensor->name + " differs from wte.weight (at row " +
                std::to_string(i / static_cast<std::size_t>(s.d_model)) + ")",
            "zinf's GPT-2 ties the LM head to the token embedding; a model with its own head cannot load");
  }
}

void write_hf_folder(const std::string& dir, const ModelShape& s, const std::vector<std::vector<float>>& units,
                     StDtype dtype, std::uint64_t shard_bytes) {
  OutputFolder folder(dir, export_replaces, "--output");
  const fs::path tmp = folder.temp_path();
  const std::uint64_t es = dtype == StDtype::f32 ? 4 : 2;
  const bool gpt2 = s.family == ModelFamily::gpt2;
  // GPT-2 under the names GPT2LMHeadModel.save_pretrained writes; the units hold seq_len positions.
  const auto layout = gpt2 ? gpt2_hf_tensors(s, s.seq_len, "transformer.") : llama_hf_tensors(s);
  // Shards in file order, each up to shard_bytes (a larger tensor gets one of its own).
  std::vector<std::vector<ModelTensor>> shards(1);
  std::uint64_t in_shard = 0, total = 0;
  for (const auto& t : layout) {
    std::uint64_t n = es;
    for (auto d : t.shape) n *= static_cast<std::uint64_t>(d);
    if (in_shard > 0 && in_shard + n > shard_bytes) shards.emplace_back(), in_shard = 0;
    shards.back().push_back(t);
    in_shard += n;
    total += n;
  }
  // A failure names the folder the user asked for, not the temporary one it happened in.
  std::string writing;
  try {
    json weight_map = json::object();
    for (std::size_t k = 0; k < shards.size(); ++k) {
      const std::string name = shards.size() == 1 ? "model.safetensors" : shard_name(k + 1, shards.size());
      writing = name;
      write_model_safetensors((tmp / name).string(), shards[k], units, dtype);
      for (const auto& t : shards[k]) weight_map[t.name] = name;
    }
    writing = "model.safetensors.index.json";
    if (shards.size() > 1)
      write_file((tmp / "model.safetensors.index.json").string(),
                 json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(2) + "\n");
    const char* torch_dtype = dtype == StDtype::f32 ? "float32" : dtype == StDtype::f16 ? "float16" : "bfloat16";
    const json c = gpt2 ? gpt2_config(s, torch_dtype) : llama_config(s, torch_dtype);
    writing = "config.json";
    write_file((tmp / "config.json").string(), c.dump(2) + "\n");
  } catch (const IoError& e) {
    throw IoError("--output " + dir + ": writing " + writing + " failed (" + std::strerror(e.error_number()) + "); " +
                      dir + " is as it was",
                  e.error_number());
  }
  folder.commit();
}

}  // namespace zinf
