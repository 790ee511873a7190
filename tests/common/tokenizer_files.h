// tokenizer_files.h — small Hugging Face tokenizer.json files built in a test: the byte-level BPE
// alphabet as those files write it, and a tokenizer with the 256 bytes, a few merges and added tokens.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <utility>
#include <vector>

namespace zinf::test {

// The byte-level alphabet as tokenizer.json files write it: printable Latin-1 bytes as themselves,
// the others as U+0100 onwards.
inline std::string byte_char(int b) {
  static const std::vector<std::string> table = [] {
    std::vector<std::string> t(256);
    int next = 256;
    for (int i = 0; i < 256; ++i) {
      const bool printable = (i >= 33 && i <= 126) || (i >= 161 && i <= 172) || (i >= 174 && i <= 255);
      const int cp = printable ? i : next++;
      std::string s;
      if (cp < 0x80) {
        s.push_back(static_cast<char>(cp));
      } else {
        s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      }
      t[static_cast<std::size_t>(i)] = s;
    }
    return t;
  }();
  return table[static_cast<std::size_t>(b)];
}

inline std::string mapped(const std::string& raw) {
  std::string s;
  for (char c : raw) s += byte_char(static_cast<unsigned char>(c));
  return s;
}

inline constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// A tokenizer.json: the 256 bytes (ids 0-255), then one id per merge result, and two added tokens.
inline nlohmann::json small_tokenizer(const std::vector<std::pair<std::string, std::string>>& merges, bool pairs,
                                      bool llama3) {
  using json = nlohmann::json;
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  json m = json::array();
  int next = 256;
  for (const auto& [a, b] : merges) {
    const std::string ma = mapped(a), mb = mapped(b);
    if (!vocab.contains(ma + mb)) vocab[ma + mb] = next++;
    if (pairs)
      m.push_back(json::array({ma, mb}));
    else
      m.push_back(ma + " " + mb);
  }
  json j;
  j["version"] = "1.0";
  j["normalizer"] = nullptr;
  if (llama3)
    j["pre_tokenizer"] = {
        {"type", "Sequence"},
        {"pretokenizers",
         json::array(
             {{{"type", "Split"},
               {"pattern", {{"Regex", kLlama3Pattern}}},
               {"behavior", "Isolated"},
               {"invert", false}},
              {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}})}};
  else
    j["pre_tokenizer"] = {
        {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  j["added_tokens"] = json::array({{{"id", next}, {"content", "<|eot_id|>"}, {"special", true}},
                                   {{"id", next + 1}, {"content", "[plain]"}, {"special", false}}});
  j["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}};
  return j;
}

}  // namespace zinf::test
