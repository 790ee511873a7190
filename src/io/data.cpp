// data.cpp — byte-level text, text tokenized at load (io/tokenizer.h) and llm.c token files (io/data.h).
#include "io/data.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "io/files.h"
#include "io/tokenizer.h"
#include "zinf/error.h"

namespace zinf {
namespace {

namespace fs = std::filesystem;
constexpr char kDefaultDir[] = "/usr/share/common-licenses";
constexpr std::size_t kHeaderBytes = 1024;

// A read-only mapping of a whole file, unmapped when the last holder lets go.
std::shared_ptr<const void> map_file(const std::string& path, std::size_t* size) {
  const InputFile f(path, "data.path");  // only a regular file: a FIFO or device is refused, not waited on
  *size = static_cast<std::size_t>(f.size());
  if (*size == 0) throw ConfigError("data.path " + path + ": data file is empty");
  void* p = ::mmap(nullptr, *size, PROT_READ, MAP_PRIVATE, f.fd(), 0);
  const int e = errno;
  if (p == MAP_FAILED) throw ConfigError("data.path " + path + ": cannot map the data file (" + std::strerror(e) + ")");
  const std::size_t n = *size;
  return std::shared_ptr<const void>(p, [n](const void* q) { ::munmap(const_cast<void*>(q), n); });
}

std::int32_t magic_of(const void* data, std::size_t size) {
  if (size < kHeaderBytes) return 0;
  std::int32_t magic;
  std::memcpy(&magic, data, 4);
  return magic;
}

}  // namespace

TokenFileHeader parse_token_header(const void* data, std::size_t size, const std::string& source) {
  if (size < kHeaderBytes) throw ConfigError(source + ": too short for an llm.c token file (no 1024-byte header)");
  std::int32_t header[3];
  std::memcpy(header, data, sizeof header);
  TokenFileHeader h;
  if (header[0] == kTokensMagicU16) {
    if (header[1] != kTokensVersionU16)
      throw ConfigError(source + ": unsupported token file version " + std::to_string(header[1]) +
                        " (expected 1: uint16 tokens)");
    h.width = 2;
  } else if (header[0] == kTokensMagicU32) {
    h.width = 4;  // llm.c writes version 7 for these; the magic alone says uint32
  } else {
    throw ConfigError(source + ": bad magic " + std::to_string(header[0]) +
                      " (expected llm.c's token format: 20240520 for uint16 tokens, 20240801 for uint32)");
  }
  h.count = header[2];
  const auto w = static_cast<std::uint64_t>(h.width);
  if (h.count < 0 || static_cast<std::uint64_t>(h.count) * w + kHeaderBytes != size)
    throw ConfigError(source + ": header says " + std::to_string(h.count) + " tokens but the file holds " +
                      std::to_string((size - kHeaderBytes) / w));
  return h;
}

std::uint64_t data_memory_bytes(const DataConfig& cfg) {
  std::error_code ec;
  if (!cfg.path.empty()) {
    const auto n = fs::file_size(cfg.path, ec);
    // Chat data: the text while it is read, then an input and a target (4 bytes each) per token.
    return ec ? 0 : static_cast<std::uint64_t>(n) * (is_chat_data(cfg) ? 3 : 1);
  }
  std::uint64_t total = 0;
  for (const auto& e : fs::directory_iterator(kDefaultDir, ec))
    if (e.is_regular_file() && !e.is_symlink()) total += static_cast<std::uint64_t>(e.file_size());
  return total;
}

bool is_chat_data(const DataConfig& cfg) {
  const std::string& p = cfg.path;
  return cfg.format == DataFormat::jsonl ||
         (cfg.format == DataFormat::automatic && p.size() >= 6 && p.compare(p.size() - 6, 6, ".jsonl") == 0);
}

TokenData TokenData::load_chat(const DataConfig& cfg, int vocab_size, int seq_len) {
  if (cfg.tokenizer.empty())
    throw ConfigError("data.tokenizer: chat data (" + cfg.path + ") needs a tokenizer",
                      "set data.tokenizer to the model folder or its tokenizer file");
  const std::unique_ptr<Tokenizer> tok = open_tokenizer(cfg.tokenizer, "data.tokenizer");
  if (tok->vocab_size() > vocab_size)
    throw ConfigError("data.tokenizer " + cfg.tokenizer + ": the tokenizer has " + std::to_string(tok->vocab_size()) +
                          " tokens, more than model.vocab_size " + std::to_string(vocab_size),
                      "set model.vocab_size to at least " + std::to_string(tok->vocab_size()));
  const ChatFormat format = chat_format(cfg.chat_template, cfg.tokenizer, *tok, "data.chat_template");
  const ChatTemplate t = format.kind;
  const std::string why = format.reason;
  const std::vector<ChatExample> examples = parse_chat_jsonl(read_input_file(cfg.path, "data.path"), cfg.path);
  if (examples.empty()) throw ConfigError("data.path " + cfg.path + ": no examples (the file holds only blank lines)");
  const std::vector<std::uint32_t> eos = tok->eos_ids();
  const std::uint32_t pad = eos.empty() ? 0 : eos.front();  // any id: padding positions are masked
  auto set = std::make_shared<InstructSet>(make_instruct_windows(examples, format, *tok, seq_len, pad));
  const std::size_t n = set->windows.size();
  const std::size_t val = std::max<std::size_t>(1, static_cast<std::size_t>(static_cast<double>(n) * cfg.val_fraction));
  if (n < val + 1) {
    // Where truncation dropped examples (their prompt filled seq_len), a longer sequence is the way
    // out, not more of the same examples.
    const std::string dropped = set->dropped == 0 ? ""
                                                  : " (" + std::to_string(set->dropped) + " of " +
                                                        std::to_string(set->examples) +
                                                        " dropped: the prompt fills model.seq_len " +
                                                        std::to_string(seq_len) + ", leaving no answer token)";
    throw ConfigError("data.path " + cfg.path + ": " + std::to_string(n) +
                          " examples with targets are too few for a training and a validation split" + dropped,
                      set->dropped > 0 ? "raise model.seq_len so that the answers fit, or shorten the prompts"
                                       : "use more examples");
  }
  set->train_count = n - val;
  TokenData d;
  for (std::size_t i = 0; i < n; ++i)
    (i < set->train_count ? d.chat_train_targets_ : d.chat_val_targets_) += set->windows[i].target_count;
  d.description_ = cfg.path + " (chat JSONL, template " + chat_template_name(t) + ", " + tok->description() + ", " +
                   std::to_string(set->train_count) + " train / " + std::to_string(val) + " val examples)";
  d.notes_.push_back("chat template " + chat_template_name(t) + " (" + why + "); one example per window of " +
                     std::to_string(seq_len) + " tokens");
  d.notes_.push_back(std::to_string(set->truncated) + " of " + std::to_string(set->examples) +
                     " examples truncated to seq_len");
  if (set->dropped)
    d.notes_.push_back(std::to_string(set->dropped) + " of " + std::to_string(set->examples) +
                       " examples dropped: no target token left after truncation");
  d.chat_ = std::move(set);
  d.count_ = n;
  d.split_ = d.chat_->train_count;
  return d;
}

TokenData TokenData::load(const DataConfig& cfg, int vocab_size, int seq_len) {
  if (is_chat_data(cfg)) return load_chat(cfg, vocab_size, seq_len);
  TokenData d;
  std::string source;
  if (cfg.path.empty()) {  // the default text: several files, concatenated into one owned buffer
    std::vector<fs::path> files;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(kDefaultDir, ec))
      if (e.is_regular_file() && !e.is_symlink()) files.push_back(e.path());
    if (files.empty())
      throw ConfigError(std::string(kDefaultDir) + ": no default training text found (the base-files package)",
                        "give a text file with data.path");
    std::sort(files.begin(), files.end());
    auto text = std::make_shared<std::string>();
    for (const auto& f : files) *text += read_input_file(f.string(), "default text");
    source = "default text: " + std::to_string(files.size()) + " files in " + kDefaultDir;
    d.storage_ = text;
    d.base_ = reinterpret_cast<const unsigned char*>(text->data());
    d.count_ = text->size();
  } else {
    source = cfg.path;
    std::size_t size = 0;
    d.storage_ = map_file(cfg.path, &size);
    d.base_ = static_cast<const unsigned char*>(d.storage_.get());
    d.count_ = size;
    const std::int32_t magic = magic_of(d.base_, size);
    const bool tokens = cfg.format == DataFormat::tokens ||
                        (cfg.format == DataFormat::automatic && (magic == kTokensMagicU16 || magic == kTokensMagicU32));
    if (tokens) {
      const TokenFileHeader h = parse_token_header(d.base_, size, source);
      d.width_ = h.width;
      const std::int64_t count = h.count;
      d.base_ += kHeaderBytes;
      d.count_ = static_cast<std::size_t>(count);
      d.description_ =
          source + " (llm.c tokens, uint" + std::to_string(8 * d.width_) + ", " + std::to_string(count) + " tokens)";
    }
  }
  // Text through a tokenizer (io/tokenizer.h: SentencePiece or tokenizer.json, a file or a model
  // folder): the tokens replace the bytes. Special tokens written in the text stay text.
  if (!cfg.tokenizer.empty() && d.width_ == 1) {
    const auto tok = open_tokenizer(cfg.tokenizer, "data.tokenizer");
    const int vocab = tok->vocab_size();
    if (vocab > vocab_size)
      throw ConfigError(cfg.tokenizer + ": the tokenizer has " + std::to_string(vocab) +
                            " pieces, more than model.vocab_size " + std::to_string(vocab_size),
                        "set model.vocab_size to at least " + std::to_string(vocab));
    auto ids = std::make_shared<std::vector<std::uint32_t>>();
    // The text is read where it lies (the mapping, or the default text's buffer).
    *ids = tok->encode(std::string_view(reinterpret_cast<const char*>(d.base_), d.count_), false);
    d.storage_ = ids;
    d.base_ = reinterpret_cast<const unsigned char*>(ids->data());
    d.width_ = 4;
    d.count_ = ids->size();
    source += " tokenized by " + cfg.tokenizer;
    d.description_ = source + " (" + tok->kind() + ", " + std::to_string(vocab) + " pieces, " +
                     std::to_string(d.count_) + " tokens)";
  }
  if (d.count_ == 0) throw ConfigError(source + ": data file is empty");
  if (d.width_ == 1) {
    if (vocab_size < 256)
      throw ConfigError(source + ": byte-level text needs model.vocab_size >= 256 (it is " +
                        std::to_string(vocab_size) + ")");
    d.description_ = source + " (bytes, " + std::to_string(d.count_) + " tokens)";
  } else {
    for (std::size_t i = 0; i < d.count_; ++i)
      if (d.at(i) >= static_cast<std::uint32_t>(vocab_size))
        throw ConfigError(source + ": token " + std::to_string(d.at(i)) + " at position " + std::to_string(i) +
                          " is outside the model's vocabulary (" + std::to_string(vocab_size) + ")");
  }
  std::size_t val = static_cast<std::size_t>(static_cast<double>(d.count_) * cfg.val_fraction);
  d.split_ = d.count_ - val;
  const std::size_t need = static_cast<std::size_t>(seq_len) + 1;
  if (d.split_ < need || val < need)
    throw ConfigError(source + ": " + std::to_string(d.count_) + " tokens are too few for seq_len " +
                          std::to_string(seq_len) + " (each split needs at least " + std::to_string(need) + ")",
                      "use more data, a smaller model.seq_len, or another data.val_fraction");
  return d;
}

std::size_t TokenData::chat_val_index(int index, int count, int B, int b) const {
  const std::size_t nval = chat_->windows.size() - chat_->train_count;
  const std::size_t windows = static_cast<std::size_t>(count) * static_cast<std::size_t>(B);
  const std::size_t j = static_cast<std::size_t>(index) * static_cast<std::size_t>(B) + static_cast<std::size_t>(b);
  return chat_->train_count + (windows > 1 ? j * (nval - 1) / (windows - 1) : 0);
}

std::size_t TokenData::train_targets(std::mt19937_64 rng, std::size_t rows, int T) const {
  if (!chat_) return rows * static_cast<std::size_t>(T);
  std::size_t n = 0;
  for (std::size_t r = 0; r < rows; ++r) n += chat_->windows[static_cast<std::size_t>(rng() % split_)].target_count;
  return n;
}

std::size_t TokenData::val_targets(int index, int count, int B, int T) const {
  if (!chat_) return static_cast<std::size_t>(B) * static_cast<std::size_t>(T);
  std::size_t n = 0;
  for (int b = 0; b < B; ++b) n += chat_->windows[chat_val_index(index, count, B, b)].target_count;
  return n;
}

void TokenData::sample_train(std::mt19937_64& rng, int B, int T, int* inputs, int* targets) const {
  if (chat_) {  // one draw per row, as for token windows: a resume discards rows_drawn draws
    for (int b = 0; b < B; ++b)
      chat_->write(static_cast<std::size_t>(rng() % split_), inputs + static_cast<std::ptrdiff_t>(b) * T,
                   targets + static_cast<std::ptrdiff_t>(b) * T);
    return;
  }
  const std::uint64_t span = split_ - static_cast<std::size_t>(T) - 1 + 1;
  for (int b = 0; b < B; ++b) {
    const std::size_t start = static_cast<std::size_t>(rng() % span);
    for (int t = 0; t < T; ++t) {
      inputs[b * T + t] = static_cast<int>(at(start + static_cast<std::size_t>(t)));
      targets[b * T + t] = static_cast<int>(at(start + static_cast<std::size_t>(t) + 1));
    }
  }
}

void TokenData::val_batch(int index, int count, int B, int T, int* inputs, int* targets) const {
  if (chat_) {
    for (int b = 0; b < B; ++b)
      chat_->write(chat_val_index(index, count, B, b), inputs + static_cast<std::ptrdiff_t>(b) * T,
                   targets + static_cast<std::ptrdiff_t>(b) * T);
    return;
  }
  const std::size_t span = val_tokens() - static_cast<std::size_t>(T) - 1 + 1;
  const std::size_t windows = static_cast<std::size_t>(count) * static_cast<std::size_t>(B);
  for (int b = 0; b < B; ++b) {
    const std::size_t j = static_cast<std::size_t>(index) * static_cast<std::size_t>(B) + static_cast<std::size_t>(b);
    const std::size_t start = split_ + (windows > 1 ? j * (span - 1) / (windows - 1) : 0);
    for (int t = 0; t < T; ++t) {
      inputs[b * T + t] = static_cast<int>(at(start + static_cast<std::size_t>(t)));
      targets[b * T + t] = static_cast<int>(at(start + static_cast<std::size_t>(t) + 1));
    }
  }
}

}  // namespace zinf
