// io/data.h — training data: byte-level tokens from any UTF-8 text file (vocab 256), text
// tokenized at load by a SentencePiece model (data.tokenizer), or llm.c's token files — a 256×int32
// header (magic, version, token count) then the tokens: magic 20240520 with uint16 tokens (GPT-2),
// 20240801 with uint32 tokens (vocabularies over 65,535, e.g. Llama 3's 128,256). Token files and
// single text files are memory-mapped, not read. With no path, the default text is every licence in
// /usr/share/common-licenses (Debian's base-files package, about 240 KB of English on every Debian
// system), read in name order.
//
// The last val_fraction of the tokens is the validation split. Training windows are drawn from the
// seed (deterministic, and resumable from the number of windows drawn); validation batches are
// fixed windows spread evenly over the split. Errors (missing, empty, malformed, too short, token
// out of range) are one ConfigError line naming the file.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "io/instruct.h"
#include "zinf/types.h"

namespace zinf {

enum class DataFormat { automatic, text, tokens, jsonl };

// The run config's `data` section.
struct DataConfig {
  std::string path;  // empty: the built-in default text (see README)
  DataFormat format = DataFormat::automatic;
  double val_fraction = 0;
  std::string tokenizer;  // a SentencePiece tokenizer.model: text is tokenized with it at load
  ChatTemplate chat_template = ChatTemplate::automatic;  // jsonl only
};

// Whether `cfg` names chat data: data.format jsonl, or auto with a path ending in .jsonl.
bool is_chat_data(const DataConfig& cfg);

// The bytes the data set holds in this process's memory once every page of it has been read: the
// file (mapped), or the default text (read). Text tokenized at load holds its tokens instead, 4 bytes
// each: about as many bytes as the text at 4 characters per token. Chat data: about 3 × its file (the
// text while it is parsed, then an input and a target id per token). 0 for a path that cannot be read
// (loading it reports why).
std::uint64_t data_memory_bytes(const DataConfig& cfg);

class TokenData {
 public:
  static TokenData load(const DataConfig& cfg, int vocab_size, int seq_len);

  // Tokens of each split; for chat data the target tokens (unmasked) of each split's examples.
  std::size_t train_tokens() const { return chat_ ? chat_train_targets_ : split_; }
  std::size_t val_tokens() const { return chat_ ? chat_val_targets_ : count_ - split_; }
  // Chat data: targets hold kIgnoreTarget and the loss is a mean over the unmasked positions.
  bool masked() const { return chat_ != nullptr; }
  // Lines for the log (chat data: the template, the examples cut and dropped).
  const std::vector<std::string>& notes() const { return notes_; }
  std::size_t size() const { return count_; }
  const std::string& description() const { return description_; }
  std::uint32_t at(std::size_t i) const {
    switch (width_) {
      case 1: return base_[i];
      case 2: return reinterpret_cast<const std::uint16_t*>(base_)[i];
      default: return reinterpret_cast<const std::uint32_t*>(base_)[i];
    }
  }

  // B windows of T+1 tokens from the training split: inputs[b,t] and targets[b,t] = next token.
  void sample_train(std::mt19937_64& rng, int B, int T, int* inputs, int* targets) const;
  // Validation batch `index` of `count`: fixed windows spread over the validation split.
  void val_batch(int index, int count, int B, int T, int* inputs, int* targets) const;
  // Unmasked targets in the next `rows` training windows drawn from (a copy of) `rng`, as
  // sample_train would draw them: the normalizer of a step's loss, known before its first backward.
  // For token data every position counts: rows × T.
  std::size_t train_targets(std::mt19937_64 rng, std::size_t rows, int T) const;
  // Unmasked targets of validation batch `index` of `count` (B rows of T).
  std::size_t val_targets(int index, int count, int B, int T) const;

 private:
  std::shared_ptr<const void> storage_;  // a mapping or an owned buffer; base_ points into it
  const unsigned char* base_ = nullptr;
  int width_ = 1;  // bytes per token: 1 (bytes), 2 (uint16), 4 (uint32)
  std::size_t count_ = 0, split_ = 0;
  std::string description_;
  // Chat data: one window per example, training examples first (io/instruct.h).
  std::shared_ptr<const InstructSet> chat_;
  std::size_t chat_train_targets_ = 0, chat_val_targets_ = 0;
  std::vector<std::string> notes_;
  static TokenData load_chat(const DataConfig& cfg, int vocab_size, int seq_len);
  std::size_t chat_val_index(int index, int count, int B, int b) const;
};

// llm.c's token file format.
constexpr std::int32_t kTokensMagicU16 = 20240520, kTokensVersionU16 = 1;
constexpr std::int32_t kTokensMagicU32 = 20240801, kTokensVersionU32 = 7;

// What an llm.c token file's header says: bytes per token (2 or 4) and the token count.
struct TokenFileHeader {
  int width = 0;
  std::int64_t count = 0;
};
// Checks the header of a token file of `size` bytes starting at `data` (magic, version, a count that
// matches the size); a ConfigError naming `source` otherwise.
TokenFileHeader parse_token_header(const void* data, std::size_t size, const std::string& source);

// Writes `tokens` as an llm.c token file (uint16 when every token fits, else uint32), all or nothing
// (see OutputFile). Returns the bytes per token it chose.
int write_token_file(const std::string& path, const std::vector<std::uint32_t>& tokens);

// SentencePiece: the model at `model_path` tokenizes `text` (no BOS/EOS added). Throws ConfigError
// naming `what` (the key or flag) and the file when it is not a regular file or not a model.
std::vector<std::uint32_t> sentencepiece_encode(const std::string& model_path, std::string_view text,
                                                int* vocab = nullptr, const std::string& what = "data.tokenizer");

}  // namespace zinf
