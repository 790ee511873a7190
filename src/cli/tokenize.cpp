// tokenize.cpp — `zinf tokenize`: text files → an llm.c token file, by a SentencePiece model or
// byte by byte.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "commands.h"
#include "zinf/data.h"
#include "zinf/error.h"

namespace zinf::cli {
namespace {

struct TokenizeArgs {
  std::vector<std::string> inputs;
  std::string tokenizer, output;
  bool json = false;
};

int run_tokenize(const TokenizeArgs& a) {
  std::string text;
  for (const auto& in : a.inputs) {
    std::error_code ec;
    if (std::filesystem::is_directory(in, ec)) throw ConfigError(in + ": is a directory, expected a text file");
    std::ifstream f(in, std::ios::binary);
    if (!f) throw ConfigError(in + ": cannot open (" + std::strerror(errno) + ")");
    text.append(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  if (text.empty()) throw ConfigError("tokenize: the input is empty");
  int vocab = 256;
  std::vector<std::uint32_t> tokens;
  if (a.tokenizer.empty())
    tokens.assign(reinterpret_cast<const unsigned char*>(text.data()), reinterpret_cast<const unsigned char*>(text.data()) + text.size());
  else
    tokens = sentencepiece_encode(a.tokenizer, text, &vocab);
  const int width = write_token_file(a.output, tokens);
  if (a.json) {
    nlohmann::json j = {{"output", a.output}, {"tokens", tokens.size()}, {"bytes_per_token", width}, {"vocab", vocab},
                        {"input_bytes", text.size()}};
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("tokenize: %zu tokens (uint%d, vocabulary %d) from %zu bytes of text -> %s\n", tokens.size(), 8 * width, vocab,
                text.size(), a.output.c_str());
  }
  return 0;
}

}  // namespace

Command add_tokenize(CLI::App& app) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* sub = app.add_subcommand(
      "tokenize",
      "Tokenize text files (concatenated in the order given) into an llm.c token file for data.path: with a SentencePiece "
      "model (--tokenizer), or byte by byte (vocabulary 256) without one. Tokens are stored as uint16 when they fit, "
      "else uint32");
  sub->add_option("inputs", args->inputs, "Text files")->required()->check(CLI::ExistingFile);
  sub->add_option("--tokenizer", args->tokenizer, "A SentencePiece tokenizer.model")->check(CLI::ExistingFile);
  sub->add_option("-o,--output", args->output, "The token file to write")->required();
  sub->add_flag("--json", args->json, "Print a JSON summary on stdout");
  return {sub, [args] { return run_tokenize(*args); }};
}

}  // namespace zinf::cli
