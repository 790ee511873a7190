// bpe_test.cpp — the Hugging Face tokenizer.json byte-level BPE tokenizer (io/bpe.h): merges by
// rank from small files built here (both merge formats), byte-exact round trips of any bytes,
// special tokens, BOS/EOS from a model folder, the parallel encode against the serial one, clear
// errors for files it does not read, and — when the checkers' python has Hugging Face `tokenizers` —
// the same ids as Hugging Face on texts in many scripts, for GPT-2's, Llama 3's and SmolLM's
// pre-tokenizers.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include "common/checkers.h"
#include "common/temp_dir.h"
#include "common/tokenizer_files.h"
#include "io/bpe.h"
#include "io/data.h"
#include "io/tokenizer.h"
#include "zinf/error.h"

namespace zinf {
namespace {

using json = nlohmann::json;
using test::byte_char;
using test::kLlama3Pattern;
using test::mapped;
using test::small_tokenizer;
using test::TempDir;

const std::vector<std::pair<std::string, std::string>> kMerges = {
    {"h", "e"}, {"l", "l"},     {"he", "ll"}, {"hell", "o"}, {" ", "w"}, {"o", "r"}, {" w", "or"},
    {"l", "d"}, {" wor", "ld"}, {"a", "a"},   {"aa", "aa"},  {" ", " "}, {"1", "2"}, {"\xC3", "\xA9"}};

std::unique_ptr<Tokenizer> from_json(const json& j, const std::string& name = "tokenizer.json") {
  return bpe_tokenizer_from_json(j.dump(), name, "data.tokenizer");
}

// The id of the vocabulary entry for the bytes `raw` (token_id takes the vocabulary's spelling).
std::uint32_t id_of(const Tokenizer& t, const std::string& raw) {
  const auto id = t.token_id(mapped(raw));
  EXPECT_TRUE(id) << raw;
  return id.value_or(0);
}

TEST(Bpe, MergesByRankInBothMergeFormats) {
  for (bool pairs : {false, true}) {
    const auto t = from_json(small_tokenizer(kMerges, pairs, false));
    EXPECT_EQ(t->kind(), "bpe");
    EXPECT_EQ(t->vocab_size(), 256 + 14 + 2);
    // "hello" merges all the way; " world" too; "aaaaa" takes the leftmost pairs first: aaaa + a.
    EXPECT_EQ(t->encode("hello world"), (std::vector<std::uint32_t>{id_of(*t, "hello"), id_of(*t, " world")}));
    EXPECT_EQ(t->encode("aaaaa"), (std::vector<std::uint32_t>{id_of(*t, "aaaa"), 'a'}));
    // GPT-2's split: "1234" is one piece (merged 12, then 3 and 4 as bytes); "hello" after a letter
    // stays in that piece.
    EXPECT_EQ(t->encode("1234"), (std::vector<std::uint32_t>{id_of(*t, "12"), '3', '4'}));
    EXPECT_EQ(t->encode("\xC3\xA9"), (std::vector<std::uint32_t>{id_of(*t, "\xC3\xA9")}));
    EXPECT_EQ(t->decode(t->encode("hello world")), "hello world");
  }
}

TEST(Bpe, Llama3SplitKeepsDigitsInThrees) {
  const auto t = from_json(small_tokenizer(kMerges, false, true));
  // \p{N}{1,3}: "1234567" is 123 | 456 | 7; under GPT-2's pattern it is one piece.
  EXPECT_EQ(t->encode("1234567"), (std::vector<std::uint32_t>{id_of(*t, "12"), '3', '4', '5', '6', '7'}));
  const auto g = from_json(small_tokenizer(kMerges, false, false));
  EXPECT_EQ(g->encode("1234567"), t->encode("1234567"));  // same ids here: only "12" merges
  EXPECT_EQ(t->encode("12312"), (std::vector<std::uint32_t>{id_of(*t, "12"), '3', id_of(*t, "12")}));
  EXPECT_EQ(g->encode("12312"), (std::vector<std::uint32_t>{id_of(*g, "12"), '3', id_of(*g, "12")}));
  // "a12" in GPT-2 is a|12 (letters, then digits); "1212" under Llama 3 is 121|2 -> 12 1 2.
  EXPECT_EQ(t->encode("1212"), (std::vector<std::uint32_t>{id_of(*t, "12"), '1', '2'}));
  EXPECT_EQ(g->encode("1212"), (std::vector<std::uint32_t>{id_of(*g, "12"), id_of(*g, "12")}));
}

TEST(Bpe, AnyBytesRoundTrip) {
  std::mt19937 rng(7);
  for (bool llama3 : {false, true}) {
    const auto t = from_json(small_tokenizer(kMerges, false, llama3));
    for (int rep = 0; rep < 200; ++rep) {
      std::string s(rng() % 300, '\0');
      for (auto& c : s) c = static_cast<char>(rng() % 4 == 0 ? "he lo\n\t1"[rng() % 8] : rng() % 256);
      const auto ids = t->encode(s, rep % 2 == 0);
      ASSERT_EQ(t->decode(ids), s) << "llama3=" << llama3 << " rep " << rep;
      for (auto id : ids) ASSERT_LT(id, static_cast<std::uint32_t>(t->vocab_size()));
    }
    // Invalid UTF-8 and a lone continuation byte between letters.
    for (const std::string s : {"\xFF\xFE abc",
                                "ab\x80"
                                "cd",
                                "\xE2\x82", "caf\xC3\xA9 \xC3"})
      EXPECT_EQ(t->decode(t->encode(s)), s);
  }
}

TEST(Bpe, SpecialTokensOnlyWhenAsked) {
  const auto t = from_json(small_tokenizer(kMerges, false, true));
  const std::uint32_t eot = id_of(*t, "<|eot_id|>"), plain = id_of(*t, "[plain]");
  const std::string text = "hello<|eot_id|>hello[plain]";
  const auto with = t->encode(text, true);
  EXPECT_EQ(with, (std::vector<std::uint32_t>{id_of(*t, "hello"), eot, id_of(*t, "hello"), plain}));
  const auto without = t->encode(text, false);
  EXPECT_EQ(std::count(without.begin(), without.end(), eot), 0);
  EXPECT_EQ(without.back(), plain);  // a non-special added token is always its id
  EXPECT_EQ(t->decode(with), text);
  EXPECT_EQ(t->decode(without), text);
  EXPECT_THROW(t->decode({static_cast<std::uint32_t>(t->vocab_size())}), Error);
}

// Text in many scripts with the whitespace, digits and punctuation the split patterns care about.
std::string mixed_text(std::size_t bytes) {
  const std::vector<std::string> lines = {
      "The quick brown fox doesn't jump; it's 1234567 times lazier.",
      "  indented\twith\ttabs   and  trailing spaces   ",
      "日本語のテキストと漢字、かな。中文也可以。",
      "العربية نص قصير مع أرقام ١٢٣",
      "हिन्दी में कुछ शब्द और संख्या ४५६",
      "emoji 👩‍👩‍👧‍👦 family, 🇩🇪 flag, 👍🏽 thumbs",
      "Ünïcödé façade naïve café — “quotes” and ‘single’",
      "x=1;y=22;z=333;   // code\r\n",
      "",
      "   ",
      "\t\t",
      "WE'LL SEE THEY'RE I'M YOU'VE HE'D",
  };
  std::string s;
  std::mt19937 rng(3);
  while (s.size() < bytes) {
    s += lines[rng() % lines.size()];
    s += rng() % 5 == 0 ? "\n\n" : "\n";
  }
  return s;
}

TEST(Bpe, ParallelEncodeGivesTheSerialIds) {
  const std::string text = mixed_text(3 << 20);
  for (bool llama3 : {false, true}) {
    const auto t = from_json(small_tokenizer(kMerges, false, llama3));
    const auto serial = bpe_encode_chunked(*t, text, true, 0);
    EXPECT_EQ(bpe_encode_chunked(*t, text, true, 4096), serial) << "llama3=" << llama3;
    EXPECT_EQ(t->encode(text), serial) << "llama3=" << llama3;  // default 1 MiB chunks
    EXPECT_EQ(t->decode(serial), text);
  }
}

// A pattern that joins a newline with the next letter: those cuts are refused and their chunks
// encoded again as one, still giving the serial ids.
TEST(Bpe, ParallelEncodeFallsBackWhenThePatternJoinsAcrossACut) {
  json j = small_tokenizer(kMerges, false, true);
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = R"(\n?[a-z]+|[^a-z\n]+|\n)";
  const auto t = from_json(j);
  const std::string text = mixed_text(1 << 20);
  EXPECT_EQ(bpe_encode_chunked(*t, text, false, 2048), bpe_encode_chunked(*t, text, false, 0));
}

std::string error_of(const json& j) {
  try {
    from_json(j, "/models/x/tokenizer.json");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "parsed";
}

TEST(Bpe, ClearErrors) {
  const json good = small_tokenizer(kMerges, false, false);
  json j = good;
  j.erase("model");
  EXPECT_NE(error_of(j).find("/models/x/tokenizer.json: no \"model\" object"), std::string::npos) << error_of(j);
  for (const char* type : {"WordPiece", "Unigram", "WordLevel"}) {
    j = good;
    j["model"]["type"] = type;
    EXPECT_NE(error_of(j).find(std::string("model.type ") + type + " is not supported"), std::string::npos)
        << error_of(j);
  }
  j = good;
  j["model"]["merges"][0] = "h zzz";
  EXPECT_NE(error_of(j).find("model.merges[0] (h zzz): zzz is not in model.vocab"), std::string::npos) << error_of(j);
  j = good;
  j["model"]["merges"][1] = "ll";
  EXPECT_NE(error_of(j).find("model.merges[1] \"ll\" is not two pieces"), std::string::npos) << error_of(j);
  j = good;
  j["model"]["merges"][2] = 7;
  EXPECT_NE(error_of(j).find("model.merges[2] is neither"), std::string::npos) << error_of(j);
  j = good;
  j["normalizer"] = {{"type", "Lowercase"}};
  EXPECT_NE(error_of(j).find("normalizer Lowercase is not supported"), std::string::npos) << error_of(j);
  j = good;
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  EXPECT_NE(error_of(j).find("pre_tokenizer Whitespace is not supported"), std::string::npos) << error_of(j);
  j = small_tokenizer(kMerges, false, true);
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  EXPECT_NE(error_of(j).find("the split pattern does not compile"), std::string::npos) << error_of(j);
  json dup = good;
  dup["model"]["vocab"]["j"] = dup["model"]["vocab"]["i"];
  EXPECT_NE(error_of(dup).find("model.vocab gives the id 105 to both"), std::string::npos) << error_of(dup);
  dup = good;
  dup["added_tokens"][1]["id"] = dup["added_tokens"][0]["id"];
  EXPECT_NE(error_of(dup).find("added_tokens: the id"), std::string::npos) << error_of(dup);
  dup = good;
  dup["added_tokens"][0]["id"] = 104;  // 'h'
  EXPECT_NE(error_of(dup).find("is already \"h\""), std::string::npos) << error_of(dup);
  j["model"]["vocab"]["x"] = "seven";
  EXPECT_NE(error_of(j).find("model.vocab[\"x\"] is not an id"), std::string::npos) << error_of(j);
  // A byte without its token is refused at load, not at the first text that holds it.
  j = good;
  j["model"]["vocab"].erase(byte_char(0xFF));
  EXPECT_NE(error_of(j).find("model.vocab has no token for 1 of the 256 bytes (0xFF (" + byte_char(0xFF) + "))"),
            std::string::npos)
      << error_of(j);
  // Post-processors: TemplateProcessing and ByteLevel are read, others refused, bad ids named.
  j = good;
  j["post_processor"] = {{"type", "BertProcessing"}};
  EXPECT_NE(error_of(j).find("post_processor BertProcessing is not supported"), std::string::npos) << error_of(j);
  j = good;
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", {{{"SpecialToken", {{"id", "<nope>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}}}}}},
                         {"special_tokens", json::object()}};
  EXPECT_NE(error_of(j).find("names the token <nope>"), std::string::npos) << error_of(j);
  j["post_processor"]["special_tokens"] = {{"<nope>", {{"id", "<nope>"}, {"ids", {-1}}}}};
  EXPECT_NE(error_of(j).find("an id of <nope> (-1) is not in the vocabulary"), std::string::npos) << error_of(j);
  try {
    bpe_tokenizer_from_json("{\"model\": ", "/models/x/tokenizer.json", "--tokenizer");
    ADD_FAILURE() << "parsed";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--tokenizer /models/x/tokenizer.json: not JSON"), std::string::npos)
        << e.what();
  }
}

TEST(Bpe, FolderNamesBosAndEos) {
  TempDir d("bpe-folder");
  const json j = small_tokenizer(kMerges, false, true);
  d.write("tokenizer.json", j.dump());
  const auto plain = open_tokenizer(d / "tokenizer.json");
  EXPECT_FALSE(plain->bos_id());
  EXPECT_TRUE(plain->eos_ids().empty());
  d.write("tokenizer_config.json", R"({"bos_token": {"content": "hello"}, "eos_token": "<|eot_id|>"})");
  d.write("generation_config.json", R"({"eos_token_id": [3, 4]})");
  const auto t = open_tokenizer(d.path.string());
  EXPECT_EQ(t->kind(), "bpe");
  EXPECT_EQ(t->bos_id(), t->token_id("hello"));
  EXPECT_EQ(t->eos_ids(), (std::vector<std::uint32_t>{*t->token_id("<|eot_id|>"), 3, 4}));
  d.write("tokenizer_config.json", R"({"eos_token": "<|not_there|>"})");
  EXPECT_THROW(open_tokenizer(d.path.string()), ConfigError);
}

TEST(Bpe, DataTokenizerAndZinfTokenizeReadTokenizerJson) {
  TempDir d("bpe-data");
  d.write("tokenizer.json", small_tokenizer(kMerges, false, true).dump());
  const std::string text = mixed_text(20000);
  d.write("text.txt", text);
  DataConfig cfg;
  cfg.path = d / "text.txt";
  cfg.tokenizer = d.path.string();
  cfg.val_fraction = 0.1;
  const auto t = open_tokenizer(d.path.string());
  const auto want = t->encode(text, false);
  const TokenData data = TokenData::load(cfg, 512, 16);
  ASSERT_EQ(data.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) ASSERT_EQ(data.at(i), want[i]) << i;
  EXPECT_NE(data.description().find("bpe"), std::string::npos) << data.description();

  // `zinf tokenize --tokenizer FOLDER` writes the same ids into a token file.
  const std::string cmd = std::string(ZINF_BIN) + " tokenize --tokenizer " + d.path.string() + " " + (d / "text.txt") +
                          " -o " + (d / "tokens.bin") + " > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  DataConfig tc;
  tc.path = d / "tokens.bin";
  tc.val_fraction = 0.1;
  const TokenData file = TokenData::load(tc, 512, 16);
  ASSERT_EQ(file.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) ASSERT_EQ(file.at(i), want[i]) << i;
  EXPECT_NE(file.description().find("uint16"), std::string::npos) << file.description();
}

// Hugging Face's own encode of the same texts, with tokenizers trained by scripts/make-tokenizer.py.
TEST(Bpe, SameIdsAsHuggingFace) {
  const std::string py = test::checker_python("tokenizers");
  if (py.empty()) GTEST_SKIP() << test::checker_missing("tokenizers");
  TempDir d("bpe-hf");
  std::string corpus = mixed_text(200000);
  {
    std::ifstream f(std::string(ZINF_SOURCE_DIR) + "/LICENSE");
    corpus += std::string(std::istreambuf_iterator<char>(f), {});
  }
  d.write("corpus.txt", corpus);
  std::vector<std::string> texts = {
      "Hello world",
      " leading space",
      "trailing space ",
      "multiple   spaces   here",
      "tabs\tand\nnewlines\r\n",
      "\n\n\n",
      "   \n  \t ",
      "numbers 1234567 and 3.14159 and 1,000,000",
      "don't can't won't it's I'm you're we've they'll he'd DON'T IT'S",
      "日本語のテキスト、中文字符。한국어 텍스트",
      "العربية: مرحبا بالعالم",
      "हिन्दी: नमस्ते दुनिया",
      "emoji: 👩‍👩‍👧‍👦 👍🏽 🇩🇪 ❤️",
      "e\xCC\x81 (e + combining acute) vs \xC3\xA9",
      "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>",
      "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|><|endoftext|>",
      "special <|eot_id|>inside<|eot_id|> text",
      "<|eot_id",
      "x=1;y=22;  // code\n\tif (a) { b(); }",
      "Ünïcödé façade naïve café — “quotes”",
      "a  1 b\t2\n 3x٣४  ",
      "v1.2.3-rc4 0x1F 1e-5 ½",
      ""};
  texts.push_back(mixed_text(5000));
  texts.push_back(corpus.substr(0, 20000));
  d.write("texts.json", json(texts).dump());
  const std::string encode =
      "import json, sys\n"
      "from tokenizers import Tokenizer\n"
      "t = Tokenizer.from_file(sys.argv[1])\n"
      "texts = json.load(open(sys.argv[2], encoding='utf-8'))\n"
      "print(json.dumps([t.encode(x, add_special_tokens=False).ids for x in texts]))\n";
  const std::string script = std::string(ZINF_SOURCE_DIR) + "/scripts/make-tokenizer.py";
  for (const std::vector<std::string>& style :
       {std::vector<std::string>{"--style", "gpt2"}, std::vector<std::string>{"--style", "llama3", "--nfc"},
        std::vector<std::string>{"--style", "smollm"}}) {
    const std::string dir = d / ("tok-" + style[1]);
    std::vector<std::string> args = {script, dir, "600", d / "corpus.txt"};
    args.insert(args.end(), style.begin(), style.end());
    const auto made = test::run_python(py, "", args);
    ASSERT_EQ(made.status, 0) << made.output;
    const auto hf = test::run_python(py, encode, {dir + "/tokenizer.json", d / "texts.json"});
    ASSERT_EQ(hf.status, 0) << hf.output;
    const json want = json::parse(hf.output);
    ASSERT_EQ(want.size(), texts.size());
    const auto t = open_tokenizer(dir);
    EXPECT_EQ(t->vocab_size(), 600);
    for (std::size_t i = 0; i < texts.size(); ++i) {
      const auto ids = t->encode(texts[i], true);
      EXPECT_EQ(json(ids), want[i]) << style[1] << ": " << texts[i].substr(0, 200);
      if (style.size() == 2) {  // NFC changes some texts
        EXPECT_EQ(t->decode(ids), texts[i]) << style[1];
      }
    }
    // The folder's BOS/EOS (tokenizer_config.json, generation_config.json).
    ASSERT_TRUE(t->bos_id());
    EXPECT_EQ(*t->bos_id(), *t->token_id(style[1] != "llama3" ? "<|endoftext|>" : "<|begin_of_text|>"));
    EXPECT_EQ(t->eos_ids().front(), *t->token_id(style[1] != "llama3" ? "<|endoftext|>" : "<|eot_id|>"));
  }
}

}  // namespace
}  // namespace zinf
