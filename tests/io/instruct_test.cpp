// instruct_test.cpp — chat (JSONL) fine-tuning data: both line shapes and their errors, each
// template's exact rendering, where the loss mask falls, truncation and dropping, template
// detection from a model folder, the masked cross-entropy (loss and gradient) against the same rows
// without the masked ones, and `zinf train` on a small JSONL file.
#include <gtest/gtest.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "app/config/config.h"
#include "app/train/train.h"
#include "common/temp_dir.h"
#include "cpu/ops_gpt.h"
#include "io/data.h"
#include "io/instruct.h"
#include "model/op_list.h"
#include "zinf/error.h"

namespace zinf {
namespace {

using test::TempDir;

// One token per byte (ids 0..255) and a few special tokens after them, matched in the text only
// when encode is asked to (as the real tokenizers do).
class FakeTokenizer final : public Tokenizer {
 public:
  explicit FakeTokenizer(std::vector<std::string> specials, std::optional<std::uint32_t> bos = {},
                         std::optional<std::uint32_t> eos = {})
      : specials_(std::move(specials)), bos_(bos), eos_(eos) {}
  std::string kind() const override { return "fake"; }
  std::vector<std::uint32_t> encode(std::string_view text, bool special) const override {
    std::vector<std::uint32_t> ids;
    for (std::size_t i = 0; i < text.size();) {
      bool matched = false;
      for (std::size_t s = 0; special && s < specials_.size(); ++s) {
        if (text.substr(i, specials_[s].size()) == specials_[s]) {
          ids.push_back(static_cast<std::uint32_t>(256 + s));
          i += specials_[s].size();
          matched = true;
          break;
        }
      }
      if (!matched) ids.push_back(static_cast<unsigned char>(text[i++]));
    }
    return ids;
  }
  std::string decode(const std::vector<std::uint32_t>& ids) const override {
    std::string s;
    for (std::uint32_t id : ids) s += id < 256 ? std::string(1, static_cast<char>(id)) : specials_.at(id - 256);
    return s;
  }
  int vocab_size() const override { return 256 + static_cast<int>(specials_.size()); }
  std::optional<std::uint32_t> token_id(std::string_view piece) const override {
    for (std::size_t s = 0; s < specials_.size(); ++s)
      if (specials_[s] == piece) return static_cast<std::uint32_t>(256 + s);
    return std::nullopt;
  }
  std::optional<std::uint32_t> bos_id() const override { return bos_; }
  std::vector<std::uint32_t> eos_ids() const override {
    return eos_ ? std::vector<std::uint32_t>{*eos_} : std::vector<std::uint32_t>{};
  }
  std::string description() const override { return "fake tokenizer"; }

 private:
  std::vector<std::string> specials_;
  std::optional<std::uint32_t> bos_, eos_;
};

const FakeTokenizer& llama3_tok() {
  static const FakeTokenizer t({"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"});
  return t;
}
const FakeTokenizer& chatml_tok() {
  static const FakeTokenizer t({"<|im_start|>", "<|im_end|>"});
  return t;
}

std::string parse_error(const std::string& text) {
  try {
    parse_chat_jsonl(text, "chat.jsonl");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "parsed";
}

// The text of the example's target tokens, in order.
std::string target_text(const TokenizedExample& te, const Tokenizer& tok) {
  std::vector<std::uint32_t> ids;
  for (std::size_t i = 0; i < te.ids.size(); ++i)
    if (te.target[i]) ids.push_back(te.ids[i]);
  return tok.decode(ids);
}

const ChatExample kExample = {{"system", "Be brief."}, {"user", "Hi?"}, {"assistant", "Hello."}};

TEST(ChatJsonl, BothShapesParse) {
  const auto ex = parse_chat_jsonl(
      "{\"prompt\": \"2+2?\", \"completion\": \"4\"}\n"
      "\n"
      "{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", \"content\": \"u\"},"
      " {\"role\": \"assistant\", \"content\": \"a\"}]}\r\n",
      "chat.jsonl");
  ASSERT_EQ(ex.size(), 2u);
  ASSERT_EQ(ex[0].size(), 2u);
  EXPECT_EQ(ex[0][0].role, "user");
  EXPECT_EQ(ex[0][0].content, "2+2?");
  EXPECT_EQ(ex[0][1].role, "assistant");
  EXPECT_EQ(ex[0][1].content, "4");
  ASSERT_EQ(ex[1].size(), 3u);
  EXPECT_EQ(ex[1][0].role, "system");
  EXPECT_EQ(ex[1][2].content, "a");
}

TEST(ChatJsonl, BadLinesAreOneErrorNamingTheLine) {
  const std::string good = "{\"prompt\": \"p\", \"completion\": \"c\"}\n\n";  // lines 1 and 2 (blank)
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"prompt\": \"p\", ", "not JSON"},
      {"[1, 2]", "must be a JSON object"},
      {"{\"prompt\": \"p\"}", "no \"completion\" field"},
      {"{\"completion\": 3, \"prompt\": \"p\"}", "\"completion\" must be a string"},
      {"{\"text\": \"x\"}", "no \"messages\" and no \"prompt\""},
      {"{\"messages\": []}", "\"messages\" is empty"},
      {"{\"messages\": {}}", "\"messages\" must be an array"},
      {"{\"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}", "message 1: role \"robot\" is not one of"},
      {"{\"messages\": [{\"role\": \"user\"}]}", "message 1: no \"content\" field"},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", "no assistant message"},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"prompt\": \"p\"}", "not both"},
      {"{\"prompt\": \"p\", \"completion\": \"c\", \"prompt\": \"q\"}",
       "prompt: the key appears twice in one object; keep one"},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\", \"role\": \"assistant\"}]}",
       "messages[].role: the key appears twice in one object"},
  };
  for (const auto& [line, why] : cases) {
    const std::string e = parse_error(good + line + "\n" + good);
    EXPECT_NE(e.find("chat.jsonl line 3"), std::string::npos) << line << " -> " << e;
    EXPECT_NE(e.find(why), std::string::npos) << line << " -> " << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
}

ChatFormat fmt(ChatTemplate t, const Tokenizer& tok) { return chat_format(t, "", tok, "data.chat_template"); }

TokenizedExample chat(const ChatExample& ex, ChatTemplate t, const Tokenizer& tok) {
  return tokenize_chat(ex, fmt(t, tok), tok);
}

TEST(ChatTemplates, Llama3RendersExactlyAndTrainsOnTheAssistantTurnWithItsEot) {
  const TokenizedExample te = chat(kExample, ChatTemplate::llama3, llama3_tok());
  EXPECT_EQ(llama3_tok().decode(te.ids),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>");
  EXPECT_EQ(target_text(te, llama3_tok()), "Hello.<|eot_id|>");
  EXPECT_EQ(te.ids.front(), *llama3_tok().token_id("<|begin_of_text|>"));
  EXPECT_EQ(te.ids.back(), *llama3_tok().token_id("<|eot_id|>"));
  EXPECT_TRUE(te.target.back());
}

// Llama 3's template trims each message: an answer ending in a newline is trained without it.
TEST(ChatTemplates, Llama3TrimsEachMessage) {
  const ChatExample ex = {{"user", "\n Hi? "}, {"assistant", "Hello.\n"}};
  const TokenizedExample te = chat(ex, ChatTemplate::llama3, llama3_tok());
  EXPECT_EQ(llama3_tok().decode(te.ids),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>");
  EXPECT_EQ(target_text(te, llama3_tok()), "Hello.<|eot_id|>");
}

TEST(ChatTemplates, ChatmlRendersExactlyAndTrainsOnTheAssistantTurnWithItsEnd) {
  const TokenizedExample te = chat(kExample, ChatTemplate::chatml, chatml_tok());
  EXPECT_EQ(chatml_tok().decode(te.ids),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi?<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n");
  EXPECT_EQ(target_text(te, chatml_tok()), "Hello.<|im_end|>");
  EXPECT_FALSE(te.target.back());  // the newline after <|im_end|> belongs to no turn
}

// A conversation opened by the assistant: Llama 3's generation prompt for no messages lacks the BOS
// the full rendering starts with, so the turn's start is found from the rendering itself.
TEST(ChatTemplates, AnAssistantFirstConversationTrainsItsTurns) {
  const ChatExample ex = {{"assistant", "Hello."}, {"user", "Hi?"}, {"assistant", "Bye."}};
  const TokenizedExample te = chat(ex, ChatTemplate::llama3, llama3_tok());
  EXPECT_EQ(target_text(te, llama3_tok()), "Hello.<|eot_id|>Bye.<|eot_id|>");
}

// Qwen2's template adds its default system turn when the conversation has none; ChatML does not.
TEST(ChatTemplates, Qwen2AddsItsDefaultSystemTurn) {
  const ChatExample ex = {{"user", "Hi?"}, {"assistant", "Hello."}, {"user", "And?"}, {"assistant", "Bye."}};
  const TokenizedExample q = chat(ex, ChatTemplate::qwen2, chatml_tok());
  EXPECT_EQ(chatml_tok().decode(q.ids),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi?<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nAnd?<|im_end|>\n"
            "<|im_start|>assistant\nBye.<|im_end|>\n");
  EXPECT_EQ(target_text(q, chatml_tok()), "Hello.<|im_end|>Bye.<|im_end|>");
  const TokenizedExample with_system = chat(kExample, ChatTemplate::qwen2, chatml_tok());
  EXPECT_EQ(chatml_tok().decode(with_system.ids), chatml_tok().decode(chat(kExample, ChatTemplate::chatml, chatml_tok()).ids));
}

// The generation prompt is the conversation so far, then the assistant's header and nothing after
// it: what the model continues when it answers.
TEST(ChatTemplates, GenerationPromptEndsWithTheAssistantsHeader) {
  const ChatExample ex = {{"system", "Be brief."}, {"user", "Hi?"}};
  const std::vector<std::uint32_t> l = chat_prompt_ids(ex, fmt(ChatTemplate::llama3, llama3_tok()), llama3_tok());
  EXPECT_EQ(llama3_tok().decode(l),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  const std::vector<std::uint32_t> c = chat_prompt_ids(ex, fmt(ChatTemplate::chatml, chatml_tok()), chatml_tok());
  EXPECT_EQ(chatml_tok().decode(c),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi?<|im_end|>\n<|im_start|>assistant\n");
  // The training rendering of the same turns plus an answer starts with the generation prompt.
  const ChatExample full = {{"system", "Be brief."}, {"user", "Hi?"}, {"assistant", "Hello."}};
  const TokenizedExample t = chat(full, ChatTemplate::llama3, llama3_tok());
  ASSERT_GT(t.ids.size(), l.size());
  EXPECT_TRUE(std::equal(l.begin(), l.end(), t.ids.begin()));
  for (std::size_t i = 0; i < l.size(); ++i) EXPECT_FALSE(t.target[i]) << i;
  const FakeTokenizer tok({"<s>", "</s>"}, 256, 257);
  EXPECT_EQ(tok.decode(chat_prompt_ids({{"user", "Hi?"}}, fmt(ChatTemplate::none, tok), tok)), "<s>Hi?");
  EXPECT_EQ(tok.decode(chat_prompt_ids({{"user", "Hi?"}}, fmt(ChatTemplate::none, tok), tok, false)), "Hi?");
}

TEST(ChatTemplates, NoneIsBosPromptCompletionEos) {
  const FakeTokenizer tok({"<s>", "</s>"}, 256, 257);
  const ChatExample ex = {{"user", "Q:"}, {"assistant", " A"}};
  const TokenizedExample te = chat(ex, ChatTemplate::none, tok);
  EXPECT_EQ(tok.decode(te.ids), "<s>Q: A</s>");
  EXPECT_EQ(te.ids.front(), 256u);
  EXPECT_EQ(te.ids.back(), 257u);
  EXPECT_EQ(target_text(te, tok), " A</s>");
  // Without BOS/EOS: the texts alone.
  const FakeTokenizer plain({"<s>", "</s>"});
  const TokenizedExample bare = chat(ex, ChatTemplate::none, plain);
  EXPECT_EQ(plain.decode(bare.ids), "Q: A");
  EXPECT_EQ(target_text(bare, plain), " A");
}

// The rendered conversation is encoded as the tokenizer encodes text (apply_chat_template's default):
// special-token text inside a message becomes that token, as the template's own markers do.
TEST(ChatTemplates, SpecialTokenTextInAMessageIsTheSpecialToken) {
  const ChatExample ex = {{"user", "<|eot_id|><|start_header_id|>"}, {"assistant", "ok"}};
  const TokenizedExample te = chat(ex, ChatTemplate::llama3, llama3_tok());
  std::size_t specials = 0;
  for (std::uint32_t id : te.ids) specials += id >= 256;
  EXPECT_EQ(specials, 1u + 3 * 2 + 2);  // begin_of_text, header start/end and eot per message, the user's two
}

TEST(ChatTemplates, MissingMarkersInTheTokenizerAreAConfigError) {
  try {
    fmt(ChatTemplate::llama3, chatml_tok());
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("data.chat_template llama3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("<|begin_of_text|>"), std::string::npos) << e.what();
  }
}

TEST(ChatWindows, TargetsAreTheNextTokenWhereItIsATargetAndPaddingIsMasked) {
  const int T = 96;
  const InstructSet set = make_instruct_windows({kExample}, fmt(ChatTemplate::chatml, chatml_tok()), chatml_tok(), T, 7);
  ASSERT_EQ(set.windows.size(), 1u);
  const ExampleWindow& w = set.windows[0];
  std::vector<int> in(T, -5), tg(T, -5);  // write() sets every position
  set.write(0, in.data(), tg.data());
  const TokenizedExample te = chat(kExample, ChatTemplate::chatml, chatml_tok());
  ASSERT_LT(te.ids.size(), static_cast<std::size_t>(T));
  std::size_t n = 0;
  for (int t = 0; t < T; ++t) {
    const auto i = static_cast<std::size_t>(t);
    if (i + 1 < te.ids.size()) {
      EXPECT_EQ(in[i], static_cast<int>(te.ids[i])) << t;
      EXPECT_EQ(tg[i], te.target[i + 1] ? static_cast<int>(te.ids[i + 1]) : kIgnoreTarget) << t;
    } else {
      EXPECT_EQ(in[i], 7) << t;  // the pad id
      EXPECT_EQ(tg[i], kIgnoreTarget) << t;
    }
    n += tg[i] != kIgnoreTarget;
  }
  EXPECT_EQ(n, std::string("Hello.").size() + 1);
  EXPECT_EQ(w.target_count, n);
  EXPECT_EQ(w.inputs.size(), te.ids.size() - 1);  // only the example's own positions are held
  EXPECT_EQ(set.truncated, 0u);
  EXPECT_EQ(set.dropped, 0u);
}

TEST(ChatWindows, LongExamplesAreCutAndExamplesWithoutTargetsDropped) {
  const ChatExample long_answer = {{"user", "q"}, {"assistant", std::string(200, 'x')}};
  const ChatExample long_prompt = {{"user", std::string(200, 'y')}, {"assistant", "z"}};
  const ChatExample short_one = {{"user", "q"}, {"assistant", "a"}};
  const int T = 64;
  const InstructSet set = make_instruct_windows({long_answer, long_prompt, short_one},
                                                fmt(ChatTemplate::chatml, chatml_tok()), chatml_tok(), T, 0);
  EXPECT_EQ(set.examples, 3u);
  EXPECT_EQ(set.truncated, 2u);
  EXPECT_EQ(set.dropped, 1u);  // the long prompt leaves no room for its answer
  ASSERT_EQ(set.windows.size(), 2u);
  EXPECT_EQ(set.windows[0].inputs.size(), static_cast<std::size_t>(T));  // cut to the window
  EXPECT_EQ(set.windows[0].targets.size(), static_cast<std::size_t>(T));
  EXPECT_LT(set.windows[1].inputs.size(), static_cast<std::size_t>(T));
  // The cut example keeps T positions, the last predicting an 'x' of the answer.
  EXPECT_EQ(set.windows[0].targets[T - 1], 'x');
  const std::size_t header = chatml_tok().encode("<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n", true).size();
  EXPECT_EQ(set.windows[0].target_count, T + 1 - header);
}

TEST(ChatTemplates, AutoReadsTheModelFolder) {
  TempDir t("instruct-auto");
  namespace fs = std::filesystem;
  auto folder = [&](const std::string& name, const std::string& tc, const std::string& cfg) {
    fs::create_directories(t / name);
    if (!tc.empty()) t.write(name + "/tokenizer_config.json", tc);
    if (!cfg.empty()) t.write(name + "/config.json", cfg);
    return t / name;
  };
  const std::string l3 = folder("l3", R"({"chat_template": "{{ '<|start_header_id|>' + role }}"})", "");
  const std::string qw = folder("qw", R"({"chat_template": [{"name": "default", "template": "<|im_start|>"}]})", "");
  const std::string qw_cfg = folder("qwcfg", "{}", R"({"model_type": "qwen2"})");
  const std::string l2 = folder("l2", R"({"bos_token": "<s>"})", R"({"model_type": "llama"})");
  const std::string jinja_file = folder("jf", R"({"chat_template": "ignored"})", "");
  t.write("jf/chat_template.jinja", "{% for m in messages %}[{{ m.content }}]{% endfor %}\n");
  const std::string bad = folder("bad", "{", "");
  EXPECT_EQ(detect_chat_template(l3), ChatTemplate::model);
  EXPECT_EQ(detect_chat_template(t / "l3/tokenizer.json"), ChatTemplate::model);  // a file: its folder
  EXPECT_EQ(detect_chat_template(qw), ChatTemplate::model);
  EXPECT_EQ(folder_chat_template(qw, "x"), std::optional<std::string>("<|im_start|>"));
  EXPECT_EQ(detect_chat_template(qw_cfg), ChatTemplate::qwen2);
  std::string why;
  EXPECT_EQ(detect_chat_template(l2, &why), ChatTemplate::none);
  EXPECT_FALSE(why.empty());
  EXPECT_THROW(detect_chat_template(bad), ConfigError);
  // chat_template.jinja comes before tokenizer_config.json's (transformers 5 saves it so).
  std::string source;
  EXPECT_EQ(folder_chat_template(jinja_file, "x", &source),
            std::optional<std::string>("{% for m in messages %}[{{ m.content }}]{% endfor %}\n"));
  EXPECT_NE(source.find("chat_template.jinja"), std::string::npos) << source;
  const FakeTokenizer tok({"<s>"});
  const ChatFormat f = chat_format(ChatTemplate::automatic, jinja_file, tok, "data.chat_template");
  EXPECT_EQ(f.kind, ChatTemplate::model);
  const RenderedChat r = render_chat({{"user", "a"}, {"assistant", "b"}}, f, false);
  EXPECT_EQ(r.text, "[a][b]");
  ASSERT_EQ(r.spans.size(), 1u);
  EXPECT_EQ(r.spans[0], std::make_pair(std::size_t{3}, std::size_t{6}));
}

// A folder template outside the subset, or one that renders earlier turns differently once later
// ones follow, is one ConfigError naming the cause.
TEST(ChatTemplates, FolderTemplatesTheRendererCannotUseAreRefused) {
  TempDir t("instruct-refuse");
  const FakeTokenizer tok({"<s>"});
  for (const char* d : {"m", "p", "r", "none-here"}) std::filesystem::create_directories(t / d);
  t.write("m/tokenizer_config.json", R"({"chat_template": "{% for m in messages %}\n{% macro f() %}{% endmacro %}{% endfor %}"})");
  try {
    chat_format(ChatTemplate::model, t / "m", tok, "data.chat_template");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("line 2"), std::string::npos) << w;
    EXPECT_NE(w.find("{% macro %}"), std::string::npos) << w;
    EXPECT_EQ(w.find('\n'), std::string::npos) << w;
  }
  // The last message rendered apart from the others: prefixes do not agree.
  t.write("p/tokenizer_config.json",
          R"({"chat_template": "{% for m in messages %}{% if loop.last %}LAST:{% endif %}{{ m.content }};{% endfor %}"})");
  const ChatFormat f = chat_format(ChatTemplate::model, t / "p", tok, "data.chat_template");
  try {
    tokenize_chat({{"user", "a"}, {"assistant", "b"}, {"user", "c"}}, f, tok, "example 3");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("example 3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("message 2"), std::string::npos) << e.what();
  }
  // raise_exception: the template's message, naming the example.
  t.write("r/tokenizer_config.json", R"({"chat_template": "{{ raise_exception('roles must alternate') }}"})");
  try {
    tokenize_chat({{"user", "a"}, {"assistant", "b"}}, chat_format(ChatTemplate::model, t / "r", tok, "x"), tok, "example 1");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("example 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("roles must alternate"), std::string::npos) << e.what();
  }
  EXPECT_THROW(chat_format(ChatTemplate::model, t / "none-here", tok, "x"), ConfigError);
}

// The masked cross-entropy against the same rows without the masked ones: equal losses (masked rows
// 0), zero gradient rows where masked, and the same weight gradient.
TEST(MaskedLoss, EqualsTheLossOfTheUnmaskedRowsAloneAndMaskedRowsHaveNoGradient) {
  const int R = 7, C = 8, V = 20;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0, 1);
  std::vector<float> x(static_cast<std::size_t>(R) * C), wte(static_cast<std::size_t>(V) * C);
  for (float& v : x) v = nd(rng);
  for (float& v : wte) v = nd(rng);
  const std::vector<int> targets = {3, kIgnoreTarget, 5, kIgnoreTarget, kIgnoreTarget, 19, 0};
  std::vector<int> keep;
  for (int r = 0; r < R; ++r)
    if (targets[static_cast<std::size_t>(r)] != kIgnoreTarget) keep.push_back(r);
  const int K = static_cast<int>(keep.size());
  std::vector<float> xk, rowk;
  std::vector<int> tk;
  for (int r : keep) {
    xk.insert(xk.end(), x.begin() + r * C, x.begin() + (r + 1) * C);
    tk.push_back(targets[static_cast<std::size_t>(r)]);
  }
  ops::ChunkPool pool(1);
  const float dscale = 1.0f / static_cast<float>(K);  // the mean over unmasked rows
  std::vector<float> probs(static_cast<std::size_t>(R) * V), losses(R), dx(static_cast<std::size_t>(R) * C),
      dwte(wte.size(), 0.0f), dl(static_cast<std::size_t>(R) * V, 1.0f);
  ops::lm_head_forward(pool, probs.data(), losses.data(), x.data(), wte.data(), targets.data(), R, C, V);
  ops::lm_head_backward(pool, dx.data(), dwte.data(), dl.data(), probs.data(), x.data(), wte.data(), targets.data(),
                        dscale, R, C, V);
  std::vector<float> probs_k(static_cast<std::size_t>(K) * V), losses_k(K), dx_k(static_cast<std::size_t>(K) * C),
      dwte_k(wte.size(), 0.0f), dl_k(static_cast<std::size_t>(K) * V);
  ops::lm_head_forward(pool, probs_k.data(), losses_k.data(), xk.data(), wte.data(), tk.data(), K, C, V);
  ops::lm_head_backward(pool, dx_k.data(), dwte_k.data(), dl_k.data(), probs_k.data(), xk.data(), wte.data(), tk.data(),
                        dscale, K, C, V);
  double sum = 0, sum_k = 0;
  for (int r = 0; r < R; ++r) sum += losses[static_cast<std::size_t>(r)];
  for (int k = 0; k < K; ++k) sum_k += losses_k[static_cast<std::size_t>(k)];
  EXPECT_NEAR(sum / K, sum_k / K, 1e-6) << "mean over unmasked rows";
  EXPECT_GT(sum_k, 0.0);
  for (int k = 0; k < K; ++k)
    EXPECT_NEAR(losses[static_cast<std::size_t>(keep[static_cast<std::size_t>(k)])],
                losses_k[static_cast<std::size_t>(k)], 1e-6);
  int next = 0;
  for (int r = 0; r < R; ++r) {
    const bool masked = targets[static_cast<std::size_t>(r)] == kIgnoreTarget;
    if (masked) {
      EXPECT_EQ(losses[static_cast<std::size_t>(r)], 0.0f) << r;
      for (int v = 0; v < V; ++v) EXPECT_EQ(dl[static_cast<std::size_t>(r) * V + v], 0.0f) << r << "," << v;
      for (int c = 0; c < C; ++c) EXPECT_EQ(dx[static_cast<std::size_t>(r) * C + c], 0.0f) << r << "," << c;
    } else {
      for (int c = 0; c < C; ++c)
        EXPECT_NEAR(dx[static_cast<std::size_t>(r) * C + c], dx_k[static_cast<std::size_t>(next) * C + c], 1e-6);
      ++next;
    }
  }
  double max_abs = 0;
  for (std::size_t i = 0; i < dwte.size(); ++i) max_abs = std::max(max_abs, std::fabs(double(dwte[i]) - dwte_k[i]));
  EXPECT_LT(max_abs, 1e-6) << "dwte: max abs difference";
  double norm = 0;
  for (float g : dwte_k) norm += std::fabs(g);
  EXPECT_GT(norm, 0.0);
}

std::string config_error(const std::string& data) {
  try {
    parse_config(
        R"({"train_micro_batch_size_per_gpu": 1, "model": {"n_layer": 1, "n_head": 2, "d_model": 32, "vocab_size": 300, "seq_len": 32},
                     "data": )" +
        data + "}");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "accepted";
}

TEST(ChatConfig, KeysAreReadAndBadValuesAreOneErrorNamingTheKey) {
  const Config c = parse_config(
      R"({"train_micro_batch_size_per_gpu": 1, "data": {"path": "x.jsonl", "tokenizer": "m", "chat_template": "chatml"}})");
  EXPECT_TRUE(is_chat_data(c.data));
  EXPECT_EQ(c.data.chat_template, ChatTemplate::chatml);
  const Config f = parse_config(
      R"({"train_micro_batch_size_per_gpu": 1, "data": {"path": "x.txt", "format": "jsonl", "tokenizer": "m"}})");
  EXPECT_TRUE(is_chat_data(f.data));
  EXPECT_EQ(f.data.chat_template, ChatTemplate::automatic);
  EXPECT_NE(config_error(R"({"path": "x.jsonl", "tokenizer": "m", "chat_template": "llama2"})")
                .find("data.chat_template: 'llama2' is not one of auto, llama3, chatml, qwen2, model, none"),
            std::string::npos);
  EXPECT_NE(config_error(R"({"path": "x.jsonl"})").find("data.tokenizer:"), std::string::npos);
  EXPECT_NE(config_error(R"({"format": "jsonl", "tokenizer": "m"})").find("data.format:"), std::string::npos);
  EXPECT_NE(config_error(R"({"path": "x.txt", "chat_template": "none"})").find("data.chat_template:"),
            std::string::npos);
}

// A SentencePiece model trained here on Debian's licence texts (BOS 1, EOS 2): the template `none`.
bool train_sentencepiece(const TempDir& t) {
  std::string text;
  for (const char* f : {"/usr/share/common-licenses/Apache-2.0", "/usr/share/common-licenses/GPL-3"}) {
    std::ifstream in(f);
    text.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  if (text.size() < 20000) return false;
  t.write("corpus.txt", text);
  const auto st = sentencepiece::SentencePieceTrainer::Train(
      "--input=" + (t / "corpus.txt") + " --model_prefix=" + (t / "sp") +
      " --vocab_size=300 --model_type=bpe --character_coverage=1.0 --minloglevel=2");
  return st.ok();
}

std::string chat_lines(int n) {
  std::string s;
  const char* names[] = {"alpha", "beta", "gamma", "delta", "epsilon"};
  for (int i = 0; i < n; ++i) {
    const std::string name = names[i % 5];
    s += "{\"messages\": [{\"role\": \"user\", \"content\": \"Spell " + name + " backwards? (" + std::to_string(i) +
         ")\"}, {\"role\": \"assistant\", \"content\": \"" + std::string(name.rbegin(), name.rend()) + "\"}]}\n";
  }
  return s;
}

// 20 chat examples in t/chat.jsonl with the SentencePiece model train_sentencepiece made in t.
DataConfig chat_data(TempDir& t) {
  t.write("chat.jsonl", chat_lines(20));
  DataConfig cfg;
  cfg.path = t / "chat.jsonl";
  cfg.tokenizer = t / "sp.model";
  return cfg;
}

// Every example dropped because its prompt fills the sequence: the error says so and points at
// model.seq_len, not at "more examples" (more of the same would be dropped too).
TEST(ChatData, ExamplesDroppedByALongPromptPointAtTheSequenceLength) {
  TempDir t("instruct-dropped");
  if (!train_sentencepiece(t)) GTEST_SKIP() << "Debian's licence texts are missing (base-files)";
  const DataConfig cfg = chat_data(t);
  try {
    TokenData::load(cfg, 300, 2);
    FAIL() << "loaded";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("(20 of 20 dropped: the prompt fills model.seq_len 2"), std::string::npos)
        << e.what();
    EXPECT_NE(e.hint().find("raise model.seq_len"), std::string::npos) << e.hint();
  }
}

TEST(ChatData, LoadsWholeExamplesIntoTrainAndValidationSplits) {
  TempDir t("instruct-load");
  if (!train_sentencepiece(t)) GTEST_SKIP() << "Debian's licence texts are missing (base-files)";
  DataConfig cfg = chat_data(t);
  cfg.val_fraction = 0.2;
  const TokenData d = TokenData::load(cfg, 300, 32);
  EXPECT_TRUE(d.masked());
  EXPECT_NE(d.description().find("16 train / 4 val examples"), std::string::npos) << d.description();
  EXPECT_NE(d.description().find("template none"), std::string::npos) << d.description();
  ASSERT_GE(d.notes().size(), 2u);
  EXPECT_EQ(d.notes()[1], "0 of 20 examples truncated to seq_len");
  const int B = 3, T = 32;
  std::vector<int> in(B * T), tg(B * T);
  std::mt19937_64 rng(5);
  const std::size_t want = d.train_targets(rng, B, T);
  d.sample_train(rng, B, T, in.data(), tg.data());
  std::size_t got = 0;
  for (int i = 0; i < B * T; ++i) {
    got += tg[static_cast<std::size_t>(i)] != kIgnoreTarget;
    EXPECT_GE(in[static_cast<std::size_t>(i)], 0);
    EXPECT_LT(in[static_cast<std::size_t>(i)], 300);
  }
  EXPECT_EQ(got, want);
  d.val_batch(0, 2, B, T, in.data(), tg.data());
  got = 0;
  for (int v : tg) got += v != kIgnoreTarget;
  EXPECT_EQ(got, d.val_targets(0, 2, B, T));
  // Without a tokenizer, and with a marker the tokenizer lacks: one ConfigError each.
  DataConfig none = cfg;
  none.tokenizer.clear();
  EXPECT_THROW(TokenData::load(none, 300, 32), ConfigError);
  DataConfig l3 = cfg;
  l3.chat_template = ChatTemplate::llama3;
  EXPECT_THROW(TokenData::load(l3, 300, 32), ConfigError);
}

// The step's loss and gradient are means over the step's unmasked targets, however the rows are
// split into micro batches: 2 accumulated micro batches of 2 rows train as 1 of 4 (the same rows, drawn
// in the same order), though their micro batches hold different numbers of targets.
TEST(ChatData, TheStepMeanIsOverUnmaskedTargetsAcrossMicroBatches) {
  TempDir t("instruct-accum");
  if (!train_sentencepiece(t)) GTEST_SKIP() << "Debian's licence texts are missing (base-files)";
  t.write("chat.jsonl", chat_lines(30));
  auto run = [&](int micro, int accum, int steps) {
    const Config c = parse_config(
        R"({"model": {"n_layer": 1, "n_head": 2, "d_model": 32, "vocab_size": 300, "seq_len": 32},
            "data": {"path": ")" +
        (t / "chat.jsonl") + R"(", "tokenizer": ")" + (t / "sp.model") + R"("},
            "train": {"steps": )" +
        std::to_string(steps) + R"(, "eval_interval": 0, "eval_batches": 1},
            "device": {"type": "cpu", "memory_budget": "256MiB", "threads": 1},
            "train_micro_batch_size_per_gpu": )" +
        std::to_string(micro) + R"(, "gradient_accumulation_steps": )" + std::to_string(accum) + "}");
    return train(c, TrainHooks{});
  };
  const TrainResult one = run(4, 1, 1), two = run(2, 2, 1);
  EXPECT_NEAR(two.loss, one.loss, 1e-6 * one.loss) << "the first step's loss";
  // A fresh model predicts about uniformly: ln V per unmasked target. (Counting the masked positions,
  // most of each window, would give a fraction of that.)
  EXPECT_NEAR(one.loss, std::log(300.0), 0.3);
  const TrainResult one3 = run(4, 1, 3), two3 = run(2, 2, 3);
  EXPECT_NEAR(two3.loss, one3.loss, 1e-4 * one3.loss) << "after two updates";
  EXPECT_NE(one3.loss, one.loss);
}

TEST(ChatData, ZinfTrainFineTunesOnAJsonlFile) {
  TempDir t("instruct-train");
  if (!train_sentencepiece(t)) GTEST_SKIP() << "Debian's licence texts are missing (base-files)";
  t.write("chat.jsonl", chat_lines(40));
  const std::string cmd =
      std::string(ZINF_BIN) + " train --config " + ZINF_SOURCE_DIR + "/configs/tiny.json" +
      " --set model.vocab_size=300 --set model.seq_len=32 --set model.n_layer=2 --set model.d_model=64" +
      " --set train_micro_batch_size_per_gpu=8 --set data.path=" + (t / "chat.jsonl") +
      " --set data.tokenizer=" + (t / "sp.model") +
      " --set train.steps=30 --set train.eval_interval=0 --set train.eval_batches=2 --set device.threads=1 > " +
      (t / "out.txt") + " 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream f(t / "out.txt");
  const std::string out((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("data: 0 of 40 examples truncated to seq_len"), std::string::npos) << out;
  EXPECT_NE(out.find("target tokens"), std::string::npos) << out;
  // The first and the last validation losses: the run learned the answers.
  const auto first = out.find("val_loss "), last = out.rfind("val_loss ");
  ASSERT_NE(first, std::string::npos) << out;
  ASSERT_NE(first, last) << out;
  const double v0 = std::stod(out.substr(first + 9)), v1 = std::stod(out.substr(last + 9));
  EXPECT_TRUE(std::isfinite(v1)) << out;
  EXPECT_LT(v1, v0) << out;
}

}  // namespace
}  // namespace zinf
