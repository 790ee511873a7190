// token_file_fuzz.cpp — llm.c token files (a 256×int32 header: magic, version, token count; then
// uint16 or uint32 tokens) on arbitrary bytes, read as TokenData::load reads a data.path: mapped
// from a file (here a memfd), with data.format "tokens" and "auto". Data it accepts must be whole:
// the count matches the file, every token is inside the vocabulary, and every training and
// validation window it hands out stays inside the data.
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "io/data.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static zinf::fuzz::MemFile file;
  constexpr int kVocab = 50257, kSeq = 4, kBatch = 2;
  zinf::DataConfig cfg;
  cfg.path = file.set(data, size);
  cfg.val_fraction = 0.25;
  for (zinf::DataFormat format : {zinf::DataFormat::tokens, zinf::DataFormat::automatic}) {
    cfg.format = format;
    std::vector<zinf::TokenData> loaded;
    if (!zinf::fuzz::expect_clean("TokenData::load",
                                  [&] { loaded.push_back(zinf::TokenData::load(cfg, kVocab, kSeq)); }))
      continue;
    const zinf::TokenData& d = loaded.front();
    if (d.train_tokens() + d.val_tokens() != d.size() || d.train_tokens() <= kSeq || d.val_tokens() <= kSeq)
      zinf::fuzz::violated("the splits do not add up or are too short");
    if (format == zinf::DataFormat::tokens && 1024 + d.size() * 2 != size && 1024 + d.size() * 4 != size)
      zinf::fuzz::violated("the token count does not match the file size");
    for (std::size_t i = 0; i < d.size(); ++i)
      if (d.at(i) >= static_cast<std::uint32_t>(kVocab))
        zinf::fuzz::violated("a token outside the vocabulary was accepted");
    std::mt19937_64 rng(size);
    std::vector<int> in(kBatch * kSeq), out(kBatch * kSeq);
    for (int k = 0; k < 4; ++k) d.sample_train(rng, kBatch, kSeq, in.data(), out.data());
    for (int k = 0; k < 3; ++k) d.val_batch(k, 3, kBatch, kSeq, in.data(), out.data());
  }
  return 0;
}
