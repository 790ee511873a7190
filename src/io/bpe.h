// io/bpe.h — the Hugging Face tokenizer.json byte-level BPE tokenizer (GPT-2, Llama 3, Qwen2, SmolLM)
// behind io/tokenizer.h.
//
// What a file may hold (anything else is one ConfigError naming the file and the part):
//   model          {"type": "BPE", "vocab": {...}, "merges": ["a b", ...] or [["a", "b"], ...],
//                   "ignore_merges": bool}; no unk_token use, no dropout, no subword prefix/suffix;
//   normalizer     null or NFC (libutf8proc; text that is not valid UTF-8 is left as it is);
//   pre_tokenizer  ByteLevel alone (GPT-2's split pattern when use_regex, add_prefix_space honoured),
//                  or a Sequence of one Split {Regex or String pattern, behavior Isolated, invert false}
//                  and a ByteLevel with use_regex false (as Llama 3 and Qwen2 ship), or of Digits and
//                  a ByteLevel with use_regex (as SmolLM ships). The pattern runs
//                  in PCRE2 (UTF, Unicode properties, JIT);
//   added_tokens   matched in the text before the split, longest first. Special ones only with
//                  encode(text, special = true), as io/tokenizer.h documents; non-special ones always
//                  (Hugging Face's behaviour with split_special_tokens). lstrip/rstrip/single_word are
//                  not applied.
//   token_id(piece): an added token's content, or a vocabulary entry as the file spells it (byte-level:
//                  "Ġthe"), else the byte-level spelling of the bytes `piece`.
//   decoder, post_processor: not read (decoding is the byte-level reverse map; no BOS/EOS is added).
//
// Large texts are encoded in parallel (oneTBB): a text is cut into chunks of about 1 MiB, each cut
// just after a newline that is followed by a character other than ASCII white space. Neither
// shipped split pattern (GPT-2's, Llama 3's, Qwen2's) puts such a newline and the next character in
// one piece, and each chunk's split runs on the whole text (look-aheads see past the cut), so the
// pieces are those of one serial pass. Every cut is also checked — the previous chunk's last piece
// must end at it and the next chunk's first match start there — and a cut that fails (a pattern
// that joins across it) is dropped and the two chunks encoded again as one.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "io/tokenizer.h"

namespace zinf {

// A tokenizer from the text of a tokenizer.json; `file` and `what` name it in errors.
std::unique_ptr<Tokenizer> bpe_tokenizer_from_json(std::string_view json_text, const std::string& file,
                                                   const std::string& what);

// Reads the file (a regular file only, see io/files.h) and parses it.
std::unique_ptr<Tokenizer> open_bpe_tokenizer(const std::string& path, const std::string& what);

// encode() with a given chunk size for the parallel split (0: serial), for tests and the benchmark.
// `tok` must come from the two functions above.
std::vector<std::uint32_t> bpe_encode_chunked(const Tokenizer& tok, std::string_view text, bool special,
                                              std::size_t chunk_bytes);

}  // namespace zinf
