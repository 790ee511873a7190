// io/tokenizer.h — text to token ids and back, whichever tokenizer a model ships:
//   - bytes: no tokenizer, one token per byte (vocabulary 256): zinf's default data and models;
//   - SentencePiece: a tokenizer.model (Llama 2, TinyLlama, Mistral);
//   - Hugging Face tokenizer.json with a byte-level BPE model (GPT-2, Llama 3, Qwen2, SmolLM).
// open_tokenizer() takes a file or a model folder (tokenizer.json preferred over tokenizer.model);
// from a folder it also reads tokenizer_config.json and generation_config.json for BOS/EOS.
// Errors are one ConfigError naming `what` (the key or flag) and the file.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace zinf {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // "bytes", "sentencepiece" or "bpe".
  virtual std::string kind() const = 0;
  // Ids of `text`, no BOS/EOS added. With `special`, the tokenizer's added special tokens
  // ("<|eot_id|>", "<|im_start|>", …) written in the text are matched first and become their ids;
  // without it they are ordinary text (how data files are tokenized: a document cannot forge a
  // chat marker). A tokenizer.json's added tokens that are not special are matched either way, as
  // Hugging Face does.
  virtual std::vector<std::uint32_t> encode(std::string_view text, bool special = false) const = 0;
  // encode(text, special) and, per id, the byte offset in `text` where its piece ends (to map spans
  // of the text onto tokens). Where a normalizer changed the text (NFC), offsets inside a run of
  // non-ASCII characters are rounded to the run's end.
  virtual std::vector<std::uint32_t> encode_with_ends(std::string_view text, bool special,
                                                      std::vector<std::size_t>& ends) const;
  // A prompt as the tokenizer encodes a text with its special tokens added (Hugging Face's
  // tokenizer(text)["input_ids"]): the post-processor's tokens around encode(text, special) — for a
  // tokenizer.json its TemplateProcessing (Llama 3: <|begin_of_text|> first; GPT-2 and Qwen2: none),
  // changed by the folder's tokenizer_config.json add_bos_token / add_eos_token; for SentencePiece
  // BOS first (add_bos_token true unless the folder says otherwise); for bytes nothing.
  virtual std::vector<std::uint32_t> encode_prompt(std::string_view text, bool special) const;
  // The bytes of `ids`, special tokens written out as their text. Ids outside the vocabulary are an
  // Error. Byte-level BPE pieces that split a UTF-8 character come back as the raw bytes.
  virtual std::string decode(const std::vector<std::uint32_t>& ids) const = 0;
  // Ids are < vocab_size().
  virtual int vocab_size() const = 0;
  // The id of one token given by its text (a special token such as "<|eot_id|>", or any piece).
  virtual std::optional<std::uint32_t> token_id(std::string_view piece) const = 0;
  // Beginning/end of sequence, when the tokenizer (or its folder's tokenizer_config.json /
  // generation_config.json) names them; eos_ids() holds every id that ends generation.
  virtual std::optional<std::uint32_t> bos_id() const { return std::nullopt; }
  virtual std::vector<std::uint32_t> eos_ids() const { return {}; }
  // A short description for logs: the file and the vocabulary.
  virtual std::string description() const = 0;
  // The ids the post-processor puts before and after a single text (see encode_prompt).
  virtual std::vector<std::uint32_t> prompt_prefix() const { return {}; }
  virtual std::vector<std::uint32_t> prompt_suffix() const { return {}; }
};

// One token per byte; decode writes the bytes back.
std::unique_ptr<Tokenizer> byte_tokenizer();

// `path`: a tokenizer.json, a tokenizer.model, or a folder holding either. `what` names the key or
// flag in errors ("data.tokenizer", "--tokenizer").
std::unique_ptr<Tokenizer> open_tokenizer(const std::string& path, const std::string& what = "data.tokenizer");

// A JSON file of a model folder (tokenizer_config.json, generation_config.json, config.json):
// nullopt when there is none; one ConfigError naming `what` and the file when it is not JSON.
std::optional<nlohmann::json> read_folder_json(const std::filesystem::path& p, const std::string& what);

}  // namespace zinf
