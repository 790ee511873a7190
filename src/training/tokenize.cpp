// tokenize.cpp — SentencePiece tokenization and llm.c token files (zinf/data.h).
#include <fcntl.h>
#include <sentencepiece_processor.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "zinf/data.h"
#include "zinf/error.h"

namespace zinf {

std::vector<std::uint32_t> sentencepiece_encode(const std::string& model_path, std::string_view text, int* vocab) {
  sentencepiece::SentencePieceProcessor sp;
  const auto st = sp.Load(model_path);
  if (!st.ok()) throw ConfigError(model_path + ": cannot load the SentencePiece model: " + st.ToString());
  std::vector<int> ids;
  const auto enc = sp.Encode(text, &ids);
  if (!enc.ok()) throw Error(model_path + ": tokenizing failed: " + enc.ToString());
  if (vocab) *vocab = sp.GetPieceSize();
  return std::vector<std::uint32_t>(ids.begin(), ids.end());
}

int write_token_file(const std::string& path, const std::vector<std::uint32_t>& tokens) {
  if (tokens.size() > static_cast<std::size_t>(INT32_MAX)) throw Error(path + ": too many tokens for one llm.c token file");
  bool narrow = true;
  for (std::uint32_t t : tokens) narrow = narrow && t <= 0xFFFF;
  std::int32_t header[256] = {};
  header[0] = narrow ? kTokensMagicU16 : kTokensMagicU32;
  header[1] = narrow ? kTokensVersionU16 : kTokensVersionU32;
  header[2] = static_cast<std::int32_t>(tokens.size());
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw Error(tmp + ": cannot write (" + std::strerror(errno) + ")");
    f.write(reinterpret_cast<const char*>(header), sizeof header);
    if (narrow) {
      std::vector<std::uint16_t> n(tokens.begin(), tokens.end());
      f.write(reinterpret_cast<const char*>(n.data()), static_cast<std::streamsize>(n.size() * 2));
    } else {
      f.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * 4));
    }
    f.flush();
    if (!f) throw Error(tmp + ": write failed (" + std::strerror(errno) + ")");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    throw Error(path + ": cannot rename the finished file into place (" + std::strerror(e) + ")");
  }
  return narrow ? 2 : 4;
}

}  // namespace zinf
