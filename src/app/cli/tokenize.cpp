// tokenize.cpp — `zinf tokenize`: text files → an llm.c token file, by a tokenizer (io/tokenizer.h:
// SentencePiece or a Hugging Face tokenizer.json, a file or a model folder) or byte by byte.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>

#include "commands.h"
#include "io/data.h"
#include "io/files.h"
#include "io/tokenizer.h"
#include "zinf/error.h"

namespace zinf::cli {
namespace {

// `zinf tokenize --help`.
constexpr const char* kTokenizeAbout =
    "Tokenize text files (concatenated in the order given) into an llm.c token file for data.path: with a "
    "tokenizer (--tokenizer: a SentencePiece tokenizer.model, a Hugging Face byte-level BPE tokenizer.json, or a "
    "model folder holding either), or byte by byte (vocabulary 256) without one. Tokens are stored as uint16 when they fit, "
    "else uint32";

struct TokenizeArgs {
  std::vector<std::string> inputs;
  std::string tokenizer, output;
  bool json = false;
};

int run_tokenize(const TokenizeArgs& a) {
  // The output is written beside itself and renamed over at the end: were it one of the inputs, the
  // input would be gone. Compared by device and inode, so another spelling or a link counts too.
  std::vector<std::string> inputs = a.inputs;
  if (!a.tokenizer.empty() && !std::filesystem::is_directory(a.tokenizer)) inputs.push_back(a.tokenizer);
  for (const auto& in : inputs)
    if (in == a.output || same_file(in, a.output))
      throw ConfigError("--output " + a.output + ": is the input " + in + "; give the token file another name");
  std::string text;
  for (const auto& in : a.inputs) text += read_input_file(in, "input");
  if (text.empty()) throw ConfigError("tokenize: the input is empty");
  int vocab = 256;
  std::vector<std::uint32_t> tokens;
  if (a.tokenizer.empty())
    tokens.assign(reinterpret_cast<const unsigned char*>(text.data()),
                  reinterpret_cast<const unsigned char*>(text.data()) + text.size());
  else {
    const auto tok = open_tokenizer(a.tokenizer, "--tokenizer");
    vocab = tok->vocab_size();
    tokens = tok->encode(text, false);  // special tokens written in the text stay text
  }
  const int width = write_token_file(a.output, tokens);
  if (a.json) {
    nlohmann::json j = {{"output", a.output},
                        {"tokens", tokens.size()},
                        {"bytes_per_token", width},
                        {"vocab", vocab},
                        {"input_bytes", text.size()}};
    print_json(j);
  } else {
    std::printf("tokenize: %zu tokens (uint%d, vocabulary %d) from %zu bytes of text -> %s\n", tokens.size(), 8 * width,
                vocab, text.size(), a.output.c_str());
  }
  return 0;
}

}  // namespace

Command add_tokenize(CLI::App& app) {
  auto [sub, args] = add_subcommand<TokenizeArgs>(app, "tokenize", kTokenizeAbout);
  sub->add_option("inputs", args->inputs, "Text files")->required()->check(CLI::ExistingFile);
  sub->add_option("--tokenizer", args->tokenizer, "A tokenizer.model, a tokenizer.json, or a model folder holding either")
      ->check(CLI::ExistingPath);
  sub->add_option("-o,--output", args->output,
                  "The token file to write (all or nothing: written beside, then renamed into place; never an input)")
      ->required();
  sub->add_flag("--json", args->json, "Print a JSON summary on stdout");
  return command(sub, args, run_tokenize);
}

}  // namespace zinf::cli
