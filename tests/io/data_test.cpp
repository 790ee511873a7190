// data_test.cpp — training data: llm.c token files in both widths (uint16, and uint32 for
// vocabularies over 65,535), memory-mapped; text tokenized at load by a SentencePiece model (trained
// here, on Debian's licence texts, with the library's own trainer); `zinf tokenize` writing the same
// tokens; and a few training steps on them.
#include <gtest/gtest.h>
#include <sentencepiece_trainer.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "app/config/config.h"
#include "app/train/train.h"
#include "common/temp_dir.h"
#include "io/data.h"
#include "zinf/error.h"

namespace zinf {
namespace {

namespace fs = std::filesystem;

using test::TempDir;

std::string error_of(const DataConfig& cfg, int vocab, int T) {
  try {
    TokenData::load(cfg, vocab, T);
  } catch (const ConfigError& e) {
    return std::string(e.what()) + " ---> " + e.hint();
  }
  return "loaded";
}

TEST(TokenFiles, Uint32AndUint16FilesLoadTheTokensTheyHold) {
  TempDir t("data-test");
  std::vector<std::uint32_t> wide(5000), narrow(5000);
  for (std::size_t i = 0; i < wide.size(); ++i) {
    wide[i] = static_cast<std::uint32_t>((i * 7919) % 128256);  // Llama 3's vocabulary
    narrow[i] = static_cast<std::uint32_t>((i * 31) % 50257);   // GPT-2's
  }
  EXPECT_EQ(write_token_file(t / "wide.bin", wide), 4);
  EXPECT_EQ(write_token_file(t / "narrow.bin", narrow), 2);
  EXPECT_EQ(fs::file_size(t / "wide.bin"), 1024 + 4 * wide.size());
  for (auto [name, want, vocab] : {std::tuple{"wide.bin", &wide, 128256}, std::tuple{"narrow.bin", &narrow, 50257}}) {
    DataConfig cfg;
    cfg.path = t / name;
    cfg.val_fraction = 0.1;
    const TokenData d = TokenData::load(cfg, vocab, 16);
    ASSERT_EQ(d.size(), want->size()) << name;
    for (std::size_t i = 0; i < want->size(); ++i) ASSERT_EQ(d.at(i), (*want)[i]) << name << " at " << i;
    EXPECT_NE(d.description().find(std::string("uint") + (vocab > 65535 ? "32" : "16")), std::string::npos)
        << d.description();
  }
  DataConfig cfg;
  cfg.path = t / "wide.bin";
  cfg.val_fraction = 0.1;
  EXPECT_NE(error_of(cfg, 50257, 16).find("is outside the model's vocabulary (50257)"), std::string::npos);
  std::filesystem::resize_file(t / "wide.bin", 1024 + 4 * wide.size() - 4);  // one token short
  EXPECT_NE(error_of(cfg, 128256, 16).find("header says 5000 tokens but the file holds 4999"), std::string::npos);
}

TEST(TokenFiles, SentencePieceTokenizesAtLoadAndZinfTokenizeWritesTheSameTokens) {
  TempDir t("data-test");
  std::string text;
  for (const char* f : {"/usr/share/common-licenses/Apache-2.0", "/usr/share/common-licenses/GPL-3"}) {
    std::ifstream in(f);
    text.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  if (text.size() < 20000) GTEST_SKIP() << "Debian's licence texts are missing (base-files)";
  std::ofstream(t / "corpus.txt") << text;
  const auto st =
      sentencepiece::SentencePieceTrainer::Train("--input=" + (t / "corpus.txt") + " --model_prefix=" + (t / "sp") +
                                                 " --vocab_size=300 --model_type=bpe --character_coverage=1.0"
                                                 " --minloglevel=2");
  ASSERT_TRUE(st.ok()) << st.ToString();
  int vocab = 0;
  const std::vector<std::uint32_t> want = sentencepiece_encode(t / "sp.model", text, &vocab);
  EXPECT_EQ(vocab, 300);
  EXPECT_LT(want.size(), text.size() / 2);  // pieces, not bytes

  DataConfig cfg;
  cfg.path = t / "corpus.txt";
  cfg.tokenizer = t / "sp.model";
  cfg.val_fraction = 0.1;
  const TokenData d = TokenData::load(cfg, 300, 32);
  ASSERT_EQ(d.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) ASSERT_EQ(d.at(i), want[i]) << i;
  EXPECT_NE(error_of(cfg, 256, 32).find("the tokenizer has 300 pieces, more than model.vocab_size 256"),
            std::string::npos);

  // `zinf tokenize` writes the same tokens as a file, which loads as llm.c tokens.
  const std::string cmd = std::string(ZINF_BIN) + " tokenize --tokenizer " + (t / "sp.model") + " -o " +
                          (t / "corpus.bin") + " " + (t / "corpus.txt") + " > " + (t / "tokenize.out");
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  DataConfig file;
  file.path = t / "corpus.bin";
  file.val_fraction = 0.1;
  const TokenData f = TokenData::load(file, 300, 32);
  ASSERT_EQ(f.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) ASSERT_EQ(f.at(i), want[i]) << i;

  // A few training steps on them, through the config keys a user sets.
  const Config c =
      parse_config(R"({"model": {"n_layer": 1, "n_head": 2, "d_model": 32, "vocab_size": 300, "seq_len": 32},
      "data": {"path": ")" +
                   (t / "corpus.txt") + R"(", "tokenizer": ")" + (t / "sp.model") + R"("},
      "train": {"steps": 3, "eval_interval": 0, "eval_batches": 2},
      "device": {"type": "cpu", "memory_budget": "256MiB", "threads": 1}, "train_micro_batch_size_per_gpu": 2})");
  const TrainResult r = train(c, TrainHooks{});
  EXPECT_EQ(r.steps, 3);
  EXPECT_TRUE(std::isfinite(r.val_loss));
  EXPECT_LT(r.val_loss, r.first_val_loss);
}

}  // namespace
}  // namespace zinf
