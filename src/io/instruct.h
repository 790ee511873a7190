// io/instruct.h — instruction (chat) fine-tuning data: a JSONL file of examples, rendered with a chat
// template and tokenized into token ids and a loss mask.
//
// Each line of the file is one example, either
//   {"prompt": "...", "completion": "..."}            (a user turn and the assistant's answer), or
//   {"messages": [{"role": "system|user|assistant", "content": "..."}, ...]}.
// Blank lines are skipped. Anything else is one ConfigError naming the file and the line number.
//
// Templates (spelled out here, not read from the model's Jinja text):
//   llama3  <|begin_of_text|> then per message <|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT<|eot_id|>
//   chatml  per message <|im_start|>ROLE\nCONTENT<|im_end|>\n   (Qwen2; no default system message added)
//   none    BOS (when the tokenizer names one), the contents one after the other, EOS after each
//           assistant content (when the tokenizer names one)
// Markers are tokenized with special tokens on; contents with them off, separately, so a content
// cannot forge a marker. Only assistant contents and their end-of-turn marker (<|eot_id|>,
// <|im_end|>, EOS) are training targets; everything else is masked.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "io/tokenizer.h"

namespace zinf {

enum class ChatTemplate { automatic, llama3, chatml, none };

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

// A piece of rendered text: a template marker (tokenized with special tokens) or a message's
// content (tokenized without); `target`: its tokens are trained on.
// A piece with `id` set is that one token (BOS/EOS of `none`, which a SentencePiece model cannot
// spell as text).
struct ChatPiece {
  std::string text;
  bool special = false;
  bool target = false;
  std::optional<std::uint32_t> id;
};

// The example rendered with `t` (automatic renders as none). `bos`/`eos`: the tokenizer's, for `none`
// (absent: none added).
std::vector<ChatPiece> render_chat(const ChatExample& ex, ChatTemplate t, std::optional<std::uint32_t> bos = {},
                                   std::optional<std::uint32_t> eos = {});

// A conversation rendered as the prompt that asks the model for the next assistant turn (what
// Hugging Face calls the generation prompt): the messages as render_chat writes them, then the
// assistant's header (`<|start_header_id|>assistant<|end_header_id|>\n\n` for llama3,
// `<|im_start|>assistant\n` for chatml, nothing for none). Nothing is a target.
std::vector<ChatPiece> render_generation_prompt(const ChatExample& ex, ChatTemplate t,
                                                std::optional<std::uint32_t> bos = {});

// Token ids of an example and, per id, whether it is a target.
struct TokenizedExample {
  std::vector<std::uint32_t> ids;
  std::vector<bool> target;
};
TokenizedExample tokenize_chat(const std::vector<ChatPiece>& pieces, const Tokenizer& tok);

// The template `auto` means for a model folder (or the folder of a tokenizer file): its
// tokenizer_config.json's chat_template holding "<|start_header_id|>" → llama3, "<|im_start|>" →
// chatml; without a chat_template, config.json's model_type qwen2 → chatml; otherwise none (Llama 2
// and base models have no chat markers). `why` receives a few words on how it was decided.
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

// llama3 and chatml render their markers as special tokens: a ConfigError "<what> <template>: the
// tokenizer (…) has no special token <marker>" when `tok` lacks one (`what` names the setting:
// "data.chat_template", "--chat"), rather than markers encoded as plain text.
void check_chat_markers(ChatTemplate t, const Tokenizer& tok, const std::string& what);

// Windows of seq_len from already parsed examples (tests and the loader share it). `pad` is the
// input id of padding positions (masked). Examples without a target after truncation are dropped.
// llama3 and chatml need the tokenizer to know their markers as special tokens (a ConfigError naming
// data.chat_template otherwise).
InstructSet make_instruct_windows(const std::vector<ChatExample>& examples, ChatTemplate t, const Tokenizer& tok,
                                  int seq_len, std::uint32_t pad);

}  // namespace zinf
