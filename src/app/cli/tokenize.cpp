// tokenize.cpp — `zinf tokenize`: text files → an llm.c token file, by a tokenizer (io/tokenizer.h:
// SentencePiece or a Hugging Face tokenizer.json, a file or a model folder) or byte by byte.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <optional>

#include "commands.h"
#include "io/data.h"
#include "io/files.h"
#include "io/instruct.h"
#include "io/tokenizer.h"
#include "zinf/error.h"

namespace zinf::cli {
namespace {

// `zinf tokenize --help`.
constexpr const char* kTokenizeAbout =
    "Tokenize text files (concatenated in the order given) into an llm.c token file for data.path: with a "
    "tokenizer (--tokenizer: a SentencePiece tokenizer.model, a Hugging Face byte-level BPE tokenizer.json, or a "
    "model folder holding either), or byte by byte (vocabulary 256) without one. Tokens are stored as uint16 when they fit, "
    "else uint32. With --prompt TEXT instead of files: print the ids `zinf generate` feeds for that prompt (the "
    "tokenizer's post-processor tokens such as Llama 3's BOS, special-token text recognised; --chat renders it as a "
    "user turn) as a JSON list";

struct TokenizeArgs {
  std::vector<std::string> inputs;
  std::string tokenizer, output, prompt, chat, system;
  bool json = false, prompt_given = false, no_bos = false, no_special = false;
};

// --prompt: the ids of one prompt as `zinf generate` encodes it, printed as a JSON list.
int run_prompt(const TokenizeArgs& a) {
  if (!a.inputs.empty() || !a.output.empty())
    throw ConfigError("--prompt prints the prompt's ids; it takes no input files and no --output");
  if (!a.system.empty() && a.chat.empty()) throw ConfigError("--system needs --chat");
  if (a.no_special && !a.chat.empty())
    throw ConfigError("--no-special applies to a plain prompt; a --chat prompt is encoded as its template renders it");
  const ChatTemplate t = a.chat.empty() ? ChatTemplate::none : parse_chat_template_name(a.chat, "--chat");
  const auto tok = a.tokenizer.empty() ? byte_tokenizer() : open_tokenizer(a.tokenizer, "--tokenizer");
  std::optional<ChatFormat> format;
  if (!a.chat.empty()) format = chat_format(t, a.tokenizer, *tok, "--chat");
  const PromptOptions po = prompt_options(a.system, a.no_bos, a.no_special, format ? &*format : nullptr);
  const std::vector<std::uint32_t> ids = encode_generation_prompt(a.prompt, *tok, po);
  std::printf("%s\n", nlohmann::json(ids).dump().c_str());
  return 0;
}

int run_tokenize(const TokenizeArgs& a) {
  if (a.prompt_given) return run_prompt(a);
  if (!a.chat.empty() || !a.system.empty() || a.no_bos || a.no_special)
    throw ConfigError("--chat, --system, --no-bos and --no-special apply to --prompt");
  if (a.inputs.empty()) throw ConfigError("give the text files to tokenize (or --prompt TEXT)");
  if (a.output.empty()) throw ConfigError("--output is required: the token file to write");
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
  sub->add_option("inputs", args->inputs, "Text files")->check(CLI::ExistingFile);
  sub->add_option("--tokenizer", args->tokenizer, "A tokenizer.model, a tokenizer.json, or a model folder holding either")
      ->check(CLI::ExistingPath);
  sub->add_option("-o,--output", args->output,
                  "The token file to write (all or nothing: written beside, then renamed into place; never an input)");
  sub->add_option("--prompt", args->prompt,
                  "Print the ids zinf generate feeds for this prompt (a JSON list) instead of writing a token file")
      ->type_name("TEXT")
      ->each([a = args.get()](const std::string&) { a->prompt_given = true; });
  sub->add_option("--chat", args->chat,
                  "With --prompt: render it as a user turn with a chat format (auto, model, llama3, chatml, qwen2, none)")
      ->type_name("TEMPLATE");
  sub->add_option("--system", args->system, "With --prompt and --chat: a system turn first")->type_name("TEXT");
  sub->add_flag("--no-bos", args->no_bos, "With --prompt: without the post-processor's tokens (BOS)");
  sub->add_flag("--no-special", args->no_special, "With --prompt: special-token text stays plain text");
  sub->add_flag("--json", args->json, "Print a JSON summary on stdout");
  return command(sub, args, run_tokenize);
}

}  // namespace zinf::cli
