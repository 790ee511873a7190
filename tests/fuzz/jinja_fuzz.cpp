// jinja_fuzz.cpp — the chat-template renderer (io/jinja.h) on arbitrary bytes as a template: compile
// either builds it or throws one zinf error; what compiles renders a small conversation or throws one
// zinf error (a RenderError the template raised) — never a crash, a hang on nesting, or another exception.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <nlohmann/json.hpp>

#include "fuzz_common.h"
#include "io/jinja.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::shared_ptr<const zinf::jinja::Template> t;
  if (!zinf::fuzz::expect_clean("jinja::compile", [&] { t = zinf::jinja::compile(text, "fuzz template"); })) return 0;
  static const zinf::jinja::Value ctx = zinf::jinja::from_json(nlohmann::json{
      {"messages",
       {{{"role", "system"}, {"content", " Be brief.\n"}},
        {{"role", "user"}, {"content", "Hi <|eot_id|>"}},
        {{"role", "assistant"}, {"content", "\nHello."}}}},
      {"add_generation_prompt", true},
      {"bos_token", "<s>"},
      {"eos_token", "</s>"},
      {"tools", nullptr}});
  zinf::fuzz::expect_clean("jinja::render", [&] { (void)zinf::jinja::render(*t, ctx); });
  return 0;
}
