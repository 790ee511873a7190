// instruct.cpp — JSONL chat examples, chat templates and loss masks (io/instruct.h).
#include "io/instruct.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

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

std::vector<ChatPiece> render_chat(const ChatExample& ex, ChatTemplate t, std::optional<std::uint32_t> bos,
                                   std::optional<std::uint32_t> eos) {
  std::vector<ChatPiece> p;
  switch (t) {
    case ChatTemplate::llama3:
      p.push_back({"<|begin_of_text|>", true, false, std::nullopt});
      for (const ChatMessage& m : ex) {
        const bool a = m.role == "assistant";
        p.push_back({"<|start_header_id|>" + m.role + "<|end_header_id|>\n\n", true, false, std::nullopt});
        p.push_back({m.content, false, a, std::nullopt});
        p.push_back({"<|eot_id|>", true, a, std::nullopt});
      }
      break;
    case ChatTemplate::chatml:
      for (const ChatMessage& m : ex) {
        const bool a = m.role == "assistant";
        p.push_back({"<|im_start|>" + m.role + "\n", true, false, std::nullopt});
        p.push_back({m.content, false, a, std::nullopt});
        p.push_back({"<|im_end|>", true, a, std::nullopt});
        p.push_back({"\n", true, false, std::nullopt});
      }
      break;
    case ChatTemplate::none:
    case ChatTemplate::automatic:  // resolved by the caller; rendered as none if not
      if (bos) p.push_back({"", true, false, bos});
      for (const ChatMessage& m : ex) {
        const bool a = m.role == "assistant";
        p.push_back({m.content, false, a, std::nullopt});
        if (a && eos) p.push_back({"", true, true, eos});
      }
      break;
  }
  return p;
}

std::vector<ChatPiece> render_generation_prompt(const ChatExample& ex, ChatTemplate t,
                                                std::optional<std::uint32_t> bos) {
  std::vector<ChatPiece> p = render_chat(ex, t, bos, std::nullopt);
  if (t == ChatTemplate::llama3)
    p.push_back({"<|start_header_id|>assistant<|end_header_id|>\n\n", true, false, std::nullopt});
  if (t == ChatTemplate::chatml) p.push_back({"<|im_start|>assistant\n", true, false, std::nullopt});
  for (ChatPiece& piece : p) piece.target = false;
  return p;
}

TokenizedExample tokenize_chat(const std::vector<ChatPiece>& pieces, const Tokenizer& tok) {
  TokenizedExample out;
  for (const ChatPiece& p : pieces) {
    if (p.id) {
      out.ids.push_back(*p.id);
      out.target.push_back(p.target);
      continue;
    }
    if (p.text.empty()) continue;
    const std::vector<std::uint32_t> ids = tok.encode(p.text, p.special);
    out.ids.insert(out.ids.end(), ids.begin(), ids.end());
    out.target.insert(out.target.end(), ids.size(), p.target);
  }
  return out;
}

ChatTemplate detect_chat_template(const std::string& path, std::string* why) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path dir(path);
  if (!fs::is_directory(dir, ec)) dir = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
  auto say = [&](const std::string& s) {
    if (why) *why = s;
  };
  const std::optional<json> tc = read_folder_json(dir / "tokenizer_config.json", "data.chat_template");
  if (tc && tc->is_object() && tc->contains("chat_template")) {
    // A string, or a list of {"name", "template"} (several templates, one of them the default).
    std::string text;
    const json& ct = (*tc)["chat_template"];
    if (ct.is_string()) text = ct.get<std::string>();
    if (ct.is_array())
      for (const json& e : ct)
        if (e.is_object() && e.contains("template") && e["template"].is_string())
          text += e["template"].get<std::string>();
    if (text.find("<|start_header_id|>") != std::string::npos) {
      say("tokenizer_config.json's chat_template uses <|start_header_id|>");
      return ChatTemplate::llama3;
    }
    if (text.find("<|im_start|>") != std::string::npos) {
      say("tokenizer_config.json's chat_template uses <|im_start|>");
      return ChatTemplate::chatml;
    }
    say("tokenizer_config.json's chat_template has neither Llama 3 nor ChatML markers");
    return ChatTemplate::none;
  }
  const std::optional<json> cfg = read_folder_json(dir / "config.json", "data.chat_template");
  if (cfg && cfg->is_object() && cfg->contains("model_type") && (*cfg)["model_type"].is_string() &&
      (*cfg)["model_type"].get<std::string>() == "qwen2") {
    say("config.json's model_type is qwen2");
    return ChatTemplate::chatml;
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
      : t == ChatTemplate::chatml ? std::vector<const char*>{"<|im_start|>", "<|im_end|>"}
                                  : std::vector<const char*>{};
  for (const char* m : markers)
    if (!tok.token_id(m))
      throw ConfigError(what + " " + chat_template_name(t) + ": the tokenizer (" + tok.description() +
                            ") has no special token " + m,
                        "use the template of the model's family, or " + what + " none");
}

InstructSet make_instruct_windows(const std::vector<ChatExample>& examples, ChatTemplate t, const Tokenizer& tok,
                                  int seq_len, std::uint32_t pad) {
  InstructSet set;
  set.chat_template = t;
  set.seq_len = seq_len;
  set.pad = static_cast<std::int32_t>(pad);
  set.examples = examples.size();
  std::optional<std::uint32_t> bos, eos;
  if (t == ChatTemplate::none) {
    bos = tok.bos_id();
    if (const auto e = tok.eos_ids(); !e.empty()) eos = e.front();
  }
  check_chat_markers(t, tok, "data.chat_template");
  const auto T = static_cast<std::size_t>(seq_len);
  for (const ChatExample& ex : examples) {
    TokenizedExample te = tokenize_chat(render_chat(ex, t, bos, eos), tok);
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
