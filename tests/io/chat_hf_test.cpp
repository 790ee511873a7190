// chat_hf_test.cpp — zinf's chat encoding and prompt encoding against Hugging Face transformers
// (tests/io/chat_hf_check.py in the checkers' python; skipped, with the reason, without it).
//
// Small byte-level BPE tokenizers trained here (scripts/make-tokenizer.py: GPT-2, Llama 3 and Qwen2
// styles) carry the real Llama 3, Llama 3.1, Qwen2 and ChatML templates (their text as the models
// publish it, written out below as data). Over conversations with leading and trailing newlines,
// empty messages, several turns, with and without a system turn: zinf's ids equal
// apply_chat_template(tokenize=True)'s, for the folder's template and for zinf's built-in formats;
// zinf's loss mask equals transformers' assistant_masks for the same templates with {% generation %}
// around each assistant content and its end marker; and prompts encode as tokenizer(prompt) does.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "common/checkers.h"
#include "common/temp_dir.h"
#include "io/instruct.h"
#include "io/tokenizer.h"

namespace zinf {
namespace {

using json = nlohmann::json;
using test::TempDir;

// Llama 3 Instruct (Meta-Llama-3-8B-Instruct's tokenizer_config.json).
const char* const kLlama3 =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 "
    "%}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";
// The same text, with the assistant's content and <|eot_id|> marked for transformers' assistant mask.
const char* const kLlama3Tagged =
    "{% for message in messages %}{% if loop.index0 == 0 %}{{ bos_token }}{% endif %}{{ '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n' }}{% if message['role'] == 'assistant' %}{% generation %}{{ "
    "message['content'] | trim + '<|eot_id|>' }}{% endgeneration %}{% else %}{{ message['content'] | trim + "
    "'<|eot_id|>' }}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";
// Qwen2 Instruct: ChatML with a default system turn.
const char* const kQwen2 =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou "
    "are a helpful assistant.<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' "
    "}}{% endif %}";
const char* const kQwen2Tagged =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou "
    "are a helpful assistant.<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n'}}{% if "
    "message['role'] == 'assistant' %}{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{% "
    "else %}{{ message['content'] + '<|im_end|>' }}{% endif %}{{ '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\\n' }}{% endif %}";
// ChatML without a default system turn.
const char* const kChatml =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
const char* const kChatmlTagged =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n'}}{% if message['role'] == 'assistant' "
    "%}{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{% else %}{{ message['content'] + "
    "'<|im_end|>' }}{% endif %}{{ '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% "
    "endif %}";
// Llama 3.1 Instruct (the tool-free part of its template; the tool branches parse and are not taken):
// a default system turn with the knowledge cut-off and date.
const char* const kLlama31 = R"TPL({{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\n\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
)TPL";

using Conv = std::vector<std::pair<std::string, std::string>>;

// Conversations that trip a renderer or an encoder: whitespace at either end of a message, empty
// messages, several turns, with and without a system turn, the assistant first, special-token text
// and non-ASCII text.
std::vector<Conv> conversations() {
  return {
      {{"user", "Hi"}, {"assistant", "Hello."}},
      {{"user", "Hi"}, {"assistant", "Hello.\n"}},
      {{"user", "Hi\n"}, {"assistant", "\nHello."}},
      {{"user", "\n\nHi"}, {"assistant", "\n\nHello.\n\n"}},
      {{"system", "Be brief."}, {"user", "Hi?"}, {"assistant", "Hello."}},
      {{"system", "  Be brief.  "}, {"user", " Hi? "}, {"assistant", " Hello. "}},
      {{"system", ""}, {"user", "Q"}, {"assistant", "A"}},
      {{"user", ""}, {"assistant", "A"}},
      {{"user", "Q"}, {"assistant", ""}},
      {{"user", "Q1"}, {"assistant", "A1"}, {"user", "Q2"}, {"assistant", "A2\n"}},
      {{"system", "S"}, {"user", "Q1"}, {"assistant", "A1"}, {"user", "Q2"}, {"assistant", "A2"}, {"user", "Q3"},
       {"assistant", "A3"}},
      {{"user", "What is 12345 * 678?"}, {"assistant", "8369910"}},
      {{"user", "Write code"}, {"assistant", "```python\ndef f(x):\n    return x + 1\n```\n"}},
      {{"user", "tab\tand  spaces   "}, {"assistant", "\t  indented\n\tlines\n"}},
      {{"user", "Ünïcödé façade — “quotes”"}, {"assistant", "日本語のテキスト。e\xCC\x81"}},
      {{"user", "special <|eot_id|> and <|im_end|> inside"}, {"assistant", "ok <|endoftext|>"}},
      {{"user", "ends with a space "}, {"assistant", " starts with one"}},
      {{"user", "\r\nCRLF\r\n"}, {"assistant", "\r\nreply\r\n"}},
      {{"system", "S\n"}, {"user", "\nQ\n"}, {"assistant", "\nA\n"}, {"user", "\n"}, {"assistant", "\n"}},
      {{"user", "don't can't I'm"}, {"assistant", "it's we've they'll"}},
      {{"user", "a"}, {"assistant", "b"}, {"user", "c"}, {"assistant", "d"}, {"user", "e"}, {"assistant", "f"}},
      {{"user", "emoji 👩‍👩‍👧‍👦 👍🏽"}, {"assistant", "🇩🇪 ❤️"}},
      {{"user", "   "}, {"assistant", "   "}},
      {{"user", "Q"}, {"assistant", "A"}, {"user", "only a question at the end"}, {"assistant", "B"}},
      {{"assistant", "The assistant opens."}, {"user", "Q"}, {"assistant", "A"}},
  };
}

json messages_json(const Conv& c) {
  json m = json::array();
  for (const auto& [role, content] : c) m.push_back({{"role", role}, {"content", content}});
  return m;
}

ChatExample example(const Conv& c) {
  ChatExample ex;
  for (const auto& [role, content] : c) ex.push_back({role, content});
  return ex;
}

struct Fixture {
  std::string py, dir;
};

// Runs the checker on `cases` against the folder; the parsed result list.
json hf(const std::string& py, const std::string& folder, const json& cases, TempDir& d) {
  d.write("cases.json", cases.dump());
  const std::string script = std::string(ZINF_SOURCE_DIR) + "/tests/io/chat_hf_check.py";
  const auto r = test::run_python(py, "", {script, folder, d / "cases.json"});
  EXPECT_EQ(r.status, 0) << r.output.substr(0, 4000);
  if (r.status != 0) return json::array();
  // transformers may warn on stderr before the JSON line: the last line is the result.
  const std::size_t nl = r.output.find_last_of('\n', r.output.size() >= 2 ? r.output.size() - 2 : 0);
  return json::parse(nl == std::string::npos ? r.output : r.output.substr(nl + 1));
}

void set_template(const std::string& folder, const std::string& tmpl) {
  const std::string path = folder + "/tokenizer_config.json";
  json tc;
  {
    std::ifstream f(path);
    f >> tc;
  }
  tc["chat_template"] = tmpl;
  std::ofstream(path) << tc.dump(2);
}

std::string corpus(TempDir& d) {
  std::string text;
  {
    std::ifstream f(std::string(ZINF_SOURCE_DIR) + "/LICENSE");
    text.assign(std::istreambuf_iterator<char>(f), {});
  }
  for (const Conv& c : conversations())
    for (int k = 0; k < 20; ++k)
      for (const auto& [role, content] : c) text += role + "\n" + content + "\n";
  d.write("corpus.txt", text);
  return d / "corpus.txt";
}

std::string make_tokenizer(const std::string& py, TempDir& d, const std::string& style) {
  const std::string dir = d / ("tok-" + style);
  const std::string script = std::string(ZINF_SOURCE_DIR) + "/scripts/make-tokenizer.py";
  const auto made = test::run_python(py, "", {script, dir, "700", corpus(d), "--style", style});
  EXPECT_EQ(made.status, 0) << made.output;
  return dir;
}

struct TemplateCase {
  const char* name;
  const char* text;
  const char* tagged;  // nullptr: ids only
  ChatTemplate builtin;  // the built-in format that must give the same ids, or none
};

void check_chats(const std::string& style, const std::vector<TemplateCase>& templates) {
  const std::string py = test::checker_python("transformers");
  if (py.empty()) GTEST_SKIP() << test::checker_missing("transformers");
  TempDir d("chat-hf-" + style);
  const std::string dir = make_tokenizer(py, d, style);
  const std::vector<Conv> convs = conversations();
  ASSERT_GE(convs.size(), 20u);
  for (const TemplateCase& tc : templates) {
    json cases = json::array();
    for (const Conv& c : convs) {
      cases.push_back({{"template", tc.text}, {"messages", messages_json(c)}, {"add_generation_prompt", false}});
      Conv prompt = c;
      prompt.pop_back();  // ends with a user turn: the generation prompt
      cases.push_back({{"template", tc.text}, {"messages", messages_json(prompt)}, {"add_generation_prompt", true}});
      if (tc.tagged)
        cases.push_back({{"template", tc.tagged}, {"messages", messages_json(c)}, {"mask", true}});
    }
    const json want = hf(py, dir, cases, d);
    ASSERT_EQ(want.size(), cases.size()) << tc.name;
    set_template(dir, tc.text);
    const auto tok = open_tokenizer(dir);
    const ChatFormat folder = chat_format(ChatTemplate::model, dir, *tok, "data.chat_template");
    std::optional<ChatFormat> builtin;
    if (tc.builtin != ChatTemplate::none) builtin = chat_format(tc.builtin, dir, *tok, "data.chat_template");
    std::size_t k = 0;
    for (std::size_t i = 0; i < convs.size(); ++i) {
      const ChatExample ex = example(convs[i]);
      ChatExample prompt = ex;
      prompt.pop_back();
      const std::string what = std::string(tc.name) + " (" + style + ") conversation " + std::to_string(i) + ": " +
                               json(messages_json(convs[i])).dump();
      const TokenizedExample te = tokenize_chat(ex, folder, *tok);
      EXPECT_EQ(json(te.ids), want[k]["ids"]) << what;
      const std::vector<std::uint32_t> p = chat_prompt_ids(prompt, folder, *tok);
      EXPECT_EQ(json(p), want[k + 1]["ids"]) << what << " (generation prompt)";
      if (builtin) {
        EXPECT_EQ(json(tokenize_chat(ex, *builtin, *tok).ids), want[k]["ids"]) << what << " (built-in)";
        EXPECT_EQ(json(chat_prompt_ids(prompt, *builtin, *tok)), want[k + 1]["ids"]) << what << " (built-in prompt)";
        EXPECT_EQ(tokenize_chat(ex, *builtin, *tok).target, te.target) << what << " (built-in mask)";
      }
      k += 2;
      if (tc.tagged) {
        ASSERT_EQ(want[k]["ids"], json(te.ids)) << what << " (the tagged template renders the same text)";
        std::vector<int> mask;
        for (bool t : te.target) mask.push_back(t ? 1 : 0);
        EXPECT_EQ(json(mask), want[k]["mask"]) << what;
        ++k;
      }
    }
  }
}

TEST(ChatHf, Llama3TemplatesGiveTheIdsAndMaskOfTransformers) {
  check_chats("llama3", {{"llama3", kLlama3, kLlama3Tagged, ChatTemplate::llama3},
                         {"llama3.1", kLlama31, nullptr, ChatTemplate::none}});
}

TEST(ChatHf, Qwen2AndChatmlTemplatesGiveTheIdsAndMaskOfTransformers) {
  check_chats("qwen2", {{"qwen2", kQwen2, kQwen2Tagged, ChatTemplate::qwen2},
                        {"chatml", kChatml, kChatmlTagged, ChatTemplate::chatml}});
}

TEST(ChatHf, ChatmlOnAGpt2StyleTokenizer) {
  check_chats("gpt2", {{"chatml", kChatml, kChatmlTagged, ChatTemplate::chatml}});
}

// Prompts as `zinf tokenize --prompt` (the ids zinf generate feeds) encodes them, against
// tokenizer(prompt)["input_ids"]: BOS only where the post-processor puts one (Llama 3, not GPT-2 or
// Qwen2), special-token text recognised, or kept as text with --no-special (split_special_tokens).
TEST(ChatHf, PromptsEncodeAsTheTokenizerDoes) {
  const std::string py = test::checker_python("transformers");
  if (py.empty()) GTEST_SKIP() << test::checker_missing("transformers");
  TempDir d("chat-hf-prompts");
  const std::vector<std::string> prompts = {
      "Hello world",
      " leading space",
      "trailing newline\n",
      "<|endoftext|>starts with a special token",
      "in the <|im_start|>middle<|im_end|> and at the end<|eot_id|>",
      "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
      "almost special <|eot_id and <|im_end",
      "Ünïcödé e\xCC\x81 日本語",
      "",
  };
  for (const std::string style : {"gpt2", "llama3", "qwen2"}) {
    const std::string dir = make_tokenizer(py, d, style);
    json cases = json::array();
    for (const std::string& p : prompts) {
      cases.push_back({{"prompt", p}});
      cases.push_back({{"prompt", p}, {"split_special_tokens", true}});
    }
    const json want = hf(py, dir, cases, d);
    ASSERT_EQ(want.size(), cases.size());
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      for (int plain = 0; plain < 2; ++plain) {
        const std::string out = (d / "ids.json");
        std::string cmd = std::string(ZINF_BIN) + " tokenize --tokenizer " + test::shell_quote(dir) + " --prompt " +
                          test::shell_quote(prompts[i]) + (plain ? " --no-special" : "") + " > " +
                          test::shell_quote(out) + " 2>&1";
        const int rc = std::system(cmd.c_str());
        std::ifstream f(out);
        const std::string text((std::istreambuf_iterator<char>(f)), {});
        ASSERT_EQ(rc, 0) << text;
        EXPECT_EQ(json::parse(text), want[2 * i + static_cast<std::size_t>(plain)]["ids"])
            << style << (plain ? " --no-special: " : ": ") << prompts[i];
      }
    }
  }
}

}  // namespace
}  // namespace zinf
