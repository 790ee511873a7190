// tokenize.cpp — the byte and SentencePiece tokenizers (byte-level BPE: io/bpe.cpp), open_tokenizer (io/tokenizer.h),
// and llm.c token files (io/data.h).
#include <sentencepiece_processor.h>
#include <utf8proc.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "io/bpe.h"
#include "io/data.h"
#include "io/files.h"
#include "io/tokenizer.h"
#include "zinf/error.h"

namespace zinf {

namespace {

// SentencePiece's status text carries its source location and the failed expression
// ("./src/sentencepiece_processor.cc(232) [model_proto->ParseFromArray(...)] "); a user needs neither.
std::string status_text(const sentencepiece::util::Status& st) {
  std::string m(st.message());
  // Cut "FILE.cc(LINE) [EXPR] " (EXPR may hold brackets: up to the last ']'). No std::regex: GCC 12's
  // <regex> trips -Wmaybe-uninitialized in sanitizer builds.
  const auto cc = m.find(".cc(");
  const auto open = cc == std::string::npos ? cc : m.find(") [", cc);
  const auto close = m.rfind(']');
  if (open != std::string::npos && close != std::string::npos && close > open) {
    const auto space = m.find_last_of(" [", cc);
    const std::size_t begin = space == std::string::npos ? 0 : space + 1;
    std::size_t end = close + 1;
    if (end < m.size() && m[end] == ' ') ++end;
    m.erase(begin, end - begin);
  }
  while (!m.empty() && (m.back() == ' ' || m.back() == '\n')) m.pop_back();
  return m;
}

}  // namespace

std::vector<std::uint32_t> sentencepiece_encode(const std::string& model_path, std::string_view text, int* vocab,
                                                const std::string& what) {
  // Read here, not by the library: only a regular file is read (see InputFile), and a bad file is
  // zinf's one line rather than the library's.
  const std::string bytes = read_input_file(model_path, what);
  sentencepiece::SentencePieceProcessor sp;
  const auto st = sp.LoadFromSerializedProto(bytes);
  if (!st.ok()) {
    const std::string why = status_text(st);
    throw ConfigError(what + " " + model_path + ": not a SentencePiece model (" +
                          (why.empty() ? "it does not parse as one" : why) + ")",
                      "give the tokenizer.model file that came with the model");
  }
  std::vector<int> ids;
  const auto enc = sp.Encode(text, &ids);
  if (!enc.ok()) throw Error(what + " " + model_path + ": tokenizing failed: " + status_text(enc));
  if (vocab) *vocab = sp.GetPieceSize();
  return std::vector<std::uint32_t>(ids.begin(), ids.end());
}

namespace {

class ByteTokenizer final : public Tokenizer {
 public:
  std::string kind() const override { return "bytes"; }
  std::vector<std::uint32_t> encode(std::string_view text, bool) const override {
    return std::vector<std::uint32_t>(reinterpret_cast<const unsigned char*>(text.data()),
                                      reinterpret_cast<const unsigned char*>(text.data()) + text.size());
  }
  std::string decode(const std::vector<std::uint32_t>& ids) const override {
    std::string out;
    out.reserve(ids.size());
    for (std::uint32_t id : ids) {
      if (id > 255) throw Error("bytes tokenizer: id " + std::to_string(id) + " is not a byte (vocabulary 256)");
      out.push_back(static_cast<char>(id));
    }
    return out;
  }
  int vocab_size() const override { return 256; }
  std::optional<std::uint32_t> token_id(std::string_view piece) const override {
    if (piece.size() == 1) return static_cast<unsigned char>(piece[0]);
    return std::nullopt;
  }
  std::string description() const override { return "bytes (vocabulary 256)"; }
};

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(const std::string& path, const std::string& what) : path_(path) {
    const std::string bytes = read_input_file(path, what);
    const auto st = sp_.LoadFromSerializedProto(bytes);
    if (!st.ok()) {
      const std::string why = status_text(st);
      throw ConfigError(
          what + " " + path + ": not a SentencePiece model (" + (why.empty() ? "it does not parse as one" : why) + ")",
          "give the tokenizer.model file that came with the model");
    }
    for (int id = 0; id < sp_.GetPieceSize(); ++id)
      if (sp_.IsControl(id) && !sp_.IdToPiece(id).empty()) specials_.emplace_back(sp_.IdToPiece(id), id);
  }
  std::string kind() const override { return "sentencepiece"; }
  std::vector<std::uint32_t> encode(std::string_view text, bool special) const override {
    std::vector<std::uint32_t> out;
    if (!special) {
      encode_plain(text, out);
      return out;
    }
    // Control pieces written in the text ("<s>", "</s>") become their ids; the text between them is
    // encoded as plain text (SentencePiece matches user-defined pieces itself).
    split_at_specials(
        text, [&](std::size_t from, std::size_t to) { encode_plain(text.substr(from, to - from), out); },
        [&](int id, std::size_t) { out.push_back(static_cast<std::uint32_t>(id)); });
    return out;
  }
  std::vector<std::uint32_t> encode_with_ends(std::string_view text, bool special,
                                              std::vector<std::size_t>& ends) const override {
    std::vector<std::uint32_t> out;
    ends.clear();
    const auto plain = [&](std::size_t from, std::size_t to) {
      if (to <= from) return;
      const auto spt = sp_.EncodeAsImmutableProto(text.substr(from, to - from));
      for (const auto& p : spt.pieces()) {
        out.push_back(p.id());
        ends.push_back(from + p.end());
      }
    };
    if (!special) {
      plain(0, text.size());
      return out;
    }
    split_at_specials(text, plain, [&](int id, std::size_t end) {
      out.push_back(static_cast<std::uint32_t>(id));
      ends.push_back(end);
    });
    return out;
  }
  std::vector<std::uint32_t> prompt_prefix() const override {
    if (sp_.bos_id() < 0) return {};
    return {static_cast<std::uint32_t>(sp_.bos_id())};
  }
  std::string decode(const std::vector<std::uint32_t>& ids) const override {
    std::vector<int> v;
    v.reserve(ids.size());
    for (std::uint32_t id : ids) {
      if (id >= static_cast<std::uint32_t>(sp_.GetPieceSize()))
        throw Error(path_ + ": id " + std::to_string(id) + " is outside the vocabulary (" +
                    std::to_string(sp_.GetPieceSize()) + ")");
      v.push_back(static_cast<int>(id));
    }
    std::string out;
    const auto st = sp_.Decode(v, &out);
    if (!st.ok()) throw Error(path_ + ": decoding failed: " + status_text(st));
    return out;
  }
  int vocab_size() const override { return sp_.GetPieceSize(); }
  std::optional<std::uint32_t> token_id(std::string_view piece) const override {
    const int id = sp_.PieceToId(piece);
    if (id < 0 || (id == sp_.unk_id() && piece != sp_.IdToPiece(sp_.unk_id()))) return std::nullopt;
    return static_cast<std::uint32_t>(id);
  }
  std::optional<std::uint32_t> bos_id() const override {
    return sp_.bos_id() >= 0 ? std::optional<std::uint32_t>(static_cast<std::uint32_t>(sp_.bos_id())) : std::nullopt;
  }
  std::vector<std::uint32_t> eos_ids() const override {
    if (sp_.eos_id() < 0) return {};
    return {static_cast<std::uint32_t>(sp_.eos_id())};
  }
  std::string description() const override {
    return path_ + " (SentencePiece, " + std::to_string(sp_.GetPieceSize()) + " pieces)";
  }

 private:
  // Splits `text` at the control pieces written in it, the longest that starts at each position:
  // plain(from, to) for each stretch between them (possibly empty), control(id, end) for each piece, in
  // text order.
  template <class Plain, class Control>
  void split_at_specials(std::string_view text, Plain&& plain, Control&& control) const {
    std::size_t start = 0, i = 0;
    while (i < text.size()) {
      std::size_t best = 0;
      int best_id = -1;
      for (const auto& [p, id] : specials_)
        if (p.size() > best && text.substr(i, p.size()) == p) best = p.size(), best_id = id;
      if (best_id < 0) {
        ++i;
        continue;
      }
      plain(start, i);
      i += best;
      control(best_id, i);
      start = i;
    }
    plain(start, text.size());
  }
  void encode_plain(std::string_view text, std::vector<std::uint32_t>& out) const {
    if (text.empty()) return;
    std::vector<int> ids;
    const auto enc = sp_.Encode(text, &ids);
    if (!enc.ok()) throw Error(path_ + ": tokenizing failed: " + status_text(enc));
    out.insert(out.end(), ids.begin(), ids.end());
  }
  std::string path_;
  sentencepiece::SentencePieceProcessor sp_;
  std::vector<std::pair<std::string, int>> specials_;  // control pieces with their ids
};

}  // namespace

std::unique_ptr<Tokenizer> byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

namespace {

// NFC of `s` (utf8proc); `s` itself when it is not valid UTF-8.
std::string nfc(std::string_view s) {
  utf8proc_uint8_t* res = nullptr;
  const auto len = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()),
                                &res, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  std::string out = len < 0 ? std::string(s) : std::string(reinterpret_cast<const char*>(res), static_cast<std::size_t>(len));
  std::free(res);
  return out;
}

}  // namespace

std::vector<std::uint32_t> Tokenizer::encode_with_ends(std::string_view text, bool special,
                                                       std::vector<std::size_t>& ends) const {
  std::vector<std::uint32_t> ids = encode(text, special);
  ends.assign(ids.size(), 0);
  std::size_t at = 0;
  for (std::size_t k = 0; k < ids.size(); ++k) {
    at += decode({ids[k]}).size();
    ends[k] = at;
  }
  if (at == text.size()) return ids;
  // A normalizer changed the text: the ends above count normalized bytes. Map them back at the
  // places where normalizing the text piecewise gives the same as normalizing it whole: before
  // each ASCII byte (NFC never joins an ASCII character to the one before it), and inside a run of
  // other characters at each character boundary where the run's NFC is the NFC of its two sides.
  std::vector<std::pair<std::size_t, std::size_t>> anchors = {{0, 0}};  // (normalized, original)
  std::size_t norm = 0, q = 0;
  std::size_t run_end = 0;   // the next ASCII byte (or the end) at or after p
  std::string run_nfc;       // NFC of text[q, run_end)
  for (std::size_t p = 1; p <= text.size(); ++p) {
    const bool ascii = p == text.size() || static_cast<unsigned char>(text[p]) < 0x80;
    if (!ascii && (static_cast<unsigned char>(text[p]) & 0xC0) == 0x80) continue;  // inside a character
    if (!ascii) {
      if (run_end <= p) {
        run_end = p;
        while (run_end < text.size() && static_cast<unsigned char>(text[run_end]) >= 0x80) ++run_end;
        run_nfc.clear();
      }
      if (run_nfc.empty()) run_nfc = nfc(text.substr(q, run_end - q));
      const std::string left = nfc(text.substr(q, p - q));
      if (run_nfc != left + nfc(text.substr(p, run_end - p))) continue;
      norm += left.size();
      run_nfc.erase(0, left.size());
    } else {
      norm += nfc(text.substr(q, p - q)).size();
      run_nfc.clear();
    }
    q = p;
    anchors.emplace_back(norm, p);
  }
  std::size_t a = 0;
  for (std::size_t& e : ends) {
    while (a + 1 < anchors.size() && anchors[a].first < e) ++a;  // the first anchor at or past e
    e = anchors[a].second;
  }
  return ids;
}

std::vector<std::uint32_t> Tokenizer::encode_prompt(std::string_view text, bool special) const {
  std::vector<std::uint32_t> ids = prompt_prefix();
  const std::vector<std::uint32_t> body = encode(text, special);
  ids.insert(ids.end(), body.begin(), body.end());
  const std::vector<std::uint32_t> suffix = prompt_suffix();
  ids.insert(ids.end(), suffix.begin(), suffix.end());
  return ids;
}

namespace {

// A tokenizer with the BOS/EOS its model folder names (tokenizer_config.json, generation_config.json).
class FolderTokenizer final : public Tokenizer {
 public:
  FolderTokenizer(std::unique_ptr<Tokenizer> t, std::optional<std::uint32_t> bos, std::vector<std::uint32_t> eos,
                  std::vector<std::uint32_t> prefix, std::vector<std::uint32_t> suffix)
      : t_(std::move(t)), bos_(bos), eos_(std::move(eos)), prefix_(std::move(prefix)), suffix_(std::move(suffix)) {}
  std::string kind() const override { return t_->kind(); }
  std::vector<std::uint32_t> encode(std::string_view text, bool special) const override {
    return t_->encode(text, special);
  }
  std::vector<std::uint32_t> encode_with_ends(std::string_view text, bool special,
                                              std::vector<std::size_t>& ends) const override {
    return t_->encode_with_ends(text, special, ends);
  }
  std::vector<std::uint32_t> prompt_prefix() const override { return prefix_; }
  std::vector<std::uint32_t> prompt_suffix() const override { return suffix_; }
  std::string decode(const std::vector<std::uint32_t>& ids) const override { return t_->decode(ids); }
  int vocab_size() const override { return t_->vocab_size(); }
  std::optional<std::uint32_t> token_id(std::string_view piece) const override { return t_->token_id(piece); }
  std::optional<std::uint32_t> bos_id() const override { return bos_; }
  std::vector<std::uint32_t> eos_ids() const override { return eos_; }
  std::string description() const override { return t_->description(); }
  const Tokenizer& inner() const { return *t_; }

 private:
  std::unique_ptr<Tokenizer> t_;
  std::optional<std::uint32_t> bos_;
  std::vector<std::uint32_t> eos_;
  std::vector<std::uint32_t> prefix_, suffix_;
};

// BOS/EOS named by a model folder: tokenizer_config.json's bos_token/eos_token (a string or
// {"content": …}) and generation_config.json's bos_token_id/eos_token_id (an id or a list of ids).
// What the folder does not name keeps the tokenizer's own.
std::unique_ptr<Tokenizer> with_folder_specials(std::unique_ptr<Tokenizer> t, const std::filesystem::path& dir,
                                                const std::string& what) {
  std::optional<std::uint32_t> bos = t->bos_id();
  std::vector<std::uint32_t> eos = t->eos_ids();
  const auto add_eos = [&](std::uint32_t id) {
    if (std::find(eos.begin(), eos.end(), id) == eos.end()) eos.push_back(id);
  };
  const auto id_of = [&](const nlohmann::json& v, const std::string& where) -> std::optional<std::uint32_t> {
    std::string text;
    if (v.is_string())
      text = v.get<std::string>();
    else if (v.is_object() && v.contains("content") && v["content"].is_string())
      text = v["content"].get<std::string>();
    else
      return std::nullopt;  // null: the model has none
    const auto id = t->token_id(text);
    if (!id) throw ConfigError(what + " " + where + ": the token " + text + " is not in the tokenizer's vocabulary");
    return id;
  };
  const auto check_id = [&](const nlohmann::json& v, const std::string& where) {
    if (!v.is_number_integer() || v.get<std::int64_t>() < 0 || v.get<std::int64_t>() >= t->vocab_size())
      throw ConfigError(what + " " + where + ": " + v.dump() + " is not an id below the vocabulary size " +
                        std::to_string(t->vocab_size()));
    return v.get<std::uint32_t>();
  };
  bool eos_named = false;
  // The post-processor's tokens; tokenizer_config.json's add_bos_token / add_eos_token, when either is
  // given, replace them with [bos_token] TEXT [eos_token] as each says (transformers' rule).
  std::vector<std::uint32_t> prefix = t->prompt_prefix(), suffix = t->prompt_suffix();
  if (const auto tc = read_folder_json(dir / "tokenizer_config.json", what); tc && tc->is_object()) {
    const std::string where = (dir / "tokenizer_config.json").string();
    const auto flag = [&](const char* key) -> std::optional<bool> {
      if (!tc->contains(key) || (*tc)[key].is_null()) return std::nullopt;
      if (!(*tc)[key].is_boolean()) throw ConfigError(what + " " + where + " " + key + ": must be true or false");
      return (*tc)[key].get<bool>();
    };
    const std::optional<bool> bos_flag = flag("add_bos_token"), eos_flag = flag("add_eos_token");
    if (bos_flag || eos_flag) {
      prefix.clear();
      suffix.clear();
      std::optional<std::uint32_t> b, e;
      if (tc->contains("bos_token")) b = id_of((*tc)["bos_token"], where + " bos_token");
      if (tc->contains("eos_token")) e = id_of((*tc)["eos_token"], where + " eos_token");
      if (bos_flag.value_or(false) && b) prefix.push_back(*b);
      if (eos_flag.value_or(false) && e) suffix.push_back(*e);
    }
    if (tc->contains("bos_token"))
      if (auto id = id_of((*tc)["bos_token"], where + " bos_token")) bos = id;
    if (tc->contains("eos_token"))
      if (auto id = id_of((*tc)["eos_token"], where + " eos_token")) {
        eos = {*id};
        eos_named = true;
      }
  }
  if (const auto gc = read_folder_json(dir / "generation_config.json", what); gc && gc->is_object()) {
    const std::string where = (dir / "generation_config.json").string();
    if (gc->contains("bos_token_id") && !(*gc)["bos_token_id"].is_null())
      bos = check_id((*gc)["bos_token_id"], where + " bos_token_id");
    if (gc->contains("eos_token_id") && !(*gc)["eos_token_id"].is_null()) {
      const auto& e = (*gc)["eos_token_id"];
      if (!eos_named) eos.clear();
      if (e.is_array())
        for (const auto& v : e) add_eos(check_id(v, where + " eos_token_id"));
      else
        add_eos(check_id(e, where + " eos_token_id"));
    }
  }
  return std::make_unique<FolderTokenizer>(std::move(t), bos, std::move(eos), std::move(prefix), std::move(suffix));
}

}  // namespace

std::unique_ptr<Tokenizer> open_tokenizer(const std::string& path, const std::string& what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string file = path;
  const bool folder = fs::is_directory(path, ec);
  if (folder) {
    const fs::path dir(path);
    if (fs::exists(dir / "tokenizer.json", ec))
      file = (dir / "tokenizer.json").string();
    else if (fs::exists(dir / "tokenizer.model", ec))
      file = (dir / "tokenizer.model").string();
    else
      throw ConfigError(what + " " + path + ": the folder holds neither tokenizer.json nor tokenizer.model",
                        "give the model folder the tokenizer came with, or the tokenizer file itself");
  }
  std::unique_ptr<Tokenizer> t;
  if (file.size() >= 5 && file.compare(file.size() - 5, 5, ".json") == 0)
    t = open_bpe_tokenizer(file, what);
  else
    t = std::make_unique<SentencePieceTokenizer>(file, what);
  if (folder) t = with_folder_specials(std::move(t), fs::path(path), what);
  return t;
}

int write_token_file(const std::string& path, const std::vector<std::uint32_t>& tokens) {
  if (tokens.size() > static_cast<std::size_t>(INT32_MAX))
    throw Error(path + ": too many tokens for one llm.c token file");
  bool narrow = true;
  for (std::uint32_t t : tokens) narrow = narrow && t <= 0xFFFF;
  std::int32_t header[256] = {};
  header[0] = narrow ? kTokensMagicU16 : kTokensMagicU32;
  header[1] = narrow ? kTokensVersionU16 : kTokensVersionU32;
  header[2] = static_cast<std::int32_t>(tokens.size());
  OutputFile f(path, "--output");  // all or nothing: a failed write leaves no file and the old one untouched
  f.write(header, sizeof header);
  if (narrow) {
    std::vector<std::uint16_t> n(tokens.begin(), tokens.end());
    f.write(n.data(), n.size() * 2);
  } else {
    f.write(tokens.data(), tokens.size() * 4);
  }
  f.commit();
  return narrow ? 2 : 4;
}

std::optional<nlohmann::json> read_folder_json(const std::filesystem::path& p, const std::string& what) {
  std::error_code ec;
  if (!std::filesystem::exists(p, ec)) return std::nullopt;
  const std::string text = read_input_text(p.string(), what);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(what + " " + p.string() + ": not JSON (" + e.what() + ")");
  }
}

}  // namespace zinf
