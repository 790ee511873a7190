// bpe.cpp — the Hugging Face tokenizer.json byte-level BPE tokenizer (io/bpe.h).
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <array>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <queue>
#include <unordered_map>

#include "io/bpe.h"
#include "io/files.h"
#include "zinf/error.h"

namespace zinf {

namespace {

using json = nlohmann::json;

// The split ByteLevel applies with use_regex (GPT-2's).
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

constexpr std::size_t kChunkBytes = std::size_t{1} << 20;  // parallel work unit of a large text

void append_utf8(std::string& s, std::uint32_t cp) {
  utf8proc_uint8_t buf[4];
  const auto n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(cp), buf);
  s.append(reinterpret_cast<const char*>(buf), static_cast<std::size_t>(n));
}

// Byte-level BPE writes every byte as a printable character: the printable Latin-1 bytes as
// themselves, the other 68 as U+0100 onwards in byte order.
struct ByteMap {
  std::array<std::string, 256> text;            // byte -> UTF-8 of its character
  std::unordered_map<std::uint32_t, int> byte;  // character -> byte
  ByteMap() {
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const std::uint32_t cp = printable ? static_cast<std::uint32_t>(b) : static_cast<std::uint32_t>(next++);
      append_utf8(text[static_cast<std::size_t>(b)], cp);
      byte[cp] = b;
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

// The raw bytes a vocabulary string stands for: each character back to its byte; a character outside
// the map (a piece that is not byte-level) stays as its UTF-8.
std::string unmap_bytes(const std::string& piece) {
  const auto& m = byte_map();
  std::string out;
  std::size_t i = 0;
  while (i < piece.size()) {
    utf8proc_int32_t cp = -1;
    const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(piece.data() + i),
                                    static_cast<utf8proc_ssize_t>(piece.size() - i), &cp);
    if (n <= 0) {  // not UTF-8 (JSON strings are): keep the byte
      out.push_back(piece[i++]);
      continue;
    }
    const auto it = m.byte.find(static_cast<std::uint32_t>(cp));
    if (it != m.byte.end())
      out.push_back(static_cast<char>(it->second));
    else
      out.append(piece, i, static_cast<std::size_t>(n));
    i += static_cast<std::size_t>(n);
  }
  return out;
}

// A compiled split pattern (PCRE2, JIT when the platform has it). Text that is not UTF-8 is allowed:
// its bytes never match, so they end up in the pieces between matches.
class Pattern {
 public:
  Pattern(const std::string& pattern, bool literal, const std::string& where) {
    int err = 0;
    PCRE2_SIZE off = 0;
    const std::uint32_t opts = literal ? PCRE2_LITERAL : (PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF);
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), opts, &err, &off, nullptr);
    if (!code_) {
      std::array<PCRE2_UCHAR, 256> msg{};
      pcre2_get_error_message(err, msg.data(), msg.size());
      throw ConfigError(where + ": the split pattern does not compile at offset " + std::to_string(off) + ": " +
                        reinterpret_cast<const char*>(msg.data()));
    }
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // without JIT (an error here), matching is interpreted
  }
  ~Pattern() { pcre2_code_free(code_); }
  Pattern(const Pattern&) = delete;
  Pattern& operator=(const Pattern&) = delete;

  // The pieces of subject[from, to) in the split of the whole subject: each match, and each stretch
  // between matches. Whether the cuts are piece boundaries of a scan that started at 0: *start_ok
  // is false when from > 0 and the first match does not start at `from`; *end_ok is false when a
  // match crosses `to` (given that `from` was a boundary).
  template <typename F>
  void split(std::string_view subject, std::size_t from, std::size_t to, F&& piece, bool* start_ok,
             bool* end_ok) const {
    struct Match {
      pcre2_match_data* md;
      pcre2_match_context* mc;
      pcre2_jit_stack* js;
      ~Match() {
        pcre2_match_data_free(md);
        pcre2_match_context_free(mc);
        if (js) pcre2_jit_stack_free(js);
      }
    } m{pcre2_match_data_create_from_pattern(code_, nullptr), pcre2_match_context_create(nullptr),
        pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr)};
    if (!m.md || !m.mc) throw Error("tokenizer: out of memory for the split pattern");
    if (m.js) pcre2_jit_stack_assign(m.mc, nullptr, m.js);
    const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
    std::size_t pos = from;
    bool first = true;
    *start_ok = from == 0;
    *end_ok = true;
    while (pos < to) {
      const int rc = pcre2_match(code_, s, subject.size(), pos, PCRE2_NOTEMPTY, m.md, m.mc);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        std::array<PCRE2_UCHAR, 256> msg{};
        pcre2_get_error_message(rc, msg.data(), msg.size());
        throw Error(std::string("tokenizer: the split pattern failed: ") + reinterpret_cast<const char*>(msg.data()));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(m.md);
      const std::size_t b = ov[0], e = ov[1];
      if (first && b == from) *start_ok = true;
      first = false;
      if (b >= to) break;
      if (b > pos) piece(subject.substr(pos, b - pos));
      if (e > to) *end_ok = false;
      piece(subject.substr(b, e - b));
      pos = e;
    }
    if (pos < to) piece(subject.substr(pos, to - pos));
  }

 private:
  pcre2_code* code_ = nullptr;
};

struct AddedToken {
  std::string content;
  std::uint32_t id;
  bool special;
};

// The merges: (left id, right id) -> (rank, merged id), open addressing (the lookup is the inner loop).
class MergeTable {
 public:
  struct Entry {
    std::uint64_t key = kEmpty;
    std::uint32_t rank = 0, id = 0;
  };
  void reserve(std::size_t n) {
    std::size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    slots_.assign(cap, Entry{});
    mask_ = cap - 1;
  }
  // Keeps the first rank of a pair listed twice.
  void insert(std::uint64_t key, std::uint32_t rank, std::uint32_t id) {
    for (std::size_t i = mix(key) & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return;
      if (slots_[i].key == kEmpty) {
        slots_[i] = Entry{key, rank, id};
        ++size_;
        return;
      }
    }
  }
  const Entry* find(std::uint64_t key) const {
    for (std::size_t i = mix(key) & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return &slots_[i];
      if (slots_[i].key == kEmpty) return nullptr;
    }
  }
  std::size_t size() const { return size_; }

 private:
  static constexpr std::uint64_t kEmpty = ~std::uint64_t{0};  // ids are below 2^21: never a key
  static std::size_t mix(std::uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return static_cast<std::size_t>(k);
  }
  std::vector<Entry> slots_;
  std::size_t mask_ = 0, size_ = 0;
};

// Pieces already merged, with their ids: one per thread (the tokenizer keeps them between calls),
// emptied when full. Open addressing over one buffer of keys and one of ids.
class WordCache {
 public:
  WordCache() { slots_.assign(kSlots, Slot{}); }
  // The ids of `piece` appended to `out`, or false.
  bool get(std::string_view piece, std::size_t hash, std::vector<std::uint32_t>& out) const {
    for (std::size_t i = hash & (kSlots - 1);; i = (i + 1) & (kSlots - 1)) {
      const Slot& s = slots_[i];
      if (s.key_len == 0) return false;
      if (s.hash == hash && s.key_len == piece.size() && keys_.compare(s.key_off, s.key_len, piece) == 0) {
        out.insert(out.end(), ids_.begin() + s.ids_off, ids_.begin() + s.ids_off + s.ids_len);
        return true;
      }
    }
  }
  void put(std::string_view piece, std::size_t hash, const std::uint32_t* ids, std::size_t n) {
    if (used_ >= kSlots / 2) {  // full: start again
      slots_.assign(kSlots, Slot{});
      keys_.clear();
      ids_.clear();
      used_ = 0;
    }
    std::size_t i = hash & (kSlots - 1);
    while (slots_[i].key_len != 0) i = (i + 1) & (kSlots - 1);
    slots_[i] = Slot{hash, static_cast<std::uint32_t>(keys_.size()), static_cast<std::uint32_t>(piece.size()),
                     static_cast<std::uint32_t>(ids_.size()), static_cast<std::uint32_t>(n)};
    keys_.append(piece);
    ids_.insert(ids_.end(), ids, ids + n);
    ++used_;
  }

 private:
  static constexpr std::size_t kSlots = std::size_t{1} << 17;
  struct Slot {
    std::size_t hash = 0;
    std::uint32_t key_off = 0, key_len = 0, ids_off = 0, ids_len = 0;
  };
  std::vector<Slot> slots_;
  std::string keys_;
  std::vector<std::uint32_t> ids_;
  std::size_t used_ = 0;
};

class BpeTokenizer final : public Tokenizer {
 public:
  BpeTokenizer(std::string_view text, const std::string& file, const std::string& what) : file_(file) {
    const std::string where = what + " " + file;
    json j;
    try {
      j = json::parse(text.begin(), text.end());
    } catch (const json::exception& e) {
      throw ConfigError(where + ": not JSON (" + e.what() + ")", "give the tokenizer.json that came with the model");
    }
    try {
      parse(j, where);
    } catch (const json::exception& e) {
      throw ConfigError(where + ": " + e.what(), "give the tokenizer.json that came with the model");
    }
  }

  std::string kind() const override { return "bpe"; }

  std::vector<std::uint32_t> encode(std::string_view text, bool special) const override {
    return encode_chunked(text, special, kChunkBytes);
  }

  std::vector<std::uint32_t> encode_chunked(std::string_view text, bool special, std::size_t chunk) const {
    std::vector<std::uint32_t> out;
    std::size_t start = 0, i = 0;
    const auto& first = special ? first_all_ : first_plain_;
    if (!(special ? added_all_ : added_plain_).empty()) {
      while (i < text.size()) {
        const auto& cands = first[static_cast<unsigned char>(text[i])];
        const AddedToken* hit = nullptr;
        for (const AddedToken* a : cands)  // longest first
          if (text.compare(i, a->content.size(), a->content) == 0) {
            hit = a;
            break;
          }
        if (!hit) {
          ++i;
          continue;
        }
        encode_segment(text.substr(start, i - start), out, chunk);
        out.push_back(hit->id);
        i += hit->content.size();
        start = i;
      }
    }
    encode_segment(text.substr(start), out, chunk);
    return out;
  }

  std::string decode(const std::vector<std::uint32_t>& ids) const override {
    std::string out;
    for (std::uint32_t id : ids) {
      if (id >= id_bytes_.size() || !id_known_[id])
        throw Error(file_ + ": id " + std::to_string(id) + " is not in the vocabulary (" +
                    std::to_string(id_bytes_.size()) + " ids)");
      out += id_bytes_[id];
    }
    return out;
  }

  int vocab_size() const override { return static_cast<int>(id_bytes_.size()); }

  std::optional<std::uint32_t> token_id(std::string_view piece) const override {
    for (const auto& a : added_)
      if (a.content == piece) return a.id;
    const std::string key(piece);
    if (auto it = vocab_.find(key); it != vocab_.end()) return it->second;
    std::string mapped;
    for (char c : piece) mapped += byte_map().text[static_cast<unsigned char>(c)];
    if (auto it = vocab_.find(mapped); it != vocab_.end()) return it->second;
    return std::nullopt;
  }

  std::string description() const override {
    return file_ + " (byte-level BPE, " + std::to_string(id_bytes_.size()) + " ids, " + std::to_string(merges_.size()) +
           " merges)";
  }

 private:
  void parse(const json& j, const std::string& where) {
    const std::string hint = "zinf reads byte-level BPE tokenizer.json files (GPT-2, Llama 3, Qwen2)";
    if (!j.is_object()) throw ConfigError(where + ": not a tokenizer.json (not a JSON object)", hint);
    if (!j.contains("model") || !j["model"].is_object())
      throw ConfigError(where + ": no \"model\" object: not a tokenizer.json", hint);
    const json& model = j["model"];
    const std::string type = model.value("type", std::string("BPE"));
    if (type != "BPE") throw ConfigError(where + ": model.type " + type + " is not supported", hint);
    if (model.contains("dropout") && !model["dropout"].is_null() && model["dropout"].get<double>() != 0.0)
      throw ConfigError(where + ": model.dropout is not supported");
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (model.contains(k) && model[k].is_string() && !model[k].get<std::string>().empty())
        throw ConfigError(where + ": model." + k + " is not supported (not a byte-level BPE)", hint);
    if (model.value("byte_fallback", false))
      throw ConfigError(where + ": model.byte_fallback is not supported (not a byte-level BPE)", hint);
    ignore_merges_ = model.value("ignore_merges", false);
    if (!model.contains("vocab") || !model["vocab"].is_object())
      throw ConfigError(where + ": model.vocab is missing or not an object", hint);
    std::uint32_t n_ids = 0;
    for (const auto& [piece, id] : model["vocab"].items()) {
      if (!id.is_number_integer() || id.get<std::int64_t>() < 0 || id.get<std::int64_t>() >= (1 << 21))
        throw ConfigError(where + ": model.vocab[\"" + piece + "\"] is not an id in [0, 2^21)");
      const auto v = id.get<std::uint32_t>();
      vocab_[piece] = v;
      n_ids = std::max(n_ids, v + 1);
    }
    // One piece per id: decoding an id must give one text.
    std::vector<const std::string*> piece_of(n_ids, nullptr);
    for (const auto& [piece, v] : vocab_) {
      if (piece_of[v])
        throw ConfigError(where + ": model.vocab gives the id " + std::to_string(v) + " to both \"" + *piece_of[v] +
                          "\" and \"" + piece + "\"");
      piece_of[v] = &piece;
    }
    if (!model.contains("merges") || !model["merges"].is_array())
      throw ConfigError(where + ": model.merges is missing or not an array", hint);
    std::uint32_t rank = 0;
    merges_.reserve(model["merges"].size());
    for (const auto& m : model["merges"]) {
      std::string a, b;
      if (m.is_string()) {
        const std::string s = m.get<std::string>();
        const auto sp = s.find(' ');
        if (sp == std::string::npos || sp == 0 || sp + 1 == s.size() || s.find(' ', sp + 1) != std::string::npos)
          throw ConfigError(where + ": model.merges[" + std::to_string(rank) + "] \"" + s +
                            "\" is not two pieces separated by one space");
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        a = m[0].get<std::string>();
        b = m[1].get<std::string>();
      } else {
        throw ConfigError(where + ": model.merges[" + std::to_string(rank) + "] is neither \"a b\" nor [\"a\", \"b\"]");
      }
      const auto ia = vocab_.find(a), ib = vocab_.find(b), ic = vocab_.find(a + b);
      if (ia == vocab_.end() || ib == vocab_.end() || ic == vocab_.end())
        throw ConfigError(where + ": model.merges[" + std::to_string(rank) + "] (" + a + " " + b + "): " +
                          (ia == vocab_.end()   ? a
                           : ib == vocab_.end() ? b
                                                : a + b) +
                          " is not in model.vocab");
      const std::uint64_t key = (std::uint64_t{ia->second} << 32) | ib->second;
      merges_.insert(key, rank, ic->second);
      ++rank;
    }
    // Every byte needs a token, or some text could not be encoded: refused here, at load, rather
    // than at the first text that holds the byte.
    std::string missing;
    int n_missing = 0;
    for (int b = 0; b < 256; ++b) {
      const std::string& ch = byte_map().text[static_cast<std::size_t>(b)];
      const auto it = vocab_.find(ch);
      byte_id_[static_cast<std::size_t>(b)] = it == vocab_.end() ? -1 : static_cast<std::int64_t>(it->second);
      if (it == vocab_.end() && n_missing++ < 4) {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02X", b);
        missing += std::string(missing.empty() ? "" : ", ") + hex + " (" + ch + ")";
      }
    }
    if (n_missing > 0)
      throw ConfigError(where + ": model.vocab has no token for " + std::to_string(n_missing) + " of the 256 bytes (" +
                            missing + (n_missing > 4 ? ", …" : "") +
                            "): a byte-level BPE needs every byte, or text holding one could not be encoded",
                        hint);

    // normalizer
    if (j.contains("normalizer") && !j["normalizer"].is_null()) {
      const json& n = j["normalizer"];
      const std::string t = n.is_object() ? n.value("type", std::string("?")) : std::string("?");
      if (t == "NFC")
        nfc_ = true;
      else if (!(t == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array() &&
                 n["normalizers"].empty()))
        throw ConfigError(where + ": normalizer " + t + " is not supported (only none or NFC)", hint);
    }

    // pre_tokenizer
    if (!j.contains("pre_tokenizer") || j["pre_tokenizer"].is_null())
      throw ConfigError(where + ": no pre_tokenizer: not a byte-level BPE", hint);
    const json& pt = j["pre_tokenizer"];
    std::vector<const json*> steps;
    if (pt.value("type", std::string()) == "Sequence") {
      if (!pt.contains("pretokenizers") || !pt["pretokenizers"].is_array())
        throw ConfigError(where + ": pre_tokenizer Sequence without a pretokenizers array");
      for (const auto& s : pt["pretokenizers"]) steps.push_back(&s);
    } else {
      steps.push_back(&pt);
    }
    bool have_byte_level = false;
    for (std::size_t k = 0; k < steps.size(); ++k) {
      const json& s = *steps[k];
      const std::string t = s.is_object() ? s.value("type", std::string("?")) : std::string("?");
      if (t == "ByteLevel") {
        if (k + 1 != steps.size() || have_byte_level)
          throw ConfigError(where + ": pre_tokenizer: ByteLevel must come last", hint);
        have_byte_level = true;
        const bool prefix = s.value("add_prefix_space", false);
        if (s.value("use_regex", true)) {
          if (pattern_) throw ConfigError(where + ": pre_tokenizer: a Split and a ByteLevel with use_regex", hint);
          if (digits_) {
            // Digits, then GPT-2's pattern inside the runs between them (SmolLM, StarCoder), as one
            // pattern: no alternative may take a digit, and a space run before a digit ends its run.
            if (prefix) throw ConfigError(where + ": pre_tokenizer: Digits with ByteLevel add_prefix_space", hint);
            pattern_ = std::make_unique<Pattern>(
                std::string(*digits_ ? R"(\p{N}|)" : R"(\p{N}+|)") +
                    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?[^\s\p{L}\p{N}]+|\s+(?![^\s\p{N}])|\s+)",
                false, where);
          } else {
            pattern_ = std::make_unique<Pattern>(kGpt2Pattern, false, where);
          }
          segment_prefix_ = prefix;
        } else {
          if (digits_) throw ConfigError(where + ": pre_tokenizer: Digits needs a ByteLevel with use_regex", hint);
          piece_prefix_ = prefix;
        }
      } else if (t == "Digits") {
        if (k != 0 || pattern_) throw ConfigError(where + ": pre_tokenizer: Digits must come first", hint);
        digits_ = s.value("individual_digits", false);
      } else if (t == "Split") {
        if (pattern_ || digits_) throw ConfigError(where + ": pre_tokenizer: only one Split is supported", hint);
        if (s.value("behavior", std::string()) != "Isolated" || s.value("invert", false))
          throw ConfigError(where + ": pre_tokenizer Split: only behavior Isolated without invert is supported", hint);
        const json& p = s.contains("pattern") ? s["pattern"] : json();
        if (p.is_object() && p.contains("Regex") && p["Regex"].is_string())
          pattern_ = std::make_unique<Pattern>(p["Regex"].get<std::string>(), false, where);
        else if (p.is_object() && p.contains("String") && p["String"].is_string())
          pattern_ = std::make_unique<Pattern>(p["String"].get<std::string>(), true, where);
        else
          throw ConfigError(where + ": pre_tokenizer Split: pattern is neither {\"Regex\": …} nor {\"String\": …}");
      } else {
        throw ConfigError(where + ": pre_tokenizer " + t + " is not supported (ByteLevel, or Split then ByteLevel)",
                          hint);
      }
    }
    if (!have_byte_level) throw ConfigError(where + ": the pre_tokenizer has no ByteLevel: not a byte-level BPE", hint);

    // added_tokens
    if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
      if (!j["added_tokens"].is_array()) throw ConfigError(where + ": added_tokens is not an array");
      for (const auto& a : j["added_tokens"]) {
        if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
            !a["content"].is_string() || a["id"].get<std::int64_t>() < 0 || a["id"].get<std::int64_t>() >= (1 << 21))
          throw ConfigError(where + ": added_tokens: an entry without an id in [0, 2^21) and a content string");
        AddedToken t{a["content"].get<std::string>(), a["id"].get<std::uint32_t>(), a.value("special", false)};
        if (t.content.empty()) throw ConfigError(where + ": added_tokens: id " + std::to_string(t.id) + " is empty");
        // An added token may repeat its own vocabulary entry (GPT-2's <|endoftext|>), not another's.
        const std::string* other = t.id < piece_of.size() ? piece_of[t.id] : nullptr;
        for (const auto& b : added_)
          if (b.id == t.id) other = &b.content;
        if (other && *other != t.content)
          throw ConfigError(where + ": added_tokens: the id " + std::to_string(t.id) + " of \"" + t.content +
                            "\" is already \"" + *other + "\"");
        n_ids = std::max(n_ids, t.id + 1);
        added_.push_back(std::move(t));
      }
    }
    for (const auto& a : added_) {
      added_all_.push_back(&a);
      if (!a.special) added_plain_.push_back(&a);
    }
    for (auto* list : {&added_all_, &added_plain_}) {
      std::stable_sort(list->begin(), list->end(),
                       [](const AddedToken* x, const AddedToken* y) { return x->content.size() > y->content.size(); });
      auto& first = list == &added_all_ ? first_all_ : first_plain_;
      for (const AddedToken* a : *list) first[static_cast<unsigned char>(a->content[0])].push_back(a);
    }

    // decoding table
    id_bytes_.assign(n_ids, std::string());
    id_known_.assign(n_ids, false);
    for (const auto& [piece, id] : vocab_) {
      id_bytes_[id] = unmap_bytes(piece);
      id_known_[id] = true;
    }
    for (const auto& a : added_) {
      id_bytes_[a.id] = a.content;
      id_known_[a.id] = true;
    }
    if (j.contains("post_processor") && !j["post_processor"].is_null()) post_processor(j["post_processor"], where);
  }

  // The tokens a post-processor adds around one text: ByteLevel adds none (its offset trimming
  // changes no id); TemplateProcessing's "single" template names them; a Sequence holds both.
  void post_processor(const json& pp, const std::string& where) {
    const std::string type = pp.is_object() ? pp.value("type", std::string()) : std::string();
    if (type == "ByteLevel") return;
    if (type == "Sequence" && pp.contains("processors") && pp["processors"].is_array()) {
      for (const json& p : pp["processors"]) post_processor(p, where);
      return;
    }
    if (type != "TemplateProcessing")
      throw ConfigError(where + ": post_processor " + (type.empty() ? pp.dump() : type) +
                            " is not supported (ByteLevel, TemplateProcessing or a Sequence of them)",
                        "zinf reads byte-level BPE tokenizer.json files (GPT-2, Llama 3, Qwen2)");
    if (!pp.contains("single") || !pp["single"].is_array())
      throw ConfigError(where + ": post_processor TemplateProcessing has no \"single\" list");
    const json specials = pp.value("special_tokens", json::object());
    bool seen_text = false;
    prefix_.clear();
    suffix_.clear();
    for (const json& piece : pp["single"]) {
      if (piece.contains("Sequence")) {
        seen_text = true;
        continue;
      }
      if (!piece.contains("SpecialToken") || !piece["SpecialToken"].contains("id"))
        throw ConfigError(where + ": post_processor TemplateProcessing: an item of \"single\" is neither a Sequence "
                                  "nor a SpecialToken");
      if (!piece["SpecialToken"]["id"].is_string())
        throw ConfigError(where + ": post_processor TemplateProcessing: a SpecialToken's id must be a string");
      const std::string name = piece["SpecialToken"]["id"].get<std::string>();
      std::vector<std::uint32_t> ids;
      if (specials.contains(name) && specials[name].contains("ids") && specials[name]["ids"].is_array()) {
        for (const json& id : specials[name]["ids"]) {
          if (!id.is_number_unsigned() || id.get<std::uint64_t>() >= id_bytes_.size())
            throw ConfigError(where + ": post_processor TemplateProcessing: an id of " + name + " (" + id.dump() +
                              ") is not in the vocabulary");
          ids.push_back(id.get<std::uint32_t>());
        }
      } else if (const auto id = token_id(name)) {
        ids.push_back(*id);
      } else {
        throw ConfigError(where + ": post_processor TemplateProcessing names the token " + name +
                          ", which the tokenizer does not have");
      }
      for (std::uint32_t id : ids)
        if (id >= id_bytes_.size() || !id_known_[id])
          throw ConfigError(where + ": post_processor TemplateProcessing: the id " + std::to_string(id) + " of " +
                            name + " is not in the vocabulary");
      auto& dst = seen_text ? suffix_ : prefix_;
      dst.insert(dst.end(), ids.begin(), ids.end());
    }
  }

 public:
  std::vector<std::uint32_t> prompt_prefix() const override { return prefix_; }
  std::vector<std::uint32_t> prompt_suffix() const override { return suffix_; }

 private:

  // Text between added tokens: normalized, split, and each piece merged.
  void encode_segment(std::string_view seg, std::vector<std::uint32_t>& out, std::size_t chunk) const {
    if (seg.empty()) return;
    std::string owned;
    if (nfc_) {
      owned = nfc(seg, chunk);
      seg = owned;
    }
    if (segment_prefix_ && seg[0] != ' ') {
      owned = " " + std::string(seg);
      seg = owned;
    }
    if (!pattern_) {  // ByteLevel without a split: the segment is one piece
      merge_piece(seg, out, caches_.local());
      return;
    }
    std::vector<std::size_t> cuts{0};
    if (chunk > 0)
      for (std::size_t p = chunk; p < seg.size(); p += chunk) {
        while (p < seg.size() && !cut_here(seg, p)) ++p;
        if (p + chunk / 4 >= seg.size()) break;  // no small last chunk
        cuts.push_back(p);
      }
    cuts.push_back(seg.size());
    if (cuts.size() == 2) {
      bool start_ok = true, end_ok = true;
      split_and_merge(seg, 0, seg.size(), out, caches_.local(), &start_ok, &end_ok);
      return;
    }
    // Cuts a piece crosses are dropped and the chunks around them encoded again as one. Chunk 0 starts
    // where a one-pass scan starts, so each chunk whose start is a boundary checks the next cut.
    for (;;) {
      const std::size_t n = cuts.size() - 1;
      std::vector<std::vector<std::uint32_t>> parts(n);
      std::vector<char> start_ok(n, 1), end_ok(n, 1);
      tbb::parallel_for(std::size_t{0}, n, [&](std::size_t c) {
        bool s = true, e = true;
        split_and_merge(seg, cuts[c], cuts[c + 1], parts[c], caches_.local(), &s, &e);
        start_ok[c] = s ? 1 : 0;
        end_ok[c] = e ? 1 : 0;
      });
      std::vector<std::size_t> kept{0};
      for (std::size_t c = 1; c < n; ++c)
        if (end_ok[c - 1] && start_ok[c]) kept.push_back(cuts[c]);
      kept.push_back(seg.size());
      if (kept.size() == cuts.size()) {
        std::size_t total = out.size();
        for (const auto& p : parts) total += p.size();
        out.reserve(total);
        for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
        return;
      }
      cuts = std::move(kept);
    }
  }

  // A candidate cut: just after a newline, before a byte that starts a character other than ASCII
  // white space. Neither GPT-2's nor Llama 3's pattern puts a newline and a following non-space in
  // one piece; other patterns are checked (see encode_segment).
  static bool cut_here(std::string_view s, std::size_t p) {
    if (s[p - 1] != '\n') return false;
    const auto c = static_cast<unsigned char>(s[p]);
    return (c > 0x20 && c < 0x7F) || c >= 0xC2;
  }

  void split_and_merge(std::string_view seg, std::size_t from, std::size_t to, std::vector<std::uint32_t>& out,
                       WordCache& cache, bool* start_ok, bool* end_ok) const {
    std::string prefixed;
    pattern_->split(
        seg, from, to,
        [&](std::string_view piece) {
          if (piece_prefix_ && piece[0] != ' ') {
            prefixed.assign(1, ' ');
            prefixed += piece;
            merge_piece(prefixed, out, cache);
          } else {
            merge_piece(piece, out, cache);
          }
        },
        start_ok, end_ok);
  }

  // NFC of a segment, in parallel chunks cut after '\n' (no character composes with a newline, so
  // each chunk normalizes as it would in the whole). Text that is not UTF-8 is left as it is.
  std::string nfc(std::string_view seg, std::size_t chunk) const {
    std::vector<std::size_t> cuts{0};
    if (chunk > 0)
      for (std::size_t p = chunk; p < seg.size(); p += chunk) {
        while (p < seg.size() && seg[p - 1] != '\n') ++p;
        if (p >= seg.size()) break;
        cuts.push_back(p);
      }
    cuts.push_back(seg.size());
    const std::size_t n = cuts.size() - 1;
    std::vector<std::string> parts(n);
    std::vector<char> ok(n, 1);
    tbb::parallel_for(std::size_t{0}, n, [&](std::size_t c) {
      utf8proc_uint8_t* res = nullptr;
      const auto len = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(seg.data() + cuts[c]),
                                    static_cast<utf8proc_ssize_t>(cuts[c + 1] - cuts[c]), &res,
                                    static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
      if (len < 0) {
        ok[c] = 0;
      } else {
        parts[c].assign(reinterpret_cast<const char*>(res), static_cast<std::size_t>(len));
      }
      std::free(res);
    });
    if (std::find(ok.begin(), ok.end(), 0) != ok.end()) return std::string(seg);
    std::string out;
    for (const auto& p : parts) out += p;
    return out;
  }

  void merge_piece(std::string_view raw, std::vector<std::uint32_t>& out, WordCache& cache) const {
    if (raw.empty()) return;
    if (raw.size() == 1) {
      out.push_back(byte_id(static_cast<unsigned char>(raw[0])));
      return;
    }
    const bool cached = raw.size() <= 64;
    const std::size_t hash = cached ? std::hash<std::string_view>{}(raw) : 0;
    if (cached && cache.get(raw, hash, out)) return;
    const std::size_t before = out.size();
    merge_uncached(raw, out);
    if (cached) cache.put(raw, hash, out.data() + before, out.size() - before);
  }

  std::uint32_t byte_id(unsigned char b) const {
    const std::int64_t id = byte_id_[b];
    if (id < 0)
      throw Error(file_ + ": the vocabulary has no token for the byte " + std::to_string(b) +
                  " (its character is missing from model.vocab)");
    return static_cast<std::uint32_t>(id);
  }

  // Merges by rank: the lowest-ranked adjacent pair first, leftmost among equals.
  void merge_uncached(std::string_view raw, std::vector<std::uint32_t>& out) const {
    if (ignore_merges_) {
      std::string mapped;
      for (char c : raw) mapped += byte_map().text[static_cast<unsigned char>(c)];
      if (auto it = vocab_.find(mapped); it != vocab_.end()) {
        out.push_back(it->second);
        return;
      }
    }
    const int n = static_cast<int>(raw.size());
    std::vector<std::uint32_t> id(static_cast<std::size_t>(n));
    std::vector<int> next(static_cast<std::size_t>(n)), prev(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) {
      id[static_cast<std::size_t>(i)] = byte_id(static_cast<unsigned char>(raw[static_cast<std::size_t>(i)]));
      next[static_cast<std::size_t>(i)] = i + 1 < n ? i + 1 : -1;
      prev[static_cast<std::size_t>(i)] = i - 1;
    }
    struct Cand {
      std::uint32_t rank;
      int left, right;
      std::uint32_t a, b, merged;
      bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
    };
    std::priority_queue<Cand, std::vector<Cand>, std::greater<>> q;
    auto push = [&](int l) {
      if (l < 0) return;
      const int r = next[static_cast<std::size_t>(l)];
      if (r < 0) return;
      const std::uint32_t a = id[static_cast<std::size_t>(l)], b = id[static_cast<std::size_t>(r)];
      if (const auto* m = merges_.find((std::uint64_t{a} << 32) | b)) q.push(Cand{m->rank, l, r, a, b, m->id});
    };
    for (int i = 0; i + 1 < n; ++i) push(i);
    std::vector<char> alive(static_cast<std::size_t>(n), 1);
    while (!q.empty()) {
      const Cand c = q.top();
      q.pop();
      const auto L = static_cast<std::size_t>(c.left), R = static_cast<std::size_t>(c.right);
      if (!alive[L] || !alive[R] || next[L] != c.right || id[L] != c.a || id[R] != c.b) continue;
      id[L] = c.merged;
      alive[R] = 0;
      next[L] = next[R];
      if (next[R] >= 0) prev[static_cast<std::size_t>(next[R])] = c.left;
      push(prev[L]);
      push(c.left);
    }
    for (int i = 0; i >= 0; i = next[static_cast<std::size_t>(i)]) out.push_back(id[static_cast<std::size_t>(i)]);
  }

  std::string file_;
  std::unordered_map<std::string, std::uint32_t> vocab_;  // byte-level string -> id
  MergeTable merges_;
  mutable tbb::enumerable_thread_specific<WordCache> caches_;  // one per thread
  std::array<std::int64_t, 256> byte_id_{};
  bool ignore_merges_ = false, nfc_ = false;
  std::optional<bool> digits_;   // a Digits pre-tokenizer first: individual_digits
  bool segment_prefix_ = false;  // ByteLevel(add_prefix_space) splitting itself: one space before each segment
  bool piece_prefix_ = false;    // ByteLevel(add_prefix_space) after a Split: one before each piece
  std::unique_ptr<Pattern> pattern_;
  std::vector<AddedToken> added_;
  std::vector<const AddedToken*> added_all_, added_plain_;                   // longest first
  std::array<std::vector<const AddedToken*>, 256> first_all_, first_plain_;  // by first byte, longest first
  std::vector<std::string> id_bytes_;                                        // id -> the bytes it decodes to
  std::vector<bool> id_known_;
  std::vector<std::uint32_t> prefix_, suffix_;  // the post-processor's tokens around a text
};

}  // namespace

std::unique_ptr<Tokenizer> bpe_tokenizer_from_json(std::string_view json_text, const std::string& file,
                                                   const std::string& what) {
  return std::make_unique<BpeTokenizer>(json_text, file, what);
}

std::unique_ptr<Tokenizer> open_bpe_tokenizer(const std::string& path, const std::string& what) {
  return bpe_tokenizer_from_json(read_input_file(path, what), path, what);
}

std::vector<std::uint32_t> bpe_encode_chunked(const Tokenizer& tok, std::string_view text, bool special,
                                              std::size_t chunk_bytes) {
  const auto* b = dynamic_cast<const BpeTokenizer*>(&tok);
  if (!b) throw Error("bpe_encode_chunked: not a byte-level BPE tokenizer");
  return b->encode_chunked(text, special, chunk_bytes);
}

}  // namespace zinf
