// instruct.cpp — JSONL chat examples, chat templates and loss masks (io/instruct.h).
#include "io/instruct.h"

#include <algorithm>
#include <filesystem>
#include <unordered_map>
#include <nlohmann/json.hpp>

#include "io/files.h"
#include "io/json_keys.h"
#include "model/op_list.h"
#include "zinf/error.h"

namespace zinf {
namespace {

using json = nlohmann::json;

// nlohmann's messages open with "[json.exception.parse_error.101] "; the user needs what follows.
std::string json_why(const std::exception& e) {
  std::string m = e.what();
  if (!m.empty() && m[0] == '[') {
    const auto close = m.find("] ");
    if (close != std::string::npos) m.erase(0, close + 2);
  }
  return m;
}

const json& string_field(const json& obj, const char* key, const std::string& where) {
  const auto it = obj.find(key);
  if (it == obj.end()) throw ConfigError(where + ": no \"" + key + "\" field");
  if (!it->is_string()) throw ConfigError(where + ": \"" + key + "\" must be a string");
  return *it;
}

}  // namespace

std::string chat_template_name(ChatTemplate t) {
  switch (t) {
    case ChatTemplate::automatic: return "auto";
    case ChatTemplate::llama3: return "llama3";
    case ChatTemplate::chatml: return "chatml";
    case ChatTemplate::qwen2: return "qwen2";
    case ChatTemplate::model: return "model";
    case ChatTemplate::none: return "none";
  }
  return "none";
}

ChatExample parse_chat_line(std::string_view line, const std::string& where) {
  json j;
  try {
    j = json::parse(line.begin(), line.end(), reject_duplicate_keys(where));
  } catch (const json::exception& e) {
    throw ConfigError(where + ": not JSON (" + json_why(e) + ")");
  }
  if (!j.is_object()) throw ConfigError(where + ": an example must be a JSON object");
  ChatExample ex;
  const bool has_messages = j.contains("messages");
  if (has_messages && (j.contains("prompt") || j.contains("completion")))
    throw ConfigError(where + ": give either \"messages\" or \"prompt\" and \"completion\", not both");
  if (!has_messages) {
    if (!j.contains("prompt") && !j.contains("completion"))
      throw ConfigError(where + ": no \"messages\" and no \"prompt\"/\"completion\" fields");
    ex.push_back({"user", string_field(j, "prompt", where).get<std::string>()});
    ex.push_back({"assistant", string_field(j, "completion", where).get<std::string>()});
    return ex;
  }
  const json& msgs = j["messages"];
  if (!msgs.is_array()) throw ConfigError(where + ": \"messages\" must be an array");
  if (msgs.empty()) throw ConfigError(where + ": \"messages\" is empty");
  bool assistant = false;
  for (std::size_t i = 0; i < msgs.size(); ++i) {
    const std::string at = where + ", message " + std::to_string(i + 1);
    if (!msgs[i].is_object()) throw ConfigError(at + ": a message must be a JSON object");
    std::string role = string_field(msgs[i], "role", at).get<std::string>();
    if (role != "system" && role != "user" && role != "assistant")
      throw ConfigError(at + ": role \"" + role + "\" is not one of system, user, assistant");
    assistant = assistant || role == "assistant";
    ex.push_back({std::move(role), string_field(msgs[i], "content", at).get<std::string>()});
  }
  if (!assistant) throw ConfigError(where + ": no assistant message (nothing to train on)");
  return ex;
}

std::vector<ChatExample> parse_chat_jsonl(std::string_view text, const std::string& source) {
  std::vector<ChatExample> out;
  std::size_t pos = 0, line_no = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos) continue;
    out.push_back(parse_chat_line(line, source + " line " + std::to_string(line_no)));
  }
  return out;
}

namespace {

// Llama 3 Instruct's template: each message's content trimmed, <|begin_of_text|> before the first.
constexpr const char* kLlama3 =
    "{% for message in messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim "
    "+ '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

constexpr const char* kChatml =
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

// Qwen2 Instruct's: ChatML with a default system turn when the first message is not one.
constexpr const char* kQwen2 =
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

const char* end_marker(ChatTemplate t) {
  return t == ChatTemplate::llama3 ? "<|eot_id|>"
         : t == ChatTemplate::chatml || t == ChatTemplate::qwen2 ? "<|im_end|>"
                                                                 : nullptr;
}

// The special-token strings transformers passes a template (its special_tokens_map): a string or
// {"content": …} in tokenizer_config.json.
jinja::Value folder_specials(const std::string& path, const std::string& what) {
  namespace fs = std::filesystem;
  jinja::Value v = jinja::Value::make_dict();
  if (path.empty()) return v;
  std::error_code ec;
  fs::path dir(path);
  if (!fs::is_directory(dir, ec)) dir = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
  const std::optional<json> tc = read_folder_json(dir / "tokenizer_config.json", what);
  if (!tc || !tc->is_object()) return v;
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
    if (!tc->contains(key)) continue;
    const json& e = (*tc)[key];
    if (e.is_string())
      v.set(key, jinja::Value::str(e.get<std::string>()));
    else if (e.is_object() && e.contains("content") && e["content"].is_string())
      v.set(key, jinja::Value::str(e["content"].get<std::string>()));
  }
  return v;
}

jinja::Value messages_value(const ChatExample& ex, std::size_t n) {
  std::vector<jinja::Value> l;
  for (std::size_t i = 0; i < n; ++i) {
    jinja::Value m = jinja::Value::make_dict();
    m.set("role", jinja::Value::str(ex[i].role));
    m.set("content", jinja::Value::str(ex[i].content));
    l.push_back(std::move(m));
  }
  return jinja::Value::make_list(std::move(l));
}

std::string render_prefix(const ChatExample& ex, std::size_t n, const ChatFormat& f, bool gen, const std::string& where) {
  jinja::Value ctx = jinja::Value::make_dict();
  for (const auto& [k, v] : *f.specials.dict) ctx.set(k, v);
  ctx.set("messages", messages_value(ex, n));
  ctx.set("add_generation_prompt", jinja::Value::boolean(gen));
  ctx.set("tools", jinja::Value::none());
  ctx.set("documents", jinja::Value::none());
  try {
    return jinja::render(*f.tmpl, ctx);
  } catch (const jinja::RenderError& e) {
    throw ConfigError(where + ": the chat template (" + f.reason + ") failed: " + e.what());
  }
}

}  // namespace

ChatTemplate parse_chat_template_name(const std::string& v, const std::string& what) {
  for (ChatTemplate t : {ChatTemplate::automatic, ChatTemplate::model, ChatTemplate::llama3, ChatTemplate::chatml,
                         ChatTemplate::qwen2, ChatTemplate::none})
    if (v == chat_template_name(t)) return t;
  throw ConfigError(what + ": '" + v + "' is not a chat template (auto, model, llama3, chatml, qwen2, none)");
}

std::vector<std::uint32_t> encode_generation_prompt(const std::string& text, const Tokenizer& tok,
                                                    const PromptOptions& o) {
  if (!o.chat) {
    if (!o.bos) return tok.encode(text, o.special);
    return tok.encode_prompt(text, o.special);
  }
  ChatExample ex;
  if (!o.system.empty()) ex.push_back({"system", o.system});
  ex.push_back({"user", text});
  return chat_prompt_ids(ex, *o.chat, tok, o.bos);
}

std::string builtin_chat_template(ChatTemplate t) {
  switch (t) {
    case ChatTemplate::llama3: return kLlama3;
    case ChatTemplate::chatml: return kChatml;
    case ChatTemplate::qwen2: return kQwen2;
    default: return "";
  }
}

std::optional<std::string> folder_chat_template(const std::string& path, const std::string& what,
                                                std::string* source) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path dir(path);
  if (!fs::is_directory(dir, ec)) dir = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
  if (fs::exists(dir / "chat_template.jinja", ec)) {
    if (source) *source = (dir / "chat_template.jinja").string();
    return read_input_text((dir / "chat_template.jinja").string(), what);
  }
  const std::optional<json> tc = read_folder_json(dir / "tokenizer_config.json", what);
  if (!tc || !tc->is_object() || !tc->contains("chat_template") || (*tc)["chat_template"].is_null())
    return std::nullopt;
  const std::string file = (dir / "tokenizer_config.json").string();
  if (source) *source = file + " chat_template";
  const json& ct = (*tc)["chat_template"];
  if (ct.is_string()) return ct.get<std::string>();
  if (ct.is_array()) {
    for (const json& e : ct)
      if (e.is_object() && e.value("name", json()) == "default" && e.contains("template") && e["template"].is_string())
        return e["template"].get<std::string>();
    throw ConfigError(what + " " + file + ": chat_template is a list without an entry named \"default\"",
                      "choose a built-in format with " + what);
  }
  throw ConfigError(what + " " + file + ": chat_template must be a string or a list of {\"name\", \"template\"}");
}

ChatFormat chat_format(ChatTemplate t, const std::string& path, const Tokenizer& tok, const std::string& what) {
  ChatFormat f;
  if (t == ChatTemplate::automatic) {
    t = path.empty() ? ChatTemplate::none : detect_chat_template(path, &f.reason);
    if (path.empty()) f.reason = "no model folder";
  } else {
    f.reason = what + " " + chat_template_name(t);
  }
  f.kind = t;
  check_chat_markers(t, tok, what);
  if (t == ChatTemplate::none) {
    f.bos = tok.bos_id();
    if (const auto e = tok.eos_ids(); !e.empty()) f.eos = e.front();
    return f;
  }
  std::string text;
  if (t == ChatTemplate::model) {
    std::string source;
    const auto found = path.empty() ? std::nullopt : folder_chat_template(path, what, &source);
    if (!found)
      throw ConfigError(what + " model: " + (path.empty() ? std::string("there is no model folder") : path + " has no chat template (chat_template.jinja or tokenizer_config.json's chat_template)"),
                        "choose a built-in format: llama3, chatml, qwen2 or none");
    text = *found;
    if (f.reason.find(source) == std::string::npos) f.reason += " (" + source + ")";
    f.tmpl = jinja::compile(text, what + " " + source);
  } else {
    f.tmpl = jinja::compile(builtin_chat_template(t), what + " " + chat_template_name(t));
  }
  f.specials = folder_specials(path, what);
  if (t == ChatTemplate::llama3 && !f.specials.get("bos_token").defined())
    f.specials.set("bos_token", jinja::Value::str("<|begin_of_text|>"));
  f.end_ids = tok.eos_ids();
  if (const char* m = end_marker(t))
    if (const auto id = tok.token_id(m)) f.end_ids.push_back(*id);
  return f;
}

RenderedChat render_chat(const ChatExample& ex, const ChatFormat& f, bool generation_prompt, const std::string& where) {
  RenderedChat r;
  if (!f.tmpl) throw Error("render_chat: the format " + chat_template_name(f.kind) + " has no template");
  r.text = render_prefix(ex, ex.size(), f, generation_prompt, where);
  if (generation_prompt) return r;
  for (std::size_t i = 0; i < ex.size(); ++i) {
    if (ex[i].role != "assistant") continue;
    const std::string upto = i + 1 == ex.size() ? r.text : render_prefix(ex, i + 1, f, false, where);
    std::string before;
    bool rendered = true;
    try {
      before = render_prefix(ex, i, f, true, where);
    } catch (const ConfigError&) {
      if (i > 0) throw;
      rendered = false;  // no messages at all: a template may index messages[0]
    }
    if (!rendered || upto.compare(0, before.size(), before) != 0) {
      // The generation prompt does not lead into the turn (Llama 3's opens with BOS only once there
      // is a message): the text before a stand-in content, where that is a prefix, marks the start.
      ChatExample probe(ex.begin(), ex.begin() + static_cast<std::ptrdiff_t>(i) + 1);
      probe.back().content = "\x01zinf-assistant-turn\x01";
      const std::string p = render_prefix(probe, probe.size(), f, false, where);
      const std::size_t at = p.find(probe.back().content);
      if (at != std::string::npos && upto.compare(0, at, p, 0, at) == 0)
        before = p.substr(0, at);
      else if (!rendered)
        throw ConfigError(where + ": the chat template (" + f.reason +
                              ") renders no generation prompt for a conversation that opens with the assistant",
                          "start the example with a system or user message");
    }
    if (upto.compare(0, before.size(), before) != 0 || r.text.compare(0, upto.size(), upto) != 0)
      throw ConfigError(where + ": the chat template (" + f.reason + ") renders message " + std::to_string(i + 1) +
                            " differently once later messages follow, so zinf cannot find the assistant turns to "
                            "train on",
                        "use a built-in format (llama3, chatml, qwen2) or a template that renders turn by turn");
    if (upto.size() > before.size()) r.spans.emplace_back(before.size(), upto.size());
  }
  return r;
}

namespace {

// The "none" format: BOS, the contents, EOS after each assistant content; content text only.
TokenizedExample tokenize_plain(const ChatExample& ex, const ChatFormat& f, const Tokenizer& tok, bool bos,
                                bool targets) {
  TokenizedExample out;
  if (bos && f.bos) {
    out.ids.push_back(*f.bos);
    out.target.push_back(false);
  }
  for (const ChatMessage& m : ex) {
    const bool a = targets && m.role == "assistant";
    if (!m.content.empty()) {
      const std::vector<std::uint32_t> ids = tok.encode(m.content, false);
      out.ids.insert(out.ids.end(), ids.begin(), ids.end());
      out.target.insert(out.target.end(), ids.size(), a);
    }
    if (a && f.eos) {
      out.ids.push_back(*f.eos);
      out.target.push_back(true);
    }
  }
  return out;
}

}  // namespace

TokenizedExample tokenize_chat(const ChatExample& ex, const ChatFormat& f, const Tokenizer& tok,
                               const std::string& where) {
  if (f.kind == ChatTemplate::none) return tokenize_plain(ex, f, tok, true, true);
  const RenderedChat r = render_chat(ex, f, false, where);
  TokenizedExample out;
  std::vector<std::size_t> ends;
  out.ids = tok.encode_with_ends(r.text, true, ends);
  out.target.assign(out.ids.size(), false);
  // A token ends a turn when it ends generation (f.end_ids) or is a special token: its text, encoded
  // with special tokens on, is that one token, and without them is not.
  std::unordered_map<std::uint32_t, bool> special;
  const auto ends_turn = [&](std::uint32_t id) {
    if (std::find(f.end_ids.begin(), f.end_ids.end(), id) != f.end_ids.end()) return true;
    const auto it = special.find(id);
    if (it != special.end()) return it->second;
    const std::string text = tok.decode({id});
    const std::vector<std::uint32_t> one = {id};
    const bool s = !text.empty() && tok.encode(text, true) == one && tok.encode(text, false) != one;
    special.emplace(id, s);
    return s;
  };
  // Token k covers [ends[k-1], ends[k]); it is trained when that overlaps a span, up to the span's
  // last end-of-turn token.
  std::size_t k = 0;
  for (const auto& [b, e] : r.spans) {
    while (k < out.ids.size() && ends[k] <= b) ++k;
    std::size_t first = k, last = k;  // [first, last): the tokens overlapping the span
    while (last < out.ids.size() && (last == 0 ? 0 : ends[last - 1]) < e) ++last;
    std::size_t stop = last;
    for (std::size_t j = last; j > first; --j)
      if (ends_turn(out.ids[j - 1])) {
        stop = j;
        break;
      }
    for (std::size_t j = first; j < stop; ++j) out.target[j] = true;
    k = last;
  }
  return out;
}

std::vector<std::uint32_t> chat_prompt_ids(const ChatExample& ex, const ChatFormat& f, const Tokenizer& tok, bool bos) {
  if (f.kind == ChatTemplate::none) return tokenize_plain(ex, f, tok, bos, false).ids;
  return tok.encode(render_chat(ex, f, true).text, true);
}

ChatTemplate detect_chat_template(const std::string& path, std::string* why) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path dir(path);
  if (!fs::is_directory(dir, ec)) dir = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
  auto say = [&](const std::string& s) {
    if (why) *why = s;
  };
  std::string source;
  if (folder_chat_template(dir.string(), "data.chat_template", &source)) {
    say("the model folder's template, " + source);
    return ChatTemplate::model;
  }
  const std::optional<json> cfg = read_folder_json(dir / "config.json", "data.chat_template");
  if (cfg && cfg->is_object() && cfg->contains("model_type") && (*cfg)["model_type"].is_string() &&
      (*cfg)["model_type"].get<std::string>() == "qwen2") {
    say("config.json's model_type is qwen2, and the folder has no chat template");
    return ChatTemplate::qwen2;
  }
  // A Llama folder without a chat template is Llama 2 or a base model: neither has chat markers.
  say("no chat template in " + dir.string());
  return ChatTemplate::none;
}

void InstructSet::write(std::size_t i, int* inputs, int* targets) const {
  const ExampleWindow& w = windows[i];
  const std::size_t n = w.inputs.size(), T = static_cast<std::size_t>(seq_len);
  std::copy(w.inputs.begin(), w.inputs.end(), inputs);
  std::copy(w.targets.begin(), w.targets.end(), targets);
  std::fill(inputs + n, inputs + T, pad);
  std::fill(targets + n, targets + T, kIgnoreTarget);
}

void check_chat_markers(ChatTemplate t, const Tokenizer& tok, const std::string& what) {
  const std::vector<const char*> markers =
      t == ChatTemplate::llama3
          ? std::vector<const char*>{"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}
      : t == ChatTemplate::chatml || t == ChatTemplate::qwen2 ? std::vector<const char*>{"<|im_start|>", "<|im_end|>"}
                                  : std::vector<const char*>{};
  for (const char* m : markers)
    if (!tok.token_id(m))
      throw ConfigError(what + " " + chat_template_name(t) + ": the tokenizer (" + tok.description() +
                            ") has no special token " + m,
                        "use the template of the model's family, or " + what + " none");
}

InstructSet make_instruct_windows(const std::vector<ChatExample>& examples, const ChatFormat& f, const Tokenizer& tok,
                                  int seq_len, std::uint32_t pad) {
  InstructSet set;
  set.chat_template = f.kind;
  set.template_reason = f.reason;
  set.seq_len = seq_len;
  set.pad = static_cast<std::int32_t>(pad);
  set.examples = examples.size();
  const auto T = static_cast<std::size_t>(seq_len);
  for (std::size_t e = 0; e < examples.size(); ++e) {
    const ChatExample& ex = examples[e];
    TokenizedExample te = tokenize_chat(ex, f, tok, "example " + std::to_string(e + 1));
    if (te.ids.size() > T + 1) {  // T positions predict tokens 1..T
      ++set.truncated;
      te.ids.resize(T + 1);
      te.target.resize(T + 1);
    }
    ExampleWindow w;
    const std::size_t n = te.ids.empty() ? 0 : te.ids.size() - 1;
    w.inputs.resize(n);
    w.targets.assign(n, kIgnoreTarget);
    for (std::size_t i = 0; i < n; ++i) {
      w.inputs[i] = static_cast<std::int32_t>(te.ids[i]);
      if (te.target[i + 1]) {
        w.targets[i] = static_cast<std::int32_t>(te.ids[i + 1]);
        ++w.target_count;
      }
    }
    if (w.target_count == 0) {
      ++set.dropped;
      continue;
    }
    set.windows.push_back(std::move(w));
  }
  set.train_count = set.windows.size();
  return set;
}

}  // namespace zinf
