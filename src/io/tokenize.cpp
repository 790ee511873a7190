// tokenize.cpp — the byte and SentencePiece tokenizers (byte-level BPE: io/bpe.cpp), open_tokenizer (io/tokenizer.h),
// and llm.c token files (io/data.h).
#include <sentencepiece_processor.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
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
      encode_plain(text.substr(start, i - start), out);
      out.push_back(static_cast<std::uint32_t>(best_id));
      i += best;
      start = i;
    }
    encode_plain(text.substr(start), out);
    return out;
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

// A tokenizer with the BOS/EOS its model folder names (tokenizer_config.json, generation_config.json).
class FolderTokenizer final : public Tokenizer {
 public:
  FolderTokenizer(std::unique_ptr<Tokenizer> t, std::optional<std::uint32_t> bos, std::vector<std::uint32_t> eos)
      : t_(std::move(t)), bos_(bos), eos_(std::move(eos)) {}
  std::string kind() const override { return t_->kind(); }
  std::vector<std::uint32_t> encode(std::string_view text, bool special) const override {
    return t_->encode(text, special);
  }
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
  if (const auto tc = read_folder_json(dir / "tokenizer_config.json", what); tc && tc->is_object()) {
    const std::string where = (dir / "tokenizer_config.json").string();
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
  return std::make_unique<FolderTokenizer>(std::move(t), bos, std::move(eos));
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
