// tokenizer_json_fuzz.cpp — Hugging Face tokenizer.json files (io/bpe.h) on arbitrary bytes, and the
// encode of a text with what parses. The input is the file, or the file, a NUL byte and the text.
// What parses must round-trip the text byte for byte, give ids inside the vocabulary, and give the
// same ids in small parallel chunks as in one pass.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_common.h"
#include "io/bpe.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view all(reinterpret_cast<const char*>(data), size);
  const std::size_t nul = all.find('\0');
  const std::string_view file = all.substr(0, nul);
  const std::string text = nul == std::string_view::npos
                               ? std::string("Hello world 1234567 don't\n  <|eot_id|> caf\xC3\xA9\n\xFFmore text\n")
                               : std::string(all.substr(nul + 1));
  std::unique_ptr<zinf::Tokenizer> tok;
  if (!zinf::fuzz::expect_clean("bpe_tokenizer_from_json",
                                [&] { tok = zinf::bpe_tokenizer_from_json(file, "tokenizer.json", "--tokenizer"); }))
    return 0;
  for (bool special : {false, true}) {
    std::vector<std::uint32_t> ids, chunked;
    if (!zinf::fuzz::expect_clean("encode", [&] { ids = zinf::bpe_encode_chunked(*tok, text, special, 0); })) continue;
    for (std::uint32_t id : ids)
      if (id >= static_cast<std::uint32_t>(tok->vocab_size())) zinf::fuzz::violated("an id outside the vocabulary");
    zinf::fuzz::expect_clean("encode in chunks", [&] { chunked = zinf::bpe_encode_chunked(*tok, text, special, 16); });
    if (chunked != ids) zinf::fuzz::violated("the chunked encode differs from the serial one");
    std::string back;
    if (zinf::fuzz::expect_clean("decode", [&] { back = tok->decode(ids); }) && back != text) {
      // NFC changes the text; without a normalizer the bytes come back as they went in.
      if (file.find("NFC") == std::string_view::npos) zinf::fuzz::violated("decode(encode(text)) != text");
    }
  }
  return 0;
}
