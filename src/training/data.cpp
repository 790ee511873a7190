// data.cpp — byte-level text and llm.c token files (zinf/data.h).
#include "zinf/data.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "zinf/error.h"

namespace zinf {
namespace {

namespace fs = std::filesystem;
constexpr char kDefaultDir[] = "/usr/share/common-licenses";
constexpr std::int32_t kLlmcMagic = 20240520;

std::string read_all(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw ConfigError(path + ": data file does not exist");
  if (fs::is_directory(path, ec)) throw ConfigError(path + ": is a directory, expected a data file");
  std::ifstream f(path, std::ios::binary);
  if (!f) throw ConfigError(path + ": cannot open data file (" + std::strerror(errno) + ")");
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

bool looks_like_llmc(const std::string& bytes) {
  if (bytes.size() < 1024) return false;
  std::int32_t magic;
  std::memcpy(&magic, bytes.data(), 4);
  return magic == kLlmcMagic;
}

}  // namespace

TokenData TokenData::load(const DataConfig& cfg, int vocab_size, int seq_len) {
  TokenData d;
  std::string bytes, source;
  bool tokens_format = false;
  if (cfg.path.empty()) {
    std::vector<fs::path> files;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(kDefaultDir, ec))
      if (e.is_regular_file() && !e.is_symlink()) files.push_back(e.path());
    if (files.empty())
      throw ConfigError(std::string(kDefaultDir) + ": no default training text found (the base-files package)",
                        "give a text file with data.path");
    std::sort(files.begin(), files.end());
    for (const auto& f : files) bytes += read_all(f.string());
    source = "default text: " + std::to_string(files.size()) + " files in " + kDefaultDir;
  } else {
    bytes = read_all(cfg.path);
    source = cfg.path;
    tokens_format = cfg.format == DataFormat::tokens || (cfg.format == DataFormat::automatic && looks_like_llmc(bytes));
  }
  if (bytes.empty()) throw ConfigError(source + ": data file is empty");

  if (tokens_format) {
    if (bytes.size() < 1024) throw ConfigError(source + ": too short for an llm.c token file (no 1024-byte header)");
    std::int32_t header[256];
    std::memcpy(header, bytes.data(), sizeof header);
    if (header[0] != kLlmcMagic)
      throw ConfigError(source + ": bad magic " + std::to_string(header[0]) + " (expected 20240520, llm.c's token format)");
    if (header[1] != 1)
      throw ConfigError(source + ": unsupported token file version " + std::to_string(header[1]) + " (expected 1: uint16 tokens)");
    const std::int64_t count = header[2];
    if (count < 0 || static_cast<std::uint64_t>(count) * 2 + 1024 != bytes.size())
      throw ConfigError(source + ": header says " + std::to_string(count) + " tokens but the file holds " +
                        std::to_string((bytes.size() - 1024) / 2));
    d.tokens_.resize(static_cast<std::size_t>(count));
    std::memcpy(d.tokens_.data(), bytes.data() + 1024, static_cast<std::size_t>(count) * 2);
    for (std::size_t i = 0; i < d.tokens_.size(); ++i)
      if (d.tokens_[i] >= vocab_size)
        throw ConfigError(source + ": token " + std::to_string(d.tokens_[i]) + " at position " + std::to_string(i) +
                          " is outside the model's vocabulary (" + std::to_string(vocab_size) + ")");
    d.description_ = source + " (llm.c tokens, " + std::to_string(count) + " tokens)";
  } else {
    if (vocab_size < 256)
      throw ConfigError(source + ": byte-level text needs model.vocab_size >= 256 (it is " + std::to_string(vocab_size) + ")");
    d.tokens_.assign(reinterpret_cast<const unsigned char*>(bytes.data()),
                     reinterpret_cast<const unsigned char*>(bytes.data()) + bytes.size());
    d.description_ = source + " (bytes, " + std::to_string(bytes.size()) + " tokens)";
  }
  const std::size_t n = d.tokens_.size();
  std::size_t val = static_cast<std::size_t>(static_cast<double>(n) * cfg.val_fraction);
  d.split_ = n - val;
  const std::size_t need = static_cast<std::size_t>(seq_len) + 1;
  if (d.split_ < need || val < need)
    throw ConfigError(source + ": " + std::to_string(n) + " tokens are too few for seq_len " + std::to_string(seq_len) +
                          " (each split needs at least " + std::to_string(need) + ")",
                      "use more data, a smaller model.seq_len, or another data.val_fraction");
  return d;
}

void TokenData::sample_train(std::mt19937_64& rng, int B, int T, int* inputs, int* targets) const {
  const std::uint64_t span = split_ - static_cast<std::size_t>(T) - 1 + 1;
  for (int b = 0; b < B; ++b) {
    const std::size_t start = static_cast<std::size_t>(rng() % span);
    for (int t = 0; t < T; ++t) {
      inputs[b * T + t] = tokens_[start + static_cast<std::size_t>(t)];
      targets[b * T + t] = tokens_[start + static_cast<std::size_t>(t) + 1];
    }
  }
}

void TokenData::val_batch(int index, int count, int B, int T, int* inputs, int* targets) const {
  const std::size_t span = val_tokens() - static_cast<std::size_t>(T) - 1 + 1;
  const std::size_t windows = static_cast<std::size_t>(count) * static_cast<std::size_t>(B);
  for (int b = 0; b < B; ++b) {
    const std::size_t j = static_cast<std::size_t>(index) * static_cast<std::size_t>(B) + static_cast<std::size_t>(b);
    const std::size_t start = split_ + (windows > 1 ? j * (span - 1) / (windows - 1) : 0);
    for (int t = 0; t < T; ++t) {
      inputs[b * T + t] = tokens_[start + static_cast<std::size_t>(t)];
      targets[b * T + t] = tokens_[start + static_cast<std::size_t>(t) + 1];
    }
  }
}

}  // namespace zinf
