// jinja_test.cpp — the chat-template subset of Jinja (io/jinja.h): hand-worked renderings of each
// construct, transformers' whitespace settings (trim_blocks, lstrip_blocks, one trailing newline
// dropped), errors a template raises while rendering, and the constructs refused at compile time.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "io/jinja.h"
#include "zinf/error.h"

namespace zinf::jinja {
namespace {

std::string render_text(const std::string& tmpl, const nlohmann::json& ctx = nlohmann::json::object()) {
  return render(*compile(tmpl, "t"), from_json(ctx));
}

const nlohmann::json kChat = {
    {"messages",
     {{{"role", "system"}, {"content", " S "}}, {{"role", "user"}, {"content", "Hi"}}, {{"role", "assistant"}, {"content", "Yo\n"}}}},
    {"bos_token", "<s>"},
    {"add_generation_prompt", true}};

TEST(Jinja, TextAndOutput) {
  EXPECT_EQ(render_text("plain text"), "plain text");
  EXPECT_EQ(render_text("{{ 'a' + 'b' }}{{ 1 + 2 * 3 }}{{ x }}", {{"x", "!"}}), "ab7!");
  EXPECT_EQ(render_text("[{{ undefined_name }}]"), "[]");
  EXPECT_EQ(render_text("{{ none }} {{ true }} {{ False }} {{ 2.5 }} {{ 3.0 }} {{ [1, 'a'] }} {{ {'k': none} }}"),
            "None True False 2.5 3.0 [1, 'a'] {'k': None}");
  EXPECT_EQ(render_text("{{ 'a\\nb\\t\\'c\\' \\u00e9 \\x41' }}"), "a\nb\t'c' \xC3\xA9 A");
  EXPECT_EQ(render_text("{{ \"it's\" ~ 1 ~ none }}"), "it's1None");
  EXPECT_EQ(render_text("{# a comment #}x"), "x");
}

TEST(Jinja, Arithmetic) {
  EXPECT_EQ(render_text("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 1 / 4 }} {{ 6 / 3 }}"),
            "3 -4 2 -2 1024 0.25 2.0");
  EXPECT_EQ(render_text("{{ -x }} {{ 'ab' * 3 }} {{ [1] + [2] }}", {{"x", 4}}), "-4 ababab [1, 2]");
}

TEST(Jinja, ComparisonsAndLogic) {
  EXPECT_EQ(render_text("{{ 1 == 1.0 }} {{ 'a' != 'b' }} {{ 2 < 3 }} {{ 'b' >= 'a' }} {{ 1 == '1' }}"),
            "True True True True False");
  EXPECT_EQ(render_text("{{ 'ell' in 'hello' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1] }}"),
            "True True True True");
  EXPECT_EQ(render_text("{{ 0 or 'x' }} {{ 1 and 'y' }} {{ not '' }} {{ not 1 == 1 }}"), "x y True False");
  EXPECT_EQ(render_text("{{ 'a' if x else 'b' }}{{ 'c' if not x }}", {{"x", false}}), "bc");
  // (user) != (index even): Mistral's alternation check.
  EXPECT_EQ(render_text("{{ (r == 'user') != (i % 2 == 0) }}", {{"r", "user"}, {"i", 1}}), "True");
}

TEST(Jinja, TestsAndFilters) {
  EXPECT_EQ(render_text("{{ x is defined }} {{ y is defined }} {{ y is undefined }} {{ n is none }} {{ n is not none }}",
                        {{"x", 1}, {"n", nullptr}}),
            "True False True True False");
  EXPECT_EQ(render_text("{{ 's' is string }} {{ 1 is number }} {{ {} is mapping }} {{ [] is iterable }} {{ 4 is even }}"),
            "True True True True True");
  EXPECT_EQ(render_text("{{ x is false }} {{ x is true }} {{ 6 is divisibleby 3 }} {{ 1 is eq 1 }}", {{"x", false}}),
            "True False True True");
  EXPECT_EQ(render_text("[{{ ' \\t a b \\n' | trim }}] {{ [1, 2, 3] | length }} {{ 'héé' | length }} {{ 'Ab' | upper }}"
                        "{{ 'Ab' | lower }}"),
            "[a b] 3 3 ABab");
  EXPECT_EQ(render_text("{{ y | default('d') }} {{ '' | default('e', true) }} {{ '' | default('f') }}|"), "d e |");
  EXPECT_EQ(render_text("{{ [3, 1, 2] | sort | join(',') }} {{ [1, 2] | first }} {{ [1, 2] | last }} "
                        "{{ 'abc' | reverse }} {{ [1, 1, 2] | unique | list }}"),
            "1,2,3 1 2 cba [1, 2]");
  EXPECT_EQ(render_text("{{ m | map(attribute='role') | join('|') }} {{ m | selectattr('role', 'equalto', 'user') | "
                        "length }} {{ ['a', 'code'] | reject('equalto', 'code') | list }}",
                        {{"m", kChat["messages"]}}),
            "system|user|assistant 1 ['a']");
  EXPECT_EQ(render_text("{{ {'a': [1, 'x\"y'], 'b': none, 'c': true} | tojson }}"),
            "{\"a\": [1, \"x\\\"y\"], \"b\": null, \"c\": true}");
  EXPECT_EQ(render_text("{{ {'a': [1]} | tojson(indent=2) }}"), "{\n  \"a\": [\n    1\n  ]\n}");
  EXPECT_EQ(render_text("{{ 'é' | tojson }}"), "\"\xC3\xA9\"");  // ensure_ascii off, as transformers has it
}

TEST(Jinja, SubscriptsSlicesAttributesAndMethods) {
  const nlohmann::json ctx = kChat;
  EXPECT_EQ(render_text("{{ messages[0]['role'] }} {{ messages[-1].content | trim }} {{ messages[5] is defined }}", ctx),
            "system Yo False");
  EXPECT_EQ(render_text("{{ messages[1:] | length }} {{ [1, 2, 3, 4][::-1] }} {{ 'abcdef'[1:4] }} {{ 'abc'[-1] }}", ctx),
            "2 [4, 3, 2, 1] bcd c");
  EXPECT_EQ(render_text("{{ m.tool_calls is defined }} {{ not m.tool_calls }}", {{"m", {{"role", "user"}}}}),
            "False True");
  EXPECT_EQ(render_text("{{ ' x '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '\\n\\nb'.lstrip('\\n') }}|"
                        "{{ 'a</think>b'.split('</think>')[-1] }}|{{ 'a b  c'.split() }}|{{ 'ab'.startswith('a') }}"
                        "|{{ 'ab'.endswith(('x', 'b')) }}|{{ 'a-b'.replace('-', '+') }}|{{ {'k': 1}.get('z', 2) }}"),
            "x|a|b|b|['a', 'b', 'c']|True|True|a+b|2");
  EXPECT_EQ(render_text("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", {{"d", {{"a", 1}, {"b", 2}}}}),
            "a=1;b=2;");
}

TEST(Jinja, LoopsAndAssignments) {
  EXPECT_EQ(render_text("{% for m in messages %}{{ loop.index0 }}{{ loop.index }}{{ loop.first }}{{ loop.last }}"
                        "{{ loop.length }}{{ loop.revindex }};{% endfor %}",
                        kChat),
            "01TrueFalse33;12FalseFalse32;23FalseTrue31;");
  EXPECT_EQ(render_text("{% for i in range(6) if i != 2 %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 4 %}"
                        "{% break %}{% endif %}{{ i }}{% endfor %}"),
            "03");
  EXPECT_EQ(render_text("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  // A set inside a loop stays inside it; a namespace carries values out.
  EXPECT_EQ(render_text("{% set n = 0 %}{% set ns = namespace(n=0) %}{% for m in messages %}{% set n = n + 1 %}"
                        "{% set ns.n = ns.n + 1 %}{% endfor %}{{ n }} {{ ns.n }}",
                        kChat),
            "0 3");
  EXPECT_EQ(render_text("{% set x %}block {{ 1 }}{% endset %}[{{ x }}]"), "[block 1]");
  EXPECT_EQ(render_text("{% if a %}A{% elif b %}B{% else %}C{% endif %}", {{"a", false}, {"b", true}}), "B");
  EXPECT_EQ(render_text("{% generation %}kept{% endgeneration %}"), "kept");
}

// transformers renders with trim_blocks and lstrip_blocks and drops one trailing newline.
TEST(Jinja, WhitespaceControl) {
  EXPECT_EQ(render_text("{% if true %}\nA\n{% endif %}\nB\n"), "A\nB");
  EXPECT_EQ(render_text("  {% if true %}A{% endif %}  \n  {{ 'x' }}\n"), "A  \n  x");
  EXPECT_EQ(render_text("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
  EXPECT_EQ(render_text("a\n  {{- 'b' -}}  \nc"), "abc");
  EXPECT_EQ(render_text("  {%+ if true %}x{% endif %}"), "  x");
  EXPECT_EQ(render_text("{# c #}\nA"), "A");
  EXPECT_EQ(render_text("A\n\n"), "A\n");
  EXPECT_EQ(render_text("A\r\nB"), "A\nB");
  EXPECT_EQ(render_text("{% for m in messages %}\n  {{ m.role }}\n{% endfor %}\n", kChat), "  system\n  user\n  assistant\n");
}

// The Llama 3 Instruct template, worked by hand.
TEST(Jinja, Llama3Template) {
  const std::string t =
      "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
      "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 "
      "%}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
      "'<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";
  EXPECT_EQ(render_text(t, kChat),
            "<s><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi"
            "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nYo<|eot_id|><|start_header_id|>assistant"
            "<|end_header_id|>\n\n");
}

TEST(Jinja, RenderErrors) {
  EXPECT_THROW(render_text("{{ raise_exception('Conversation roles must alternate') }}"), RenderError);
  try {
    render_text("\n{{ raise_exception('roles must alternate') }}");
  } catch (const RenderError& e) {
    EXPECT_NE(std::string(e.what()).find("roles must alternate"), std::string::npos) << e.what();
  }
  EXPECT_THROW(render_text("{{ x.y }}"), RenderError);  // an attribute of an undefined value
  EXPECT_THROW(render_text("{{ 'a' + 1 }}"), RenderError);
  EXPECT_THROW(render_text("{{ 1 // 0 }}"), RenderError);
  EXPECT_THROW(render_text("{% set ns = 1 %}{% set ns.x = 2 %}"), RenderError);
  // 64-bit integers: an overflow is an error, not a wrapped value.
  EXPECT_THROW(render_text("{{ 9223372036854775807 + 1 }}"), RenderError);
  EXPECT_THROW(render_text("{{ 3 ** 64 }}"), RenderError);
  EXPECT_EQ(render_text("{{ (-1) ** 1000000000000 }} {{ range(0, 9223372036854775807, 4611686018427387904) | length }}"),
            "1 2");
}

// Bounded input: nesting past a limit and integers past 64 bits are one error when compiled.
TEST(Jinja, LimitsAreCompileErrors) {
  EXPECT_THROW(compile("{{ 99999999999999999999 }}", "t"), ConfigError);
  EXPECT_THROW(compile("{{ " + std::string(500, '(') + "1" + std::string(500, ')') + " }}", "t"), ConfigError);
  std::string deep;
  for (int k = 0; k < 300; ++k) deep += "{% if true %}";
  for (int k = 0; k < 300; ++k) deep += "{% endif %}";
  EXPECT_THROW(compile(deep, "t"), ConfigError);
  EXPECT_EQ(render_text("{{ ((((1)))) }}"), "1");
}

// What the subset does not hold is refused when compiled: one line naming the construct and the line.
TEST(Jinja, UnsupportedConstructsAreRefusedByName) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{% macro f() %}x{% endmacro %}", "{% macro %}"},
      {"x\n{% include 'other.jinja' %}", "{% include %}"},
      {"{% extends 'base' %}", "{% extends %}"},
      {"{% call f() %}{% endcall %}", "{% call %}"},
      {"{% filter upper %}x{% endfilter %}", "{% filter %}"},
      {"{% raw %}{{ x }}{% endraw %}", "{% raw %}"},
      {"{% with a = 1 %}{% endwith %}", "{% with %}"},
      {"{{ x | wordwrap(3) }}", "the filter |wordwrap"},
      {"{{ x is lower }}", "the test 'is lower'"},
      {"{{ cycler(1, 2) }}", "the function cycler()"},
      {"{{ x.format(1) }}", "the method .format()"},
      {"{% for x in y recursive %}{% endfor %}", "a recursive for loop"},
  };
  for (const auto& [tmpl, construct] : cases) {
    try {
      compile(tmpl, "tokenizer_config.json chat_template");
      ADD_FAILURE() << tmpl << ": compiled";
    } catch (const ConfigError& e) {
      const std::string w = e.what();
      EXPECT_NE(w.find(construct), std::string::npos) << tmpl << " -> " << w;
      EXPECT_NE(w.find("tokenizer_config.json chat_template: line "), std::string::npos) << w;
      EXPECT_EQ(w.find('\n'), std::string::npos) << w;
    }
  }
  EXPECT_NE(std::string([] {
              try {
                compile("a\nb\n{% macro f() %}{% endmacro %}", "t");
              } catch (const ConfigError& e) {
                return std::string(e.what());
              }
              return std::string();
            }())
                .find("line 3"),
            std::string::npos);
  // Malformed templates: a syntax error, also one line.
  for (const std::string bad : {"{% if x %}no end", "{{ 'unclosed }}", "{% endfor %}", "{{ (1 }}", "{% for %}"})
    EXPECT_THROW(compile(bad, "t"), ConfigError) << bad;
}

}  // namespace
}  // namespace zinf::jinja
