// tokenize.cpp — SentencePiece tokenization and llm.c token files (io/data.h).
#include <sentencepiece_processor.h>

#include <cerrno>
#include <cstring>

#include "io/data.h"
#include "io/files.h"
#include "zinf/error.h"

namespace zinf {

namespace {

// SentencePiece's status text carries its source location and the failed expression
// ("./src/sentencepiece_processor.cc(232) [model_proto->ParseFromArray(...)] "); a user needs neither.
std::string status_text(const sentencepiece::util::Status& st) {
  std::string m(st.message());
  // Cut "FILE.cc(LINE) [EXPR] " (EXPR may hold brackets: up to the last ']'). No std::regex: GCC 12's
  // <regex> trips -Wmaybe-uninitialized in sanitizer builds.
  const auto cc = m.find(".cc(");
  const auto open = cc == std::string::npos ? cc : m.find(") [", cc);
  const auto close = m.rfind(']');
  if (open != std::string::npos && close != std::string::npos && close > open) {
    const auto space = m.find_last_of(" [", cc);
    const std::size_t begin = space == std::string::npos ? 0 : space + 1;
    std::size_t end = close + 1;
    if (end < m.size() && m[end] == ' ') ++end;
    m.erase(begin, end - begin);
  }
  while (!m.empty() && (m.back() == ' ' || m.back() == '\n')) m.pop_back();
  return m;
}

}  // namespace

std::vector<std::uint32_t> sentencepiece_encode(const std::string& model_path, std::string_view text, int* vocab,
                                                const std::string& what) {
  // Read here, not by the library: only a regular file is read (see InputFile), and a bad file is
  // zinf's one line rather than the library's.
  const std::string bytes = read_input_file(model_path, what);
  sentencepiece::SentencePieceProcessor sp;
  const auto st = sp.LoadFromSerializedProto(bytes);
  if (!st.ok()) {
    const std::string why = status_text(st);
    throw ConfigError(what + " " + model_path + ": not a SentencePiece model (" +
                          (why.empty() ? "it does not parse as one" : why) + ")",
                      "give the tokenizer.model file that came with the model");
  }
  std::vector<int> ids;
  const auto enc = sp.Encode(text, &ids);
  if (!enc.ok()) throw Error(what + " " + model_path + ": tokenizing failed: " + status_text(enc));
  if (vocab) *vocab = sp.GetPieceSize();
  return std::vector<std::uint32_t>(ids.begin(), ids.end());
}

int write_token_file(const std::string& path, const std::vector<std::uint32_t>& tokens) {
  if (tokens.size() > static_cast<std::size_t>(INT32_MAX))
    throw Error(path + ": too many tokens for one llm.c token file");
  bool narrow = true;
  for (std::uint32_t t : tokens) narrow = narrow && t <= 0xFFFF;
  std::int32_t header[256] = {};
  header[0] = narrow ? kTokensMagicU16 : kTokensMagicU32;
  header[1] = narrow ? kTokensVersionU16 : kTokensVersionU32;
  header[2] = static_cast<std::int32_t>(tokens.size());
  OutputFile f(path, "--output");  // all or nothing: a failed write leaves no file and the old one untouched
  f.write(header, sizeof header);
  if (narrow) {
    std::vector<std::uint16_t> n(tokens.begin(), tokens.end());
    f.write(n.data(), n.size() * 2);
  } else {
    f.write(tokens.data(), tokens.size() * 4);
  }
  f.commit();
  return narrow ? 2 : 4;
}

}  // namespace zinf
