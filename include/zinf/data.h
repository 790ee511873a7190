// zinf/data.h — training data: byte-level tokens from any UTF-8 text file (vocab 256), or llm.c's
// token files (a 256×int32 header — magic 20240520, version 1, token count — then uint16 tokens).
// With no path, the default text is every licence in /usr/share/common-licenses (Debian's
// base-files package, about 300 KB of English on every Debian system), read in name order.
//
// The last val_fraction of the tokens is the validation split. Training windows are drawn from the
// seed (deterministic, and resumable from the number of windows drawn); validation batches are
// fixed windows spread evenly over the split. Errors (missing, empty, malformed, too short, token
// out of range) are one ConfigError line naming the file.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "zinf/config.h"

namespace zinf {

class TokenData {
 public:
  static TokenData load(const DataConfig& cfg, int vocab_size, int seq_len);

  std::size_t train_tokens() const { return split_; }
  std::size_t val_tokens() const { return tokens_.size() - split_; }
  const std::string& description() const { return description_; }

  // B windows of T+1 tokens from the training split: inputs[b,t] and targets[b,t] = next token.
  void sample_train(std::mt19937_64& rng, int B, int T, int* inputs, int* targets) const;
  // Validation batch `index` of `count`: fixed windows spread over the validation split.
  void val_batch(int index, int count, int B, int T, int* inputs, int* targets) const;

 private:
  std::vector<std::uint16_t> tokens_;
  std::size_t split_ = 0;
  std::string description_;
};

}  // namespace zinf
