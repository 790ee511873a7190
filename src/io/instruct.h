// io/instruct.h — instruction (chat) fine-tuning data: a JSONL file of examples, rendered with a chat
// template and tokenized into token ids and a loss mask.
//
// Each line of the file is one example, either
//   {"prompt": "...", "completion": "..."}            (a user turn and the assistant's answer), or
//   {"messages": [{"role": "system|user|assistant", "content": "..."}, ...]}.
// Blank lines are skipped. Anything else is one ConfigError naming the file and the line number.
//
// Chat formats (data.chat_template, zinf generate --chat):
//   model   the model folder's own Jinja template: chat_template.jinja, else tokenizer_config.json's
//           "chat_template" (a string, or the entry named "default" of a list), rendered by io/jinja.h
//           as transformers' apply_chat_template renders it;
//   llama3  Llama 3 Instruct's template (each message trimmed, <|begin_of_text|> first):
//           <|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT<|eot_id|>
//   chatml  <|im_start|>ROLE\nCONTENT<|im_end|>\n per message, no default system turn;
//   qwen2   ChatML with Qwen2's default system turn ("You are a helpful assistant.") when the
//           conversation has none;
//   none    BOS (when the tokenizer names one), the contents one after the other, EOS after each
//           assistant content (when the tokenizer names one);
//   auto    model when the folder has a template, else qwen2 for a config.json model_type qwen2,
//           else none.
// llama3, chatml and qwen2 are Jinja texts written here (builtin_chat_template) and rendered like a
// folder's. The rendered conversation is encoded as the tokenizer encodes text: special tokens
// written anywhere in it (the template's markers, or a message's own text) become their ids, the
// text between them goes through the normalizer and the pre-tokenizer as one piece, as
// apply_chat_template(tokenize=True) does.
//
// The loss mask comes from the assistant turns' spans in the rendered text, found by rendering
// prefixes: for assistant message i the span runs from the end of messages[0, i) rendered with the
// generation prompt to the end of messages[0, i] rendered without it, and ends after the last token
// there that ends the turn — a special token, or one of the tokenizer's EOS ids: ChatML's "\n" after
// <|im_end|> is not trained. (Where that generation prompt does not lead into the turn — an
// assistant-first conversation under Llama 3's template — the start is where the rendering of
// messages[0, i] with a stand-in content puts the stand-in.) Each rendering must be a prefix of the next (a template that
// rewrites earlier turns is refused). Tokens overlapping a span are trained, as transformers' assistant
// masks count them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "io/jinja.h"
#include "io/tokenizer.h"

namespace zinf {

enum class ChatTemplate { automatic, llama3, chatml, qwen2, model, none };

std::string chat_template_name(ChatTemplate t);

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

// One example as read: a prompt-completion line becomes a user and an assistant message.
using ChatExample = std::vector<ChatMessage>;

// Parses one JSONL line. `where` ("FILE line N") leads the error. Throws ConfigError on malformed
// JSON, a missing or mistyped field, an unknown role, empty messages or no assistant message.
ChatExample parse_chat_line(std::string_view line, const std::string& where);

// Every example of a JSONL text (blank lines skipped); `source` (the file) names errors with the line.
std::vector<ChatExample> parse_chat_jsonl(std::string_view text, const std::string& source);

// A format by its name (auto, model, llama3, chatml, qwen2, none): a ConfigError naming `what` otherwise.
ChatTemplate parse_chat_template_name(const std::string& v, const std::string& what);

// The Jinja text of a built-in format (llama3, chatml, qwen2); "" for the others.
std::string builtin_chat_template(ChatTemplate t);

// A folder's own template: chat_template.jinja, else tokenizer_config.json's chat_template (a
// string, or a list of {"name", "template"}: the one named "default"). nullopt when it has none;
// `source` receives the file it came from. `path` is a folder or a file in it.
std::optional<std::string> folder_chat_template(const std::string& path, const std::string& what,
                                                std::string* source = nullptr);

// A resolved, compiled chat format.
struct ChatFormat {
  ChatTemplate kind = ChatTemplate::none;
  std::string reason;                            // how it was chosen (auto) or where it came from
  std::shared_ptr<const jinja::Template> tmpl;   // every kind but none
  jinja::Value specials = jinja::Value::make_dict();  // bos_token, eos_token, …: the template's variables
  std::vector<std::uint32_t> end_ids;            // EOS ids and the format's end marker: they end a turn
  std::optional<std::uint32_t> bos, eos;         // none: the tokenizer's BOS and first EOS
};

// `t` resolved (auto) and compiled for `tok`, whose folder is `path` (a tokenizer file or folder;
// "" when there is none). ConfigError naming `what` when the template uses a construct the renderer
// refuses, when a built-in's markers are not special tokens of `tok`, or when `t` is model and the
// folder has no template.
ChatFormat chat_format(ChatTemplate t, const std::string& path, const Tokenizer& tok, const std::string& what);

// The rendered text and the assistant spans [begin, end) in it (see above; empty with a generation prompt).
struct RenderedChat {
  std::string text;
  std::vector<std::pair<std::size_t, std::size_t>> spans;
};
// `where` names the example in errors (a template's raise_exception, a template that rewrites
// earlier turns): one ConfigError.
RenderedChat render_chat(const ChatExample& ex, const ChatFormat& f, bool generation_prompt,
                         const std::string& where = "the conversation");

// Token ids of an example and, per id, whether it is a target.
struct TokenizedExample {
  std::vector<std::uint32_t> ids;
  std::vector<bool> target;
};
TokenizedExample tokenize_chat(const ChatExample& ex, const ChatFormat& f, const Tokenizer& tok,
                               const std::string& where = "the conversation");

// A conversation as the prompt that asks for the next assistant turn (the generation prompt), as
// ids. For none: BOS (when `bos` and the tokenizer names one), then the contents.
std::vector<std::uint32_t> chat_prompt_ids(const ChatExample& ex, const ChatFormat& f, const Tokenizer& tok,
                                           bool bos = true);

// The ids `zinf generate` feeds for a prompt (`zinf tokenize --prompt` prints them). Without `chat`:
// the text as the tokenizer encodes a prompt (Tokenizer::encode_prompt: the post-processor's BOS unless
// `bos` is false; special tokens written in the text recognised unless `special` is false). With it:
// a user turn (after a system turn when `system` is not empty), rendered with the generation prompt.
struct PromptOptions {
  const ChatFormat* chat = nullptr;
  std::string system;
  bool bos = true, special = true;
};
std::vector<std::uint32_t> encode_generation_prompt(const std::string& text, const Tokenizer& tok,
                                                    const PromptOptions& o);

// The template `auto` means for a model folder (or the folder of a tokenizer file), as above.
// `why` receives a few words on how it was decided.
ChatTemplate detect_chat_template(const std::string& path, std::string* why = nullptr);

// One training window per example: inputs[t] = ids[t], targets[t] = ids[t+1] when that token is a
// target, else kIgnoreTarget (-1). Only the example's own positions are held (at most seq_len);
// InstructSet::write pads the rest of the window.
struct ExampleWindow {
  std::vector<std::int32_t> inputs, targets;
  std::size_t target_count = 0;
};

// The examples of a JSONL file as windows of seq_len, plus what happened on the way.
struct InstructSet {
  std::vector<ExampleWindow> windows;  // training examples first, then validation examples
  std::size_t train_count = 0;         // windows[0, train_count) train; the rest validate
  std::size_t examples = 0;            // lines read
  std::size_t truncated = 0;           // longer than seq_len + 1 tokens: cut
  std::size_t dropped = 0;             // no target token left after the cut
  ChatTemplate chat_template = ChatTemplate::none;
  std::string template_reason;
  int seq_len = 0;
  std::int32_t pad = 0;  // the input id of padding positions (their targets are masked)

  // Window i as seq_len inputs and targets, padded: inputs `pad`, targets kIgnoreTarget.
  void write(std::size_t i, int* inputs, int* targets) const;
};

// llama3, chatml and qwen2 write their markers as special tokens: a ConfigError "<what> <template>:
// the tokenizer (…) has no special token <marker>" when `tok` lacks one (`what` names the setting:
// "data.chat_template", "--chat"), rather than markers encoded as plain text.
void check_chat_markers(ChatTemplate t, const Tokenizer& tok, const std::string& what);

// Windows of seq_len from already parsed examples (tests and the loader share it). `pad` is the
// input id of padding positions (masked). Examples without a target after truncation are dropped.
InstructSet make_instruct_windows(const std::vector<ChatExample>& examples, const ChatFormat& f, const Tokenizer& tok,
                                  int seq_len, std::uint32_t pad);

}  // namespace zinf
