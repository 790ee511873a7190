// instruct_fuzz.cpp — chat JSONL (io/instruct.h) on arbitrary bytes: parse_chat_jsonl either takes
// every line or throws one zinf error; what it takes renders under every built-in template and tokenizes
// (bytes, so the rendering can be read back exactly), and becomes windows that keep their contract:
// seq_len inputs and targets, targets inside the vocabulary or masked, at least one target each.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_common.h"
#include "io/instruct.h"
#include "model/op_list.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  constexpr int kSeq = 16;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<zinf::ChatExample> examples;
  if (!zinf::fuzz::expect_clean("parse_chat_jsonl", [&] { examples = zinf::parse_chat_jsonl(text, "fuzz.jsonl"); }))
    return 0;
  static const std::unique_ptr<zinf::Tokenizer> bytes = zinf::byte_tokenizer();
  // The built-in templates, compiled as chat_format compiles them (the byte tokenizer has no markers
  // to check): each rendering reads back through the byte tokenizer, and its assistant spans lie in
  // order inside the text.
  static const std::vector<zinf::ChatFormat> formats = [] {
    std::vector<zinf::ChatFormat> f;
    for (zinf::ChatTemplate t : {zinf::ChatTemplate::llama3, zinf::ChatTemplate::chatml, zinf::ChatTemplate::qwen2}) {
      zinf::ChatFormat c;
      c.kind = t;
      c.reason = zinf::chat_template_name(t);
      c.tmpl = zinf::jinja::compile(zinf::builtin_chat_template(t), c.reason);
      c.specials.set("bos_token", zinf::jinja::Value::str("<|begin_of_text|>"));
      f.push_back(std::move(c));
    }
    return f;
  }();
  for (const zinf::ChatExample& ex : examples) {
    if (ex.empty()) zinf::fuzz::violated("an example without messages was accepted");
    for (const zinf::ChatFormat& f : formats) {
      zinf::RenderedChat r;
      if (!zinf::fuzz::expect_clean("render_chat", [&] { r = zinf::render_chat(ex, f, false); })) continue;
      std::size_t at = 0;
      for (const auto& [b, e] : r.spans) {
        if (b < at || e < b || e > r.text.size()) zinf::fuzz::violated("assistant spans out of order or outside the text");
        at = e;
      }
      const zinf::TokenizedExample te = zinf::tokenize_chat(ex, f, *bytes);
      if (te.ids.size() != te.target.size()) zinf::fuzz::violated("ids and target flags differ in length");
      if (bytes->decode(te.ids) != r.text) zinf::fuzz::violated("the rendering does not read back");
    }
  }
  zinf::InstructSet set;
  if (!zinf::fuzz::expect_clean("make_instruct_windows", [&] {
        set = zinf::make_instruct_windows(examples, zinf::chat_format(zinf::ChatTemplate::none, "", *bytes, "fuzz"),
                                          *bytes, kSeq, 0);
      }))
    return 0;
  if (set.windows.size() + set.dropped != examples.size() || set.truncated > examples.size())
    zinf::fuzz::violated("the examples, windows and drops do not add up");
  std::vector<int> in(kSeq), tg(kSeq);
  for (std::size_t i = 0; i < set.windows.size(); ++i) {
    const zinf::ExampleWindow& w = set.windows[i];
    if (w.inputs.size() > kSeq || w.targets.size() != w.inputs.size())
      zinf::fuzz::violated("a window is longer than seq_len or its targets differ in length");
    set.write(i, in.data(), tg.data());
    std::size_t n = 0;
    for (int v : tg) {
      if (v != zinf::kIgnoreTarget && (v < 0 || v >= bytes->vocab_size()))
        zinf::fuzz::violated("a target outside the vocabulary");
      n += v != zinf::kIgnoreTarget;
    }
    if (n == 0 || n != w.target_count) zinf::fuzz::violated("a window's target count is wrong");
  }
  return 0;
}
