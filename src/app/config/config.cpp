// config.cpp — the strict reader of ds_config.json plus zinf's sections.
//
// Every key zinf reads is read exactly once, here, with its default, its range and its "auto" rule;
// this file is the one source of truth for defaults. Each Section remembers the keys it was asked
// for, so finish() can reject anything else and suggest the nearest valid key. What was read is
// mirrored into `out`, which becomes Config::resolved_json (the "effective config" printed at start).
#include "app/config/config.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <limits>
#include <optional>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "io/files.h"
#include "io/hf.h"
#include "io/json_keys.h"
#include "model/shape.h"
#include "zinf/error.h"
#include "zinf/gradient_streaming.h"

namespace zinf {
namespace {

using json = nlohmann::json;

constexpr std::int64_t kMaxI64 = std::numeric_limits<std::int64_t>::max();

std::string lower(std::string_view s) {
  std::string r(s);
  std::transform(r.begin(), r.end(), r.begin(), [](unsigned char c) { return std::tolower(c); });
  return r;
}

std::string show(const json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

// A number as a user wrote it: integers without an exponent (1048576, not 1.04858e+06).
std::string num(double d) {
  if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 1e18) return std::to_string(static_cast<long long>(d));
  std::ostringstream os;
  os << std::setprecision(10) << d;
  return os.str();
}

// Keys whose "auto" zinf cannot resolve, collected over the whole config so that one error names
// them all, each with a value to paste (zinf's default for it).
struct Unresolved {
  std::vector<std::pair<std::string, std::string>> keys;  // JSON path, suggested value
};

// How a key treats the string "auto" (as Hugging Face's Trainer writes it): the value zinf resolves
// it to, or none — then it is reported with every other unresolved "auto" at the end of the parse.
struct AutoRule {
  std::optional<json> value;
  static AutoRule to(json v) { return {std::move(v)}; }
};
const AutoRule kNoAuto{};

class Section {
 public:
  Section(std::string source, std::vector<std::string>* notes, Unresolved* autos, const json* obj, std::string path,
          json* out)
      : source_(std::move(source)), notes_(notes), autos_(autos), obj_(obj), path_(std::move(path)), out_(out) {}

  [[noreturn]] void fail(std::string_view key, const std::string& why) const {
    throw ConfigError(source_ + ": " + join(key) + ": " + why);
  }
  std::string join(std::string_view key) const {
    if (path_.empty()) return std::string(key);
    if (key.empty()) return path_;
    return path_ + "." + std::string(key);
  }
  bool present(std::string_view key) {
    known_.insert(std::string(key));
    return obj_ && obj_->contains(key) && !(*obj_)[std::string(key)].is_null();
  }
  const json* raw(std::string_view key) {
    if (!present(key)) return nullptr;
    return &(*obj_)[std::string(key)];
  }
  // The first of several alias names that is present; two present at once is an error.
  std::string pick(std::initializer_list<std::string_view> names) {
    std::string found;
    for (auto n : names) {
      if (present(n)) {
        if (!found.empty())
          fail(n, "'" + std::string(n) + "' and '" + found + "' name the same setting; give only one");
        found = std::string(n);
      }
    }
    return found.empty() ? std::string(*names.begin()) : found;
  }
  static bool is_auto(const json& v) { return v.is_string() && v.get<std::string>() == "auto"; }

  // Returns the value to interpret: the raw one, the resolved "auto", or nullptr (use the default).
  // An "auto" zinf cannot resolve is collected (with `def` as the value to suggest) and reported
  // with every other one at the end of the parse.
  const json* value(std::string_view key, const AutoRule& rule, json& scratch, const json& def) {
    const json* v = raw(key);
    if (v && is_auto(*v)) {
      if (!rule.value) {
        unresolved(key, def);
        return nullptr;
      }
      scratch = *rule.value;
      return &scratch;
    }
    return v;
  }
  void unresolved(std::string_view key, const json& suggestion) {
    autos_->keys.emplace_back(join(key), suggestion.dump());
  }

  bool get_bool(std::string_view key, bool def, const AutoRule& rule = kNoAuto) {
    json scratch;
    const json* v = value(key, rule, scratch, json(def));
    bool r = def;
    if (v) {
      if (!v->is_boolean()) fail(key, "expected true or false, got " + show(*v));
      r = v->get<bool>();
    }
    (*out_)[std::string(key)] = r;
    return r;
  }

  std::int64_t get_int(std::string_view key, std::int64_t def, std::int64_t lo, std::int64_t hi,
                       const AutoRule& rule = kNoAuto) {
    json scratch;
    const json* v = value(key, rule, scratch, json(def));
    std::int64_t r = def;
    if (v) r = as_int(key, *v);
    check_range(key, static_cast<double>(r), static_cast<double>(lo), static_cast<double>(hi));
    (*out_)[std::string(key)] = r;
    return r;
  }

  std::int64_t as_int(std::string_view key, const json& v) const {
    if (v.is_number_integer()) return v.get<std::int64_t>();
    if (v.is_number_float()) {  // DeepSpeed configs write element counts as 5e8
      double d = v.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.2e18) return static_cast<std::int64_t>(d);
    }
    fail(key, "expected an integer, got " + show(v));
  }

  double get_num(std::string_view key, double def, double lo, double hi, const AutoRule& rule = kNoAuto) {
    json scratch;
    const json* v = value(key, rule, scratch, json(def));
    double r = def;
    if (v) {
      if (!v->is_number() || v->is_boolean()) fail(key, "expected a number, got " + show(*v));
      r = v->get<double>();
      if (!std::isfinite(r)) fail(key, "expected a finite number, got " + show(*v));
    }
    check_range(key, r, lo, hi);
    (*out_)[std::string(key)] = r;
    return r;
  }

  void check_range(std::string_view key, double r, double lo, double hi) const {
    if (r < lo || r > hi) {
      std::ostringstream os;
      os << "value " << num(r) << " is out of range; expected ";
      if (hi >= 9e18)
        os << ">= " << num(lo);
      else
        os << "a value in [" << num(lo) << ", " << num(hi) << "]";
      fail(key, os.str());
    }
  }

  std::string get_str(std::string_view key, std::string def, const AutoRule& rule = kNoAuto) {
    json scratch;
    const json* v = value(key, rule, scratch, json(def));
    std::string r = std::move(def);
    if (v) {
      if (!v->is_string()) fail(key, "expected a string, got " + show(*v));
      r = v->get<std::string>();
    }
    (*out_)[std::string(key)] = r;
    return r;
  }

  template <class E>
  E get_enum(std::string_view key, E def, const std::vector<std::pair<std::string, E>>& table,
             bool case_insensitive = false) {
    E r = def;
    std::string name;
    for (auto& [n, e] : table)
      if (e == def) name = n;
    if (const json* v = raw(key)) {
      if (!v->is_string()) fail(key, "expected a string, got " + show(*v));
      std::string s = v->get<std::string>();
      bool ok = false;
      for (auto& [n, e] : table) {
        if (case_insensitive ? lower(n) == lower(s) : n == s) {
          r = e;
          name = n;
          ok = true;
        }
      }
      if (!ok) {
        std::string all, best;
        std::size_t best_d = 1000;
        for (auto& [n, e] : table) {
          all += (all.empty() ? "" : ", ") + n;
          std::size_t d = edit_distance(lower(n), lower(s));
          if (d < best_d) best_d = d, best = n;
        }
        std::string hint = best_d <= 3 ? " (did you mean " + best + "?)" : "";
        fail(key, "'" + s + "' is not one of " + all + hint);
      }
    }
    (*out_)[std::string(key)] = name;
    return r;
  }

  // allow_auto_zero: "auto" reads as 0 (the caller sizes it), and a size of 0 written out is refused —
  // it would mean no budget at all, not "auto".
  std::uint64_t get_bytes(std::string_view key, std::uint64_t def, bool allow_auto_zero) {
    std::uint64_t r = def;
    if (const json* v = raw(key)) {
      if (is_auto(*v)) {
        if (!allow_auto_zero) unresolved(key, json(def));
        r = allow_auto_zero ? 0 : def;
      } else if (v->is_string()) {
        r = parse_bytes(v->get<std::string>(), join(key));
        if (r == 0 && allow_auto_zero) fail(key, "expected a size above 0 or \"auto\", got " + show(*v));
      } else if (v->is_number() && !v->is_boolean()) {
        std::int64_t n = as_int(key, *v);
        if (n < 0 || (n == 0 && allow_auto_zero))
          fail(key, std::string("expected a size ") + (allow_auto_zero ? "above 0 or \"auto\"" : ">= 0") + ", got " +
                        show(*v));
        r = static_cast<std::uint64_t>(n);
      } else {
        fail(key, "expected a size such as \"8GiB\" or a number of bytes, got " + show(*v));
      }
    }
    if (r == 0 && allow_auto_zero)
      (*out_)[std::string(key)] = "auto";
    else
      (*out_)[std::string(key)] = r;
    return r;
  }

  Section child(std::string_view key) {
    const json* v = raw(key);
    if (v && !v->is_object()) fail(key, "expected an object, got " + show(*v));
    json& o = (*out_)[std::string(key)];
    o = json::object();
    return Section(source_, notes_, autos_, v, join(key), &o);
  }

  // A DeepSpeed key that has no meaning in zinf: accepted, with one note when present.
  void note_if_present(std::string_view key, const std::string& why) {
    if (present(key)) notes_->push_back(join(key) + ": " + why);
  }
  // A DeepSpeed feature zinf does not implement: accepted only at its default (off) value.
  void only_default(std::string_view key, const json& def, const std::string& why) {
    if (const json* v = raw(key)) {
      if (*v != def) fail(key, why);
    }
  }

  void finish() const {
    if (!obj_) return;
    for (auto it = obj_->begin(); it != obj_->end(); ++it) {
      if (known_.count(it.key())) continue;
      std::string best;
      std::size_t best_d = 1000;
      for (const auto& k : known_) {
        std::size_t d = edit_distance(lower(k), lower(it.key()));
        if (d < best_d) best_d = d, best = k;
      }
      std::size_t limit = std::max<std::size_t>(2, it.key().size() / 3);
      std::string hint = best_d <= limit ? " (did you mean " + best + "?)" : "";
      fail(it.key(), "unknown key" + hint);
    }
  }

  std::vector<std::string>* notes() const { return notes_; }
  void set_out(std::string_view key, json v) { (*out_)[std::string(key)] = std::move(v); }

 private:
  std::string source_;
  std::vector<std::string>* notes_;
  Unresolved* autos_;
  const json* obj_;
  std::string path_;
  json* out_;
  std::set<std::string> known_;
};

void apply_override(json& root, const std::string& item) {
  // JSON text is UTF-8: an argument in another encoding (a Latin-1 file name, say) could be neither
  // shown in a message nor written into the resolved config, so it is refused here.
  try {
    (void)json(item).dump();
  } catch (const json::type_error&) {
    throw ConfigError("--set " + json(item).dump(-1, ' ', false, json::error_handler_t::replace) + ": not valid UTF-8",
                      "a config holds UTF-8 text only");
  }
  auto eq = item.find('=');
  if (eq == std::string::npos || eq == 0) throw ConfigError("--set " + item + ": expected key.path=value");
  std::string path = item.substr(0, eq), text = item.substr(eq + 1);
  json value;
  try {
    value = json::parse(text);
  } catch (const json::exception&) {
    value = text;  // not JSON: a bare string such as nvme or gpt2-124m
  }
  json* node = &root;
  std::size_t start = 0;
  while (true) {
    auto dot = path.find('.', start);
    std::string key = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (key.empty()) throw ConfigError("--set " + item + ": empty key in '" + path + "'");
    if (!node->is_object())
      throw ConfigError("--set " + item + ": '" + path.substr(0, start ? start - 1 : 0) + "' is not an object");
    if (dot == std::string::npos) {
      (*node)[key] = value;
      return;
    }
    json& next = (*node)[key];
    if (next.is_null()) next = json::object();
    node = &next;
    start = dot + 1;
  }
}

// ------------------------------------------------------------------------------------------------
// Sections, in dependency order: model and train first, because "auto" elsewhere resolves from them.

void read_model(Section s, ModelConfig& m) {
  std::vector<std::pair<std::string, std::string>> presets;
  for (const auto& p : model_presets()) presets.emplace_back(p.name, p.name);
  std::string preset = s.get_enum<std::string>("preset", "gpt2-124m", presets);
  ModelShape base = find_model_preset(preset).shape;
  m.n_layer = static_cast<int>(s.get_int("n_layer", base.n_layer, 1, shape_limits::layers));
  m.n_head = static_cast<int>(s.get_int("n_head", base.n_head, 1, shape_limits::heads));
  m.d_model = static_cast<int>(s.get_int("d_model", base.d_model, 1, shape_limits::width));
  m.vocab_size = static_cast<int>(s.get_int("vocab_size", base.vocab_size, 2, shape_limits::vocab));
  m.seq_len = static_cast<int>(s.get_int("seq_len", base.seq_len, 1, shape_limits::positions));
  m.activation_checkpointing = s.get_bool("activation_checkpointing", false);
  m.init_from = s.get_str("init_from", "");
  m.seq_len_given = s.present("seq_len");
  m.shape_given = !m.init_from.empty();
  for (const char* k : {"preset", "family", "n_layer", "n_head", "d_model", "vocab_size", "n_kv_head", "d_ff",
                        "tie_embeddings", "qkv_bias", "rope_theta", "norm_eps", "rope_scaling"})
    m.shape_given = m.shape_given || s.present(k);
  if (!m.init_from.empty() && !is_hf_folder(m.init_from)) {  // refused now, not after the data is loaded
    std::error_code ec;
    if (std::filesystem::is_directory(m.init_from, ec))
      s.fail("init_from", m.init_from +
                              ": a folder without config.json; model.init_from takes a safetensors file or a Hugging "
                              "Face folder (config.json and model.safetensors or its shards)");
    InputFile check(m.init_from, "model.init_from");  // exists, and is a regular file (not a FIFO that would block)
  }
  if (is_hf_folder(m.init_from)) {  // a Hugging Face folder: its config.json is the shape
    for (const char* k : {"family", "n_layer", "n_head", "d_model", "vocab_size", "n_kv_head", "d_ff", "tie_embeddings",
                          "qkv_bias", "rope_theta", "norm_eps", "rope_scaling"})
      if (s.present(k)) s.fail(k, "the shape comes from " + m.init_from + "/config.json; remove this key");
    const ModelShape h = hf_shape(m.init_from, m.seq_len == base.seq_len && !s.present("seq_len") ? 0 : m.seq_len);
    if (s.present("preset")) {  // a preset beside a folder says which model the folder must hold
      ModelShape want = base, got = h;
      want.seq_len = got.seq_len = 0;
      want.max_positions = got.max_positions = 0;
      want.hf = got.hf = {};
      want.sliding_window = got.sliding_window = 0;
      want.window_from = got.window_from = 0;
      if (!(want == got))
        s.fail("preset", "'" + preset + "' does not match " + m.init_from + "/config.json (" +
                             std::to_string(h.n_layer) + " layers, hidden_size " + std::to_string(h.d_model) +
                             ", vocab " + std::to_string(h.vocab_size) + ")");
    }
    set_model_shape(m, h);
    m.preset = "";
    for (auto [k, v] : {std::pair{"n_layer", m.n_layer},
                        {"n_head", m.n_head},
                        {"d_model", m.d_model},
                        {"vocab_size", m.vocab_size},
                        {"seq_len", m.seq_len},
                        {"n_kv_head", m.n_kv_head},
                        {"d_ff", m.d_ff}})
      s.set_out(k, v);
    s.set_out("family", std::string(to_string(m.family)));
    s.finish();
    return;
  }
  m.family =
      s.get_enum<ModelFamily>("family", base.family, {{"gpt2", ModelFamily::gpt2}, {"llama", ModelFamily::llama}});
  if (m.d_model % m.n_head != 0)
    s.fail("d_model",
           "d_model " + std::to_string(m.d_model) + " is not divisible by n_head " + std::to_string(m.n_head));
  if (m.family == ModelFamily::llama) {
    m.n_kv_head = static_cast<int>(s.get_int("n_kv_head", base.n_kv_head ? base.n_kv_head : m.n_head, 1, shape_limits::heads));
    // Llama's rule for the MLP width when none is given: 2/3 of 4·C, rounded up to a multiple of 256.
    const std::int64_t llama_ff = (8 * std::int64_t{m.d_model} / 3 + 255) / 256 * 256;
    m.d_ff = static_cast<int>(s.get_int("d_ff", base.d_ff ? base.d_ff : llama_ff, 1, shape_limits::ff_width));
    m.tie_embeddings = s.get_bool("tie_embeddings", base.tie_embeddings);
    m.qkv_bias = s.get_bool("qkv_bias", base.qkv_bias);
    m.rope_theta = s.get_num("rope_theta", base.rope_theta, 1, 1e12);
    m.norm_eps = s.get_num("norm_eps", base.norm_eps, 1e-12, 1e-2);
    Section rs = s.child("rope_scaling");  // Llama 3's "rope_type": "llama3"
    m.rope_factor = rs.get_num("factor", base.rope_factor, 1, 1e6);
    m.rope_low_freq_factor = rs.get_num("low_freq_factor", base.rope_low_freq_factor, 1e-6, 1e6);
    m.rope_high_freq_factor = rs.get_num("high_freq_factor", base.rope_high_freq_factor, 1e-6, 1e6);
    m.rope_original_max = rs.get_num("original_max_position_embeddings", base.rope_original_max, 1, 1e9);
    rs.finish();
    m.rope = base.rope;
    m.rope.type = m.rope_factor != 1 ? "llama3" : "default";
    if (m.rope_factor != 1 && m.rope_high_freq_factor <= m.rope_low_freq_factor)
      s.fail("rope_scaling", "high_freq_factor must exceed low_freq_factor");
    if (m.n_head % m.n_kv_head != 0)
      s.fail("n_kv_head",
             "n_head " + std::to_string(m.n_head) + " is not a multiple of n_kv_head " + std::to_string(m.n_kv_head));
    if ((m.d_model / m.n_head) % 2 != 0)
      s.fail("n_head", "the head width d_model / n_head = " + std::to_string(m.d_model / m.n_head) +
                           " must be even for rotary positions");
  } else {
    for (const char* k : {"n_kv_head", "d_ff", "tie_embeddings", "qkv_bias", "rope_theta", "norm_eps", "rope_scaling"})
      if (s.present(k)) s.fail(k, "applies to model.family llama only");
  }
  m.preset = (model_shape(m) == base) ? preset : "";
  s.finish();
}

void read_data(Section s, DataConfig& d) {
  d.path = s.get_str("path", "");
  d.format = s.get_enum<DataFormat>("format", DataFormat::automatic,
                                    {{"auto", DataFormat::automatic},
                                     {"text", DataFormat::text},
                                     {"tokens", DataFormat::tokens},
                                     {"jsonl", DataFormat::jsonl}});
  d.val_fraction = s.get_num("val_fraction", 0.1, 0.001, 0.5);
  d.tokenizer = s.get_str("tokenizer", "");
  if (!d.tokenizer.empty() && d.format == DataFormat::tokens)
    s.fail("tokenizer", "a tokenizer applies to text; data.format is tokens");
  d.chat_template = s.get_enum<ChatTemplate>("chat_template", ChatTemplate::automatic,
                                             {{"auto", ChatTemplate::automatic},
                                              {"llama3", ChatTemplate::llama3},
                                              {"chatml", ChatTemplate::chatml},
                                              {"qwen2", ChatTemplate::qwen2},
                                              {"model", ChatTemplate::model},
                                              {"none", ChatTemplate::none}});
  if (is_chat_data(d)) {
    if (d.path.empty()) s.fail("format", "jsonl needs a data.path (a .jsonl file)");
    if (d.tokenizer.empty())
      s.fail("tokenizer", "chat data (JSONL) needs a tokenizer: the model folder or its tokenizer file");
  } else if (d.chat_template != ChatTemplate::automatic) {  // "auto" is what the resolved config holds
    s.fail("chat_template", "applies to chat data only (data.format jsonl or a .jsonl data.path)");
  }
  s.finish();
}

void read_train(Section s, TrainConfig& t) {
  t.steps = s.get_int("steps", 1000, 0, kMaxI64);  // 0: evaluate only
  t.seed = static_cast<std::uint64_t>(s.get_int("seed", 1234, 0, kMaxI64));
  t.checkpoint_dir = s.get_str("checkpoint_dir", "");
  t.checkpoint_interval = s.get_int("checkpoint_interval", 0, 0, kMaxI64);
  t.keep_last = static_cast<int>(s.get_int("keep_last", 2, 1, 1000));
  t.overwrite_checkpoints = s.get_bool("overwrite_checkpoints", false);
  t.metrics_file = s.get_str("metrics_file", "");
  t.trace_file = s.get_str("trace_file", "");
  t.trace_steps = s.get_int("trace_steps", 8, 1, 1'000'000);
  t.eval_interval = s.get_int("eval_interval", 100, 0, kMaxI64);
  t.eval_batches = static_cast<int>(s.get_int("eval_batches", 8, 1, 1 << 20));
  t.overlap_none = s.get_enum<bool>("overlap", false, {{"exact", false}, {"none", true}});
  if (t.checkpoint_interval > 0 && t.checkpoint_dir.empty())
    s.fail("checkpoint_interval", "checkpoint_interval is set but train.checkpoint_dir is empty");
  s.finish();
}

void read_device(Section s, DeviceConfig& d) {
  d.type =
      s.get_enum<DeviceType>("type", DeviceType::automatic,
                             {{"auto", DeviceType::automatic}, {"cpu", DeviceType::cpu}, {"cuda", DeviceType::cuda}});
  d.memory_budget = s.get_bytes("memory_budget", 0, /*allow_auto_zero=*/true);
  d.threads = static_cast<int>(s.get_int("threads", 0, 0, 4096));
  d.pin_threads = s.get_bool("pin_threads", false);
  d.simd = s.get_enum<std::string>("simd", "auto",
                                   {{"auto", "auto"}, {"avx512", "avx512"}, {"avx2", "avx2"}, {"scalar", "scalar"}});
  d.async = s.get_bool("async", false);
  d.jitter_seed = static_cast<std::uint64_t>(s.get_int("jitter_seed", 0, 0, std::numeric_limits<std::int64_t>::max()));
  d.jitter_us = static_cast<int>(s.get_int("jitter_us", 200, 1, 1'000'000));
  d.comm = s.get_enum<std::string>("comm", "auto", {{"auto", "auto"}, {"mpi", "mpi"}, {"nccl", "nccl"}});
  d.kernels = s.get_enum<Kernels>("kernels", Kernels::reference,
                                  {{std::string(to_string(Kernels::reference)), Kernels::reference},
                                   {std::string(to_string(Kernels::fast)), Kernels::fast}});
  d.attention = s.get_enum<Attention>("attention", Attention::automatic,
                                      {{"auto", Attention::automatic},
                                       {"cudnn", Attention::cudnn},
                                       {"wmma", Attention::wmma},
                                       {"reference", Attention::reference}});
  if (d.kernels == Kernels::reference && (d.attention == Attention::cudnn || d.attention == Attention::wmma))
    s.fail("attention", std::string(to_string(d.attention)) +
                            " is an attention of the fast kernels; set device.kernels to fast (or attention to auto)");
  if (d.kernels == Kernels::fast && d.attention == Attention::reference)
    s.fail("attention", "reference is the reference kernels' attention; the fast kernels run cudnn or wmma (or auto)");
  if (d.type == DeviceType::cpu && (d.attention == Attention::cudnn || d.attention == Attention::wmma))
    s.fail("attention", std::string(to_string(d.attention)) + " runs on the CUDA device only (the CPU device's fast "
                            "kernels have one attention, the twin of the wmma kernel)");
  if (d.type == DeviceType::cpu && d.comm == "nccl")
    s.fail("comm", "nccl moves CUDA device memory; the CPU device's ranks use mpi");
  if (d.type == DeviceType::cuda && (d.async || d.jitter_seed))
    s.fail(d.async ? "async" : "jitter_seed",
           "applies to the CPU device only (the CUDA device is asynchronous already)");
  s.finish();
}

void read_optimizer(Section s, OptimizerConfig& o) {
  static const std::set<std::string> other_ds = {"lamb", "onebitadam", "zerooneadam", "onebitlamb", "adagrad", "lion",
                                                 "muon", "muadam",     "muadamw",     "musgd",      "sgd"};
  if (const json* t = s.raw("type"); t && t->is_string() && other_ds.count(lower(t->get<std::string>())))
    s.fail("type",
           "'" + t->get<std::string>() + "' is a DeepSpeed optimizer zinf does not implement (supported: Adam, AdamW)");
  o.type = s.get_enum<OptimizerType>("type", OptimizerType::adamw,
                                     {{"Adam", OptimizerType::adam}, {"AdamW", OptimizerType::adamw}},
                                     /*case_insensitive=*/true);
  Section p = s.child("params");
  if (p.present("max_grad_norm"))
    p.fail("max_grad_norm",
           "'max_grad_norm' is not supported as an optimizer parameter; use the top-level "
           "'gradient_clipping' (as DeepSpeed requires)");
  o.lr = p.get_num("lr", 1e-3, 0, 1e3);
  // betas: a two-element array.
  o.beta1 = 0.9;
  o.beta2 = 0.999;
  json scratch;
  if (const json* b = p.value("betas", kNoAuto, scratch, json::array({0.9, 0.999}))) {
    if (!b->is_array() || b->size() != 2 || !(*b)[0].is_number() || !(*b)[1].is_number())
      p.fail("betas", "expected [beta1, beta2], got " + show(*b));
    o.beta1 = (*b)[0].get<double>();
    o.beta2 = (*b)[1].get<double>();
    if (!(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1))
      p.fail("betas", "each beta must be in [0, 1), got " + show(*b));
  }
  p.set_out("betas", json::array({o.beta1, o.beta2}));
  o.eps = p.get_num("eps", 1e-8, 0, 1);
  o.weight_decay = p.get_num("weight_decay", 0.0, 0, 1e3);
  o.bias_correction = p.get_bool("bias_correction", true);
  bool adam_w_mode = p.get_bool("adam_w_mode", true);
  o.decoupled_weight_decay = (o.type == OptimizerType::adamw) || adam_w_mode;
  p.note_if_present("torch_adam", "ignored: zinf always runs its own fused CPU Adam");
  p.note_if_present("fused", "ignored: zinf's Adam is always fused");
  p.only_default("amsgrad", false, "AMSGrad is not supported (DeepSpeed's CPU Adam lacks it too)");
  p.finish();
  s.finish();
}

void read_scheduler(Section s, SchedulerConfig& c, double opt_lr, std::int64_t train_steps) {
  if (!s.present("type") && !s.present("params")) {
    c.type = SchedulerType::none;  // no scheduler: the optimizer's lr throughout
    s.finish();
    return;
  }
  if (const json* t = s.raw("type"); t && t->is_string()) {
    std::string n = t->get<std::string>();
    if (n == "OneCycle" || n == "LRRangeTest")
      s.fail("type", "'" + n +
                         "' is a DeepSpeed scheduler zinf does not implement (supported: "
                         "WarmupLR, WarmupDecayLR, WarmupCosineLR)");
  }
  if (!s.present("type")) s.fail("type", "a scheduler needs a type");
  c.type = s.get_enum<SchedulerType>("type", SchedulerType::none,
                                     {{"WarmupLR", SchedulerType::warmup_lr},
                                      {"WarmupDecayLR", SchedulerType::warmup_decay_lr},
                                      {"WarmupCosineLR", SchedulerType::warmup_cosine_lr}});
  Section p = s.child("params");
  const bool cosine = c.type == SchedulerType::warmup_cosine_lr;
  if (!cosine) {
    c.warmup_min_lr = p.get_num("warmup_min_lr", 0.0, 0, 1e3, AutoRule::to(0.0));
    double def_max = c.type == SchedulerType::warmup_lr ? opt_lr : 1e-3;
    c.warmup_max_lr = p.get_num("warmup_max_lr", def_max, 0, 1e3, AutoRule::to(opt_lr));
  } else {
    c.warmup_min_ratio = p.get_num("warmup_min_ratio", 0.0, 0, 1);
    c.cos_min_ratio = p.get_num("cos_min_ratio", 1e-4, 0, 1);
  }
  // DeepSpeed clamps warmup_num_steps to at least 2 (log(1) would divide by zero).
  c.warmup_num_steps = std::max<std::int64_t>(2, p.get_int("warmup_num_steps", 1000, 0, kMaxI64));
  c.warmup_type = p.get_enum<WarmupType>("warmup_type", WarmupType::log,
                                         {{"log", WarmupType::log}, {"linear", WarmupType::linear}});
  if (c.type != SchedulerType::warmup_lr) {
    if (!p.present("total_num_steps"))
      p.fail("total_num_steps", "required by " + std::string(cosine ? "WarmupCosineLR" : "WarmupDecayLR"));
    c.total_num_steps =
        p.get_int("total_num_steps", 0, 1, kMaxI64, AutoRule::to(std::max<std::int64_t>(1, train_steps)));
    if (c.total_num_steps < c.warmup_num_steps)
      s.notes()->push_back(p.join("total_num_steps") + ": " + std::to_string(c.total_num_steps) +
                           " is less than warmup_num_steps " + std::to_string(c.warmup_num_steps));
  }
  p.note_if_present("last_batch_iteration", "ignored: resume restores the scheduler position");
  p.finish();
  s.finish();
}

void read_fp16(Section s, Fp16Config& f) {
  f.enabled = s.get_bool("enabled", false);
  if (const json* v = s.raw("loss_scale"); v && v->is_boolean())
    s.fail("loss_scale", "expected a number (0 = dynamic), got " + show(*v));
  f.loss_scale = s.get_num("loss_scale", 0.0, 0, 1e38);
  f.initial_scale_power = static_cast<int>(s.get_int("initial_scale_power", 16, 0, 126));
  f.loss_scale_window = static_cast<int>(s.get_int("loss_scale_window", 1000, 1, 1 << 30));
  f.hysteresis = static_cast<int>(s.get_int("hysteresis", 2, 1, 1 << 30));
  f.consecutive_hysteresis = s.get_bool("consecutive_hysteresis", false);
  f.min_loss_scale = s.get_num("min_loss_scale", 1.0, 1e-30, 1e38);
  s.note_if_present("auto_cast", "ignored: zinf's model computes in the configured precision");
  s.only_default("fp16_master_weights_and_grads", false,
                 "fp16 master weights are not supported; zinf keeps fp32 masters");
  s.finish();
}

void read_bf16(Section s, Bf16Config& b) {
  b.enabled = s.get_bool("enabled", false);
  b.check_grad_overflow = s.get_bool("check_grad_overflow", true);
  s.note_if_present("immediate_grad_update", "ignored: zinf streams gradients out per bucket");
  s.only_default("bf16_master_weights_and_grads", false,
                 "bf16 master weights are not supported; zinf keeps fp32 masters");
  s.only_default("bf16_optimizer_states", false, "bf16 optimizer states are not supported; zinf keeps fp32 m and v");
  s.finish();
}

// DeepSpeed's activation_checkpointing section. zinf's recompute is model.activation_checkpointing
// (DeepSpeed leaves that to the model's code); cpu_checkpointing moves its checkpoints to pinned host
// memory, and needs no partition_activations on a single rank.
void read_activation_checkpointing(Section s, ModelConfig& m) {
  m.cpu_checkpointing = s.get_bool("cpu_checkpointing", false);
  if (m.cpu_checkpointing && !m.activation_checkpointing)
    s.fail("cpu_checkpointing",
           "moves the checkpoints of activation checkpointing to host memory, which is off: set "
           "model.activation_checkpointing to true (zinf's per-block recompute)");
  s.note_if_present("partition_activations",
                    "no effect: zinf has no model parallelism to split activations across (cpu_checkpointing does "
                    "not need it)");
  for (const char* key :
       {"contiguous_memory_optimization", "number_checkpoints", "synchronize_checkpoint_boundary", "profile"})
    s.note_if_present(key, "accepted, no effect: zinf checkpoints each block's input (model.activation_checkpointing)");
  s.finish();
}

const std::vector<std::pair<std::string, OffloadDevice>> kOffloadDevices = {
    {"none", OffloadDevice::none}, {"cpu", OffloadDevice::cpu}, {"nvme", OffloadDevice::nvme}};

// What the deprecated offload spellings said (cpu_offload, cpu_offload_param,
// cpu_offload_use_pin_memory), mapped as DeepSpeed maps them.
struct DeprecatedOffload {
  bool optimizer_cpu = false, param_cpu = false;
  std::optional<bool> pin_memory;
};

DeprecatedOffload read_deprecated_offload(Section& s) {
  DeprecatedOffload dep;
  for (auto [old_key, new_key] :
       {std::pair{"cpu_offload", "offload_optimizer"}, std::pair{"cpu_offload_param", "offload_param"}}) {
    if (s.present(old_key)) {
      if (s.present(new_key))
        s.fail(old_key, std::string("Cannot provide deprecated parameter '") + old_key + "' and replacing parameter '" +
                            new_key + "' together");
      const json* v = s.raw(old_key);
      if (!v->is_boolean()) s.fail(old_key, "expected true or false, got " + show(*v));
      (std::string(old_key) == "cpu_offload" ? dep.optimizer_cpu : dep.param_cpu) = v->get<bool>();
      s.notes()->push_back(s.join(old_key) + ": deprecated, read as " + new_key + ".device=cpu");
    }
  }
  if (const json* v = s.raw("cpu_offload_use_pin_memory")) {
    if (!v->is_boolean()) s.fail("cpu_offload_use_pin_memory", "expected true or false");
    dep.pin_memory = v->get<bool>();
    s.notes()->push_back(s.join("cpu_offload_use_pin_memory") + ": deprecated, read as pin_memory");
  }
  return dep;
}

void read_offload_optimizer(Section o, OffloadOptimizerConfig& oo, const DeprecatedOffload& dep, int stage,
                            bool overlap_none, std::int64_t ga, int world, bool checkpointing) {
  oo.device = o.get_enum<OffloadDevice>("device", dep.optimizer_cpu ? OffloadDevice::cpu : OffloadDevice::none,
                                        kOffloadDevices);
  oo.nvme_path = o.get_str("nvme_path", "");
  oo.buffer_count = static_cast<int>(o.get_int("buffer_count", 4, 1, 1024));
  oo.pin_memory = o.get_bool("pin_memory", dep.pin_memory.value_or(true));
  oo.pipeline_read = o.get_bool("pipeline_read", false);
  oo.pipeline_write = o.get_bool("pipeline_write", false);
  oo.fast_init = o.get_bool("fast_init", false);
  // zinf: the speculative Update, off unless asked for (its host backup and second NVMe slot cost
  // memory and disk, and on the CPU device it competes with the model for the cores); "auto" turns it
  // on wherever it applies.
  const bool applies = oo.device != OffloadDevice::none && !overlap_none;
  oo.speculative = o.get_bool("speculative", false, AutoRule::to(applies));
  if (oo.speculative && oo.device == OffloadDevice::none)
    o.fail("speculative", "the speculative Update needs the optimizer off the device (device cpu or nvme)");
  if (oo.speculative && overlap_none)
    o.fail("speculative", "the speculative Update needs train.overlap \"exact\" (it is \"none\")");
  oo.speculative_backup_size = o.get_int("speculative_backup_size", 0, 0, kMaxI64, AutoRule::to(0));
  // zinf: the micro batches' gradients summed on the device (off unless asked for: 4 bytes a
  // parameter of device memory).
  oo.device_grad_accumulation = o.get_bool("device_grad_accumulation", false);
  if (oo.device_grad_accumulation && oo.device == OffloadDevice::none)
    o.fail("device_grad_accumulation", "needs the optimizer off the device (device cpu or nvme); with it on the "
                                       "device the gradients are always summed there");
  if (oo.device_grad_accumulation && world > 1)
    o.fail("device_grad_accumulation", "takes one rank (this job has " + std::to_string(world) +
                                           "): with several, every micro batch's gradients are reduced across ranks");
  if (oo.device_grad_accumulation && ga == 1)
    o.notes()->push_back(o.join("device_grad_accumulation") + ": no effect with gradient_accumulation_steps 1");
  // zinf: the layer-major order of gradient accumulation (docs/offload-engine.md): every micro batch
  // through a unit before the next unit, each unit's gradient complete after its micro batches.
  oo.layer_major = o.get_bool("layer_major", false);
  if (oo.layer_major && oo.device == OffloadDevice::none)
    o.fail("layer_major", "needs the optimizer off the device (device cpu or nvme): the micro batches of a unit "
                          "are summed on the host");
  if (oo.layer_major && oo.device_grad_accumulation)
    o.fail("layer_major", "and device_grad_accumulation are two ways to sum the micro batches: choose one");
  if (oo.layer_major && !checkpointing)
    o.fail("layer_major", "needs model.activation_checkpointing true: the forward keeps every micro batch's block "
                          "inputs, not their activations");
  if (oo.layer_major && ga == 1)
    o.notes()->push_back(o.join("layer_major") + ": no effect with gradient_accumulation_steps 1");
  // zinf: gradient streaming (docs/offload-engine.md): the host keeps no whole gradient.
  oo.gradient_streaming = o.get_bool("gradient_streaming", false);
  if (oo.gradient_streaming) {
    const std::string why = gradient_streaming_refusal(oo.device, !overlap_none, world, ga,
                                                       oo.device_grad_accumulation, oo.layer_major);
    if (!why.empty()) o.fail("gradient_streaming", why);
    // Each unit's gradient goes to the speculative Update as it is reduced: on unless the config says
    // `speculative: false` (then the Update reads every gradient back from NVMe after the barrier,
    // without the speculation's second NVMe slot of the states).
    if (!o.present("speculative")) oo.speculative = true;
  }
  o.only_default("ratio", 1.0,
                 "partial offload (Twin-Flow ratio < 1) is not supported; zinf "
                 "updates every sub-group on the host");
  o.only_default("super_offload", false, "SuperOffload is not supported");
  o.note_if_present("cpuadam_cores_perc", "ignored: use device.threads for the host update");
  if (oo.device == OffloadDevice::nvme && oo.nvme_path.empty())
    o.fail("nvme_path", "device is nvme but nvme_path is not set");
  if (oo.device != OffloadDevice::none && stage == 0)
    o.fail("device", "offloading the optimizer needs ZeRO stage 1, 2 or 3 (stage is 0)");
  o.finish();
}

void read_offload_param(Section o, OffloadParamConfig& op, const DeprecatedOffload& dep, int stage) {
  op.device =
      o.get_enum<OffloadDevice>("device", dep.param_cpu ? OffloadDevice::cpu : OffloadDevice::none, kOffloadDevices);
  op.nvme_path = o.get_str("nvme_path", "");
  op.buffer_count = static_cast<int>(o.get_int("buffer_count", 5, 1, 1024));
  op.buffer_size = o.get_int("buffer_size", 100'000'000, 1, kMaxI64);
  op.max_in_cpu = o.get_int("max_in_cpu", 1'000'000'000, 0, kMaxI64);
  op.pin_memory = o.get_bool("pin_memory", dep.pin_memory.value_or(true));
  if (op.device == OffloadDevice::nvme && op.nvme_path.empty())
    o.fail("nvme_path", "device is nvme but nvme_path is not set");
  if (op.device != OffloadDevice::none && stage != 3)
    o.fail("device", "offloading parameters needs ZeRO stage 3 (stage is " + std::to_string(stage) + ")");
  o.finish();
}

// DeepSpeed's zero_optimization keys that mean nothing to zinf: accepted, with a note.
void note_ineffective_zero_keys(Section& s) {
  for (const char* key : {"use_multi_rank_bucket_allreduce",
                          "load_from_fp32_weights",
                          "round_robin_gradients",
                          "stage3_gather_16bit_weights_on_model_save",
                          "stage3_gather_fp16_weights_on_model_save",
                          "gather_16bit_weights_on_model_save",
                          "ignore_unused_parameters",
                          "zero_hpz_partition_size",
                          "zero_quantized_weights",
                          "zero_quantized_nontrainable_weights",
                          "zero_quantized_gradients",
                          "zeropp_loco_param",
                          "mics_shard_size",
                          "mics_hierarchical_params_gather",
                          "memory_efficient_linear",
                          "override_module_apply",
                          "stage3_model_persistence_threshold",
                          "model_persistence_threshold",
                          "stage3_module_granularity_threshold",
                          "stage3_use_all_reduce_for_fetch_params",
                          "stage3_allgather_sequential",
                          "elastic_checkpoint",
                          "legacy_stage1",
                          "log_trace_cache_warnings",
                          "enable_sanity_checks",
                          "pipeline_loading_checkpoint",
                          "leaf_module"})
    s.note_if_present(key, "accepted, no effect on one box (multi-GPU or PyTorch-module setting)");
  for (const char* key : {"reduce_scatter", "allgather_partitions", "allgather_bucket_size"})
    s.note_if_present(key,
                      "accepted, no effect: across ranks zinf always reduce-scatters gradients bucket by bucket "
                      "(reduce_bucket_size) and gathers updated parameters unit by unit");
}

void read_zero(Section s, ZeroConfig& z, const ModelConfig& model, bool overlap_none, std::int64_t ga, int world) {
  const std::int64_t d = model.d_model;
  z.stage = static_cast<int>(s.get_int("stage", 0, 0, 3));
  z.contiguous_gradients = s.get_bool("contiguous_gradients", true);
  z.overlap_comm = s.get_bool("overlap_comm", z.stage == 3, AutoRule::to(z.stage == 3));
  // "auto" sizes follow the Hugging Face integration's rules, from the model width.
  z.reduce_bucket_size = s.get_int("reduce_bucket_size", 500'000'000, 1, kMaxI64, AutoRule::to(d * d));
  z.sub_group_size = s.get_int("sub_group_size", 1'000'000'000, 1, kMaxI64);
  std::string k = s.pick({"stage3_prefetch_bucket_size", "prefetch_bucket_size"});
  z.prefetch_bucket_size = s.get_int(k, 50'000'000, 0, kMaxI64, AutoRule::to(9 * d * d / 10));
  k = s.pick({"stage3_max_live_parameters", "max_live_parameters"});
  z.max_live_parameters = s.get_int(k, 1'000'000'000, 0, kMaxI64);
  k = s.pick({"stage3_max_reuse_distance", "max_reuse_distance"});
  z.max_reuse_distance = s.get_int(k, 1'000'000'000, 0, kMaxI64);
  k = s.pick({"stage3_param_persistence_threshold", "param_persistence_threshold"});
  z.param_persistence_threshold = s.get_int(k, 100'000, 0, kMaxI64, AutoRule::to(10 * d));
  const DeprecatedOffload dep = read_deprecated_offload(s);
  read_offload_optimizer(s.child("offload_optimizer"), z.offload_optimizer, dep, z.stage, overlap_none, ga, world,
                         model.activation_checkpointing);
  z.optimizer_states_given = s.present("optimizer_states");
  z.optimizer_states = s.get_enum<cpu_adam::StateFormat>("optimizer_states", cpu_adam::StateFormat::fp32,
                                                         {{"fp32", cpu_adam::StateFormat::fp32},
                                                          {"bf16", cpu_adam::StateFormat::bf16},
                                                          {"8bit", cpu_adam::StateFormat::q8}});
  read_offload_param(s.child("offload_param"), z.offload_param, dep, z.stage);
  if (!(z.offload_optimizer.pin_memory && z.offload_param.pin_memory) &&
      z.offload_optimizer.device == OffloadDevice::none && z.offload_param.device != OffloadDevice::none)
    s.notes()->push_back(s.join(!z.offload_optimizer.pin_memory ? "offload_optimizer.pin_memory" : "offload_param.pin_memory") +
                         ": false is not honoured here: with the optimizer on the device its Update writes the "
                         "offloaded parameters' host homes directly, which needs page-locked memory (the "
                         "staging and the activation checkpoints' host rows stay page-locked too)");
  note_ineffective_zero_keys(s);
  s.only_default("zenflow", nullptr, "ZenFlow is not supported; zinf's default overlap is exact");
  s.finish();
}

void read_aio(Section s, AioConfig& a) {
  a.block_size = s.get_int("block_size", 1'048'576, 4096, std::int64_t{1} << 30);
  if (a.block_size % 4096 != 0)
    s.fail("block_size", "must be a multiple of 4096 bytes for O_DIRECT, got " + std::to_string(a.block_size));
  a.queue_depth = static_cast<int>(s.get_int("queue_depth", 8, 1, 4096));
  // DeepSpeed's docs call it thread_count, its code reads intra_op_parallelism: zinf takes both.
  std::string k = s.pick({"intra_op_parallelism", "thread_count"});
  a.intra_op_parallelism = static_cast<int>(s.get_int(k, 1, 1, 64));
  a.single_submit = s.get_bool("single_submit", false);
  a.overlap_events = s.get_bool("overlap_events", true);
  if (!a.overlap_events)
    s.notes()->push_back(s.join("overlap_events") +
                         ": zinf always refills the ring on each completion; false changes nothing");
  a.use_gds = s.get_bool("use_gds", false);
  if (a.use_gds)
    s.notes()->push_back(s.join("use_gds") + ": GPUDirect Storage is not used; zinf reads through its pinned pool");
  a.engine = s.get_enum<AsyncIoKind>(
      "engine", AsyncIoKind::automatic,
      {{"auto", AsyncIoKind::automatic}, {"uring", AsyncIoKind::uring}, {"posix", AsyncIoKind::posix}});
  a.sqpoll = s.get_bool("sqpoll", false);
  s.finish();
}

// DeepSpeed's tensorboard or csv_monitor section, {enabled, output_path, job_name}: the folder its
// files go to, output_path/job_name (job_name under the current directory when output_path is ""),
// or "" when the section is off.
std::string read_ds_monitor(Section s) {
  const bool enabled = s.get_bool("enabled", false);
  const std::string path = s.get_str("output_path", "");
  const std::string job = s.get_str("job_name", "DeepSpeedJobName");
  s.finish();
  if (!enabled) return "";
  return (std::filesystem::path(path) / job).string();
}

// zinf's monitor section names the folders directly; a folder given both ways is refused.
void read_monitor(Section s, MonitorConfig& m, const std::string& ds_tensorboard, const std::string& ds_csv) {
  auto folder = [&](const char* key, const std::string& ds, const char* ds_section) {
    if (s.present(key) && !ds.empty())
      s.fail(key, std::string("'") + ds_section + ".enabled' names this folder too (" + ds + "); give only one");
    return s.get_str(key, ds);
  };
  m.tensorboard_dir = folder("tensorboard_dir", ds_tensorboard, "tensorboard");
  m.csv_dir = folder("csv_dir", ds_csv, "csv_monitor");
  s.finish();
}

// DeepSpeed's flops_profiler section. zinf's profile is the model's ops by kind (the table of
// `zinf bench step --profile`); DeepSpeed's per-module keys are checked and accepted.
void read_flops_profiler(Section s, FlopsProfilerConfig& f, std::int64_t steps) {
  f.enabled = s.get_bool("enabled", false);
  f.profile_step = s.get_int("profile_step", 1, 0, kMaxI64);
  s.get_int("module_depth", -1, -1, kMaxI64);
  s.get_int("top_modules", 1, 1, kMaxI64);
  s.get_bool("detailed", true);
  s.get_num("recompute_fwd_factor", 0.0, 0.0, 1e6);
  f.output_file = s.get_str("output_file", "");
  if (f.enabled) {
    for (const char* k : {"module_depth", "top_modules", "detailed", "recompute_fwd_factor"})
      s.note_if_present(k, "zinf's profile lists the model's ops by kind, not modules; accepted, no effect");
    if (steps > 0 && f.profile_step >= steps)
      s.notes()->push_back(s.join("profile_step") + ": " + std::to_string(f.profile_step) +
                           " completed steps are never reached before train.steps " + std::to_string(steps) +
                           "; no profile is printed");
  }
  s.finish();
}

// The largest micro batch (sequences) and gradient accumulation (micro batches per step) zinf takes;
// docs/config.md states them.
constexpr std::int64_t kMaxMicroBatch = 1 << 16, kMaxGradAccum = 1 << 16;

// DeepSpeed's _set_batch_related_parameters / _batch_assertion, same wording.
void resolve_batch(Section& s, Config& c) {
  std::vector<const char*> autos;
  // Each bounded as it is read (before any product is formed or anything sized from it).
  auto read = [&](const char* key, std::int64_t hi, const char* what) -> std::int64_t {
    const json* v = s.raw(key);
    if (!v) return 0;
    if (Section::is_auto(*v)) {  // "auto": inferred from the others when possible
      autos.push_back(key);
      return 0;
    }
    const std::int64_t n = s.as_int(key, *v);
    if (n <= 0) s.fail(key, "must be a positive integer, got " + show(*v));
    if (n > hi) s.fail(key, show(*v) + " is above " + what + ", " + std::to_string(hi));
    return n;
  };
  std::int64_t train = read("train_batch_size", kMaxMicroBatch * kMaxGradAccum, "the largest batch zinf takes");
  std::int64_t micro = read("train_micro_batch_size_per_gpu", kMaxMicroBatch, "the largest micro batch zinf takes");
  std::int64_t ga = read("gradient_accumulation_steps", kMaxGradAccum, "the most micro batches a step takes");
  const std::int64_t ws = c.world_size;
  if (train == 0 && micro == 0 && !autos.empty()) {  // nothing to infer from: report with the other "auto"s
    for (const char* k : autos) s.unresolved(k, json(1));
    train = micro = ga = 1;
  }
  if (train > 0 && micro > 0 && ga > 0) {
  } else if (train > 0 && micro > 0) {
    ga = train / micro / ws;
  } else if (train > 0 && ga > 0) {
    micro = train / ws / ga;
  } else if (micro > 0 && ga > 0) {
    train = micro * ga * ws;
  } else if (train > 0) {
    ga = 1;
    micro = train / ws;
  } else if (micro > 0) {
    train = micro * ws;
    ga = 1;
  } else {
    s.fail("train_batch_size", "Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided");
  }
  if (train <= 0)
    s.fail("train_batch_size", "Train batch size: " + std::to_string(train) + " has to be greater than 0");
  if (micro <= 0)
    s.fail("train_micro_batch_size_per_gpu",
           "Micro batch size per gpu: " + std::to_string(micro) + " has to be greater than 0");
  if (ga <= 0)
    s.fail("gradient_accumulation_steps",
           "Gradient accumulation steps: " + std::to_string(ga) + " has to be greater than 0");
  // A micro batch's rows (micro × seq_len) are counted in int; an inferred micro batch or GA is held
  // to the same bounds as a given one. micro, ga ≤ 2^16 and ws < 2^31: the products below fit int64.
  if (micro > kMaxMicroBatch)
    s.fail("train_micro_batch_size_per_gpu", "train_batch_size / (gradient_accumulation_steps × world size) = " +
                                                 std::to_string(micro) + " is above the largest micro batch zinf takes, " +
                                                 std::to_string(kMaxMicroBatch));
  if (ga > kMaxGradAccum)
    s.fail("gradient_accumulation_steps", "train_batch_size / (micro batch × world size) = " + std::to_string(ga) +
                                              " is above the most micro batches a step takes, " +
                                              std::to_string(kMaxGradAccum));
  if (micro * c.model.seq_len > std::numeric_limits<std::int32_t>::max())
    s.fail("train_micro_batch_size_per_gpu", "micro batch " + std::to_string(micro) + " × model.seq_len " +
                                                 std::to_string(c.model.seq_len) + " rows is above 2^31 - 1");
  if (train != micro * ga * ws)
    s.fail("train_batch_size",
           "Check batch related parameters. train_batch_size is not equal to micro_batch_per_gpu * "
           "gradient_acc_step * world_size " +
               std::to_string(train) + " != " + std::to_string(micro) + " * " + std::to_string(ga) + " * " +
               std::to_string(ws));
  c.train_batch_size = train;
  c.micro_batch_size = micro;
  c.gradient_accumulation_steps = ga;
}

Config parse_root(const json& root, std::string source, int world_size) {
  if (!root.is_object()) throw ConfigError(source + ": the config must be a JSON object");
  Config c;
  c.source = source;
  c.world_size = world_size;
  json out = json::object();
  Unresolved autos;
  Section top(source, &c.notes, &autos, &root, "", &out);

  read_model(top.child("model"), c.model);
  read_train(top.child("train"), c.train);
  read_data(top.child("data"), c.data);
  read_device(top.child("device"), c.device);

  resolve_batch(top, c);
  out["train_batch_size"] = c.train_batch_size;
  out["train_micro_batch_size_per_gpu"] = c.micro_batch_size;
  out["gradient_accumulation_steps"] = c.gradient_accumulation_steps;

  read_optimizer(top.child("optimizer"), c.optimizer);
  read_scheduler(top.child("scheduler"), c.scheduler, c.optimizer.lr, c.train.steps);

  std::string bf = top.pick({"bf16", "bfloat16"});
  read_fp16(top.child("fp16"), c.fp16);
  read_bf16(top.child(bf), c.bf16);
  if (c.fp16.enabled && c.bf16.enabled)
    top.fail("fp16.enabled", "bfloat16 and fp16 modes cannot be simultaneously enabled");

  c.gradient_clipping = top.get_num("gradient_clipping", 1.0, 0, 1e30);
  c.steps_per_print = top.get_int("steps_per_print", 10, 1, kMaxI64);
  c.wall_clock_breakdown = top.get_bool("wall_clock_breakdown", false);

  read_zero(top.child("zero_optimization"), c.zero, c.model, c.train.overlap_none, c.gradient_accumulation_steps,
            c.world_size);
  read_activation_checkpointing(top.child("activation_checkpointing"), c.model);
  read_aio(top.child("aio"), c.aio);
  {
    const std::string tb = read_ds_monitor(top.child("tensorboard"));
    const std::string csv = read_ds_monitor(top.child("csv_monitor"));
    read_monitor(top.child("monitor"), c.monitor, tb, csv);
  }
  read_flops_profiler(top.child("flops_profiler"), c.flops_profiler, c.train.steps);

  for (const char* key : {"communication_data_type",
                          "prescale_gradients",
                          "gradient_predivide_factor",
                          "sparse_gradients",
                          "zero_allow_untested_optimizer",
                          "zero_force_ds_cpu_optimizer",
                          "wandb",
                          "comet",
                          "comms_logger",
                          "autotuning",
                          "elasticity",
                          "amp",
                          "data_efficiency",
                          "curriculum_learning",
                          "compression_training",
                          "checkpoint",
                          "pipeline",
                          "sparse_attention",
                          "data_types",
                          "dump_state",
                          "memory_breakdown",
                          "seq_parallel_communication_data_type",
                          "torch_autocast",
                          "compile",
                          "nebula",
                          "timers",
                          "monitor_config",
                          "hybrid_engine",
                          "weight_quantization",
                          "quantize_training",
                          "eigenvalue",
                          "progressive_layer_drop",
                          "dataloader_drop_last",
                          "disable_allgather",
                          "zero_optimization_stage",
                          "gradient_allreduce_op",
                          "graph_harvesting",
                          "use_data_before_expert_parallelism",
                          "managed_gradient_accumulation"}) {
    top.note_if_present(key, "accepted, no effect on one box");
  }
  top.finish();
  if (!autos.keys.empty()) {
    std::string keys, sets;
    for (const auto& [path, value] : autos.keys) {
      keys += (keys.empty() ? "" : ", ") + path;
      sets += " --set " + path + "=" + value;
    }
    throw ConfigError(
        source + ": " + std::to_string(autos.keys.size()) + (autos.keys.size() == 1 ? " key is" : " keys are") +
            " \"auto\", which the Hugging Face Trainer fills from its own arguments and zinf cannot: " + keys,
        "give them values in the file, or paste (zinf's defaults shown; change as you like):" + sets);
  }
  if (!root.contains("model"))
    c.notes.push_back(
        "model: no model section; training zinf's default model, gpt2-124m (12 layers, d_model 768, vocab 50257, "
        "seq_len 1024) — add a \"model\" section to choose the shape (see the README's Config section)");
  c.resolved_json = out.dump(2);
  return c;
}

}  // namespace

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::uint64_t parse_bytes(std::string_view text, std::string_view what) {
  auto bad = [&](const std::string& why) -> ConfigError {
    return ConfigError(std::string(what) + ": '" + std::string(text) + "' " + why);
  };
  std::size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == 0) throw bad("is not a size (expected e.g. 8GiB, 512MB, 4096)");
  double number = 0;
  try {
    std::size_t used = 0;
    number = std::stod(std::string(text.substr(0, i)), &used);
    if (used != i) throw bad("is not a size");
  } catch (const std::logic_error&) {
    throw bad("is not a size (expected e.g. 8GiB, 512MB, 4096)");
  }
  std::string unit = lower(text.substr(i));
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  double mult = 0;
  static const std::pair<const char*, double> units[] = {{"", 1},
                                                         {"b", 1},
                                                         {"k", 1024.0},
                                                         {"kib", 1024.0},
                                                         {"kb", 1e3},
                                                         {"m", 1048576.0},
                                                         {"mib", 1048576.0},
                                                         {"mb", 1e6},
                                                         {"g", 1073741824.0},
                                                         {"gib", 1073741824.0},
                                                         {"gb", 1e9},
                                                         {"t", 1099511627776.0},
                                                         {"tib", 1099511627776.0},
                                                         {"tb", 1e12}};
  for (auto& [u, m] : units)
    if (unit == u) mult = m;
  if (mult == 0) throw bad("has an unknown unit (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)");
  double bytes = number * mult;
  if (!(bytes < 1.8e19)) throw bad("is too large");
  return static_cast<std::uint64_t>(bytes);
}

Config parse_config(std::string_view json_text, const std::vector<std::string>& overrides, std::string_view source_name,
                    int world_size) {
  std::string source(source_name);
  json root;
  try {
    root = json::parse(json_text, reject_duplicate_keys(source, "DeepSpeed rejects that too"));
  } catch (const json::exception& e) {
    // A syntax error (its message carries line and column), or a number too large for a double
    // ("number overflow parsing '1e400'"); keep nlohmann's text after its "[json.exception...]" tag.
    throw ConfigError(source + ": invalid JSON: " + library_message(e));
  }
  if (!root.is_object())
    throw ConfigError(source + ": the config must be a JSON object, got " + std::string(root.type_name()),
                      "a config is one object: {\"train_batch_size\": 8, ...}");
  for (const auto& o : overrides) apply_override(root, o);
  try {
    return parse_root(root, source, world_size);
  } catch (const json::exception& e) {  // a value of a type no check foresaw: still zinf's one line
    throw ConfigError(source + ": " + library_message(e));
  }
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides, int world_size) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw ConfigError(path + ": is a directory, not a config file",
                      "pass the JSON file, e.g. --config configs/tiny.json");
  return parse_config(read_input_file(path, "config file"), overrides, path, world_size);
}

void set_model_shape(ModelConfig& m, const ModelShape& s) {
  m.n_layer = s.n_layer, m.n_head = s.n_head, m.d_model = s.d_model, m.vocab_size = s.vocab_size, m.seq_len = s.seq_len;
  m.family = s.family, m.n_kv_head = s.n_kv_head, m.d_ff = s.d_ff, m.tie_embeddings = s.tie_embeddings,
  m.qkv_bias = s.qkv_bias;
  m.rope_theta = s.rope_theta, m.norm_eps = s.norm_eps, m.rope_factor = s.rope_factor,
  m.rope_low_freq_factor = s.rope_low_freq_factor;
  m.rope_high_freq_factor = s.rope_high_freq_factor, m.rope_original_max = s.rope_original_max,
  m.max_positions = s.max_positions;
  m.rope = s.rope, m.sliding_window = s.sliding_window, m.window_from = s.window_from, m.hf = s.hf;
}

// The shape a run config's `model` section describes.
ModelShape model_shape(const ModelConfig& m) {
  ModelShape s{m.n_layer, m.n_head, m.d_model, m.vocab_size, m.seq_len};
  s.family = m.family;
  if (m.family == ModelFamily::llama) {
    s.n_kv_head = m.n_kv_head, s.d_ff = m.d_ff, s.tie_embeddings = m.tie_embeddings, s.qkv_bias = m.qkv_bias;
    s.rope_theta = m.rope_theta, s.norm_eps = m.norm_eps, s.rope_factor = m.rope_factor;
    s.rope_low_freq_factor = m.rope_low_freq_factor, s.rope_high_freq_factor = m.rope_high_freq_factor;
    s.rope_original_max = m.rope_original_max;
    s.max_positions = m.max_positions;
    s.rope = m.rope, s.sliding_window = m.sliding_window, s.window_from = m.window_from, s.hf = m.hf;
  }
  return s;
}

}  // namespace zinf
