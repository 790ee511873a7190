// generate_cli_test.cpp — `zinf generate` as a user runs it, on a model trained for a few steps by
// `zinf train` (configs/tiny.json, shrunk): the same seed gives the same text twice; a run's checkpoint
// folder, one of its checkpoints and the model exported as GPT-2 safetensors and as a Hugging Face folder
// give the same tokens; --json; bad input is one error line and a non-zero exit.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "common/temp_dir.h"
#include "shell.h"

namespace zinf::test {
namespace {

Result run(const std::string& args) { return sh(std::string(ZINF_BIN) + " " + args); }

class GenerateCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("generate-cli");
    const Result r = run("train --config " + kTinyConfig +
                         " --set train.steps=4 --set model.n_layer=1 --set model.d_model=32 --set model.n_head=2"
                         " --set model.seq_len=32 --set train_micro_batch_size_per_gpu=2 --set train.eval_batches=1"
                         " --set device.threads=1 --set train.checkpoint_interval=4 --set train.checkpoint_dir=\"" +
                         ckpts() + "\"");
    ASSERT_EQ(r.rc, 0) << r.err;
    const Result ex = run("export --checkpoint " + ckpts() + "/step-00000004 -o " + safetensors());
    ASSERT_EQ(ex.rc, 0) << ex.err;
    const Result hf = run("export --format hf --checkpoint " + ckpts() + "/step-00000004 -o " + hf_folder());
    ASSERT_EQ(hf.rc, 0) << hf.err;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string ckpts() { return *dir_ / "ckpt"; }
  static std::string safetensors() { return *dir_ / "model.safetensors"; }
  static std::string hf_folder() { return *dir_ / "gpt2-hf"; }
  static TempDir* dir_;
};
TempDir* GenerateCli::dir_ = nullptr;

TEST_F(GenerateCli, SameSeedSameTextAndEveryModelFormGivesTheSameTokens) {
  const std::string args = " --prompt 'The ' --max-new-tokens 20 --temperature 0.9 --top-k 50 --seed 1 --threads 1";
  const Result a = run("generate --model " + ckpts() + args);
  const Result b = run("generate --model " + ckpts() + args);
  ASSERT_EQ(a.rc, 0) << a.err;
  ASSERT_EQ(b.rc, 0) << b.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.err.find("generate: 4 prompt tokens, 20 new"), std::string::npos) << a.err;
  EXPECT_NE(a.err.find("tokens/s"), std::string::npos) << a.err;

  const Result j = run("generate --json --model " + ckpts() + args);
  ASSERT_EQ(j.rc, 0) << j.err;
  const auto o = nlohmann::json::parse(j.out);
  EXPECT_EQ(o["prompt_ids"], nlohmann::json::array({'T', 'h', 'e', ' '}));  // the byte tokenizer
  ASSERT_EQ(o["ids"].size(), 20u);
  EXPECT_EQ(o["stop"], "max_new_tokens");
  EXPECT_GT(o["timings"]["decode_tokens_per_s"].get<double>(), 0.0);
  std::string bytes;
  for (const auto& id : o["ids"]) bytes.push_back(static_cast<char>(id.get<int>()));
  EXPECT_EQ(bytes + "\n", a.out) << "stdout is the new tokens' bytes";

  const Result c = run("generate --json --model " + ckpts() + "/step-00000004" + args);
  ASSERT_EQ(c.rc, 0) << c.err;
  EXPECT_EQ(nlohmann::json::parse(c.out)["ids"], o["ids"]);
  const Result s = run("generate --json --n-head 2 --model " + safetensors() + args);
  ASSERT_EQ(s.rc, 0) << s.err;
  EXPECT_EQ(nlohmann::json::parse(s.out)["ids"], o["ids"]);
  const Result h = run("generate --json --model " + hf_folder() + args);  // GPT-2's Hugging Face folder
  ASSERT_EQ(h.rc, 0) << h.err;
  EXPECT_EQ(nlohmann::json::parse(h.out)["ids"], o["ids"]);
}

// A Llama with grouped-query heads trained for two steps: its checkpoint and its Hugging Face export
// give the same tokens.
TEST_F(GenerateCli, LlamaCheckpointAndItsHuggingFaceFolderGiveTheSameTokens) {
  const std::string ck = *dir_ / "llama-ckpt", hf = *dir_ / "llama-hf";
  const Result t = run("train --config " + kTinyConfig +
                       " --set train.steps=2 --set model.family=llama --set model.n_layer=2 --set model.d_model=32"
                       " --set model.n_head=4 --set model.n_kv_head=2 --set model.d_ff=48 --set model.seq_len=32"
                       " --set train_micro_batch_size_per_gpu=2 --set train.eval_batches=1 --set device.threads=1"
                       " --set train.checkpoint_interval=2 --set train.checkpoint_dir=\"" +
                       ck + "\"");
  ASSERT_EQ(t.rc, 0) << t.err;
  const Result ex = run("export --format hf --checkpoint " + ck + "/step-00000002 -o " + hf);
  ASSERT_EQ(ex.rc, 0) << ex.err;
  const std::string args = " --json --prompt 'Once ' --max-new-tokens 12 --temperature 0.7 --seed 3 --threads 1";
  const Result a = run("generate --model " + ck + args), b = run("generate --model " + hf + args);
  ASSERT_EQ(a.rc, 0) << a.err;
  ASSERT_EQ(b.rc, 0) << b.err;
  const auto ja = nlohmann::json::parse(a.out), jb = nlohmann::json::parse(b.out);
  EXPECT_EQ(ja["ids"].size(), 12u);
  EXPECT_EQ(ja["ids"], jb["ids"]);
  EXPECT_NE(jb["model"].get<std::string>().find("Hugging Face folder"), std::string::npos) << jb["model"];
}

// --chat none on a byte model: the prompt is the user's text as is (no markers, no BOS), so the
// tokens equal a plain prompt's; --system without --chat, an unknown template and --no-special with
// --chat are refused.
TEST_F(GenerateCli, ChatNoneOnAByteModelIsThePlainPrompt) {
  const std::string args = " --json --prompt 'The ' --max-new-tokens 8 --seed 2 --threads 1";
  const Result plain = run("generate --model " + ckpts() + args);
  const Result chat = run("generate --chat none --model " + ckpts() + args);
  const Result aut = run("generate --chat auto --model " + ckpts() + args);
  ASSERT_EQ(plain.rc, 0) << plain.err;
  ASSERT_EQ(chat.rc, 0) << chat.err;
  ASSERT_EQ(aut.rc, 0) << aut.err;
  const auto p = nlohmann::json::parse(plain.out), c = nlohmann::json::parse(chat.out),
             a = nlohmann::json::parse(aut.out);
  EXPECT_EQ(c["prompt_ids"], p["prompt_ids"]);
  EXPECT_EQ(c["ids"], p["ids"]);
  EXPECT_EQ(c["chat_template"], "none");
  EXPECT_EQ(a["chat_template"].get<std::string>().rfind("none", 0), 0u) << a["chat_template"];
  // A template whose markers the tokenizer (here: bytes) does not have is refused, naming one.
  const Result no_markers = run("generate --chat llama3 --model " + ckpts() + " --prompt hi");
  EXPECT_EQ(no_markers.rc, 2) << no_markers.err;
  EXPECT_NE(no_markers.err.find("--chat llama3: the tokenizer (bytes"), std::string::npos) << no_markers.err;
  EXPECT_NE(no_markers.err.find("has no special token <|begin_of_text|>"), std::string::npos) << no_markers.err;
  // --no-special applies to a plain prompt: a chat prompt is encoded as its template renders it.
  for (const std::string& bad : {std::string(" --system 'Be brief.'"), std::string(" --chat jinja"),
                                 std::string(" --chat none --no-special")}) {
    const Result r = run("generate --model " + ckpts() + " --prompt hi" + bad);
    EXPECT_EQ(r.rc, 2) << bad << ": " << r.err;
    EXPECT_EQ(lines(r.err), 1u) << r.err;
  }
}

TEST_F(GenerateCli, BadInputIsOneErrorLine) {
  for (const std::string& args :
       {std::string("--model /nonexistent/model --prompt hi"), "--model " + ckpts() + " --prompt hi --temperature -1",
        "--model " + ckpts() + " --prompt hi --device tpu",
        "--model " + ckpts(),  // no prompt
        "--model " + dir_->path.string() + " --prompt hi", "--model " + safetensors() + " --prompt hi --n-head 3",
        "--model " + safetensors() + " --prompt hi"}) {
    const Result r = run("generate " + args);
    EXPECT_EQ(r.rc, 2) << args << ": " << r.err;
    EXPECT_EQ(lines(r.err), 1u) << args << ": " << r.err;
    EXPECT_EQ(r.err.rfind("zinf: ", 0), 0u) << r.err;
  }
  const Result r = run("generate --model /nonexistent/model --prompt hi");
  EXPECT_NE(r.err.find("--model /nonexistent/model: does not exist"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace zinf::test
