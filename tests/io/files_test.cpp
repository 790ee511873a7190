// files_test.cpp — what zinf reads and writes as files. Reading: only regular files (a FIFO, a device
// or a directory is refused before anything can block), and every bad file — malformed safetensors,
// a config.json that is not an object or holds impossible numbers, NaN or infinite weights, a bad
// SentencePiece model — is one ConfigError naming the file and the key. Writing: outputs appear
// whole or not at all — a file size limit (EFBIG, standing in for a full disk's ENOSPC) in the
// middle of a write leaves no temporary and the previous output untouched; a folder export replaces
// an earlier export's shards and index and keeps the user's other files; the metrics file's first
// failed write is an error.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "../e2e/shell.h"
#include "app/config/config.h"
#include "app/train/report.h"
#include "common/error_of.h"
#include "common/temp_dir.h"
#include "io/data.h"
#include "io/files.h"
#include "io/hf.h"
#include "io/safetensors.h"
#include "zinf/error.h"

namespace zinf {
namespace {

namespace fs = std::filesystem;

using test::TempDir;

// A FIFO nobody writes to: a reader that opened it would wait forever. Should a regression make
// zinf open one, the alarm ends the test binary instead of hanging the suite.
struct HangGuard {
  HangGuard() { ::alarm(120); }
  ~HangGuard() { ::alarm(0); }
};

// Files may grow to `bytes` at most: a longer write fails with EFBIG (SIGXFSZ ignored), as a full
// disk fails with ENOSPC — at some point in the middle of the output.
struct FileSizeLimit {
  rlimit old{};
  explicit FileSizeLimit(rlim_t bytes) {
    std::signal(SIGXFSZ, SIG_IGN);
    ::getrlimit(RLIMIT_FSIZE, &old);
    rlimit r = old;
    r.rlim_cur = bytes;
    ::setrlimit(RLIMIT_FSIZE, &r);
  }
  ~FileSizeLimit() { ::setrlimit(RLIMIT_FSIZE, &old); }
};

using test::slurp;
using test::snapshot;

using test::error_of;

ModelShape tiny_llama() {
  ModelShape s{2, 4, 32, 64, 16};
  s.family = ModelFamily::llama;
  s.n_kv_head = 2, s.d_ff = 40, s.norm_eps = 1e-5, s.rope_theta = 10000, s.max_positions = 64;
  return s;
}

std::vector<std::vector<float>> units_of(const ModelShape& s, float base) {
  std::vector<std::vector<float>> u;
  for (const auto& lu : layer_units(s)) {
    u.emplace_back(static_cast<std::size_t>(lu.params));
    for (std::size_t i = 0; i < u.back().size(); ++i) u.back()[i] = base + 1e-3f * static_cast<float>(i % 97);
  }
  return u;
}

// ---------------------------------------------------------------------------------------------- reading

TEST(InputFiles, OnlyRegularFilesAreReadAndTheRefusalNamesTheRoleAndPath) {
  TempDir t("files-test");
  HangGuard guard;
  ASSERT_EQ(::mkfifo((t / "fifo").c_str(), 0600), 0);
  std::ofstream(t / "ok") << "text";
  EXPECT_EQ(read_input_file(t / "ok", "data.path"), "text");
  EXPECT_NE(error_of<ConfigError>([&] {
              InputFile f(t / "fifo", "data.path");
            }).find("data.path " + t / "fifo" + ": is a FIFO"),
            std::string::npos);
  EXPECT_NE(error_of<ConfigError>([&] { InputFile f(t.path.string(), "model.init_from"); }).find(": is a directory"),
            std::string::npos);
  EXPECT_NE(error_of<ConfigError>([&] {
              InputFile f("/dev/zero", "--tokenizer");
            }).find("--tokenizer /dev/zero: is a device"),
            std::string::npos);
  EXPECT_NE(error_of<ConfigError>([&] {
              InputFile f(t / "missing", "config file");
            }).find("config file " + t / "missing" + ": does not exist"),
            std::string::npos);
}

TEST(InputFiles, AFifoAsDataPathTokenizerOrInitFromIsRefusedNotWaitedOn) {
  TempDir t("files-test");
  HangGuard guard;
  ASSERT_EQ(::mkfifo((t / "fifo").c_str(), 0600), 0);
  DataConfig d;
  d.path = t / "fifo";
  EXPECT_NE(error_of<ConfigError>([&] { TokenData::load(d, 256, 8); }).find("is a FIFO"), std::string::npos);
  EXPECT_NE(error_of<ConfigError>([&] {
              sentencepiece_encode(t / "fifo", "text");
            }).find("data.tokenizer " + t / "fifo" + ": is a FIFO"),
            std::string::npos);
  EXPECT_NE(error_of<ConfigError>([&] {
              parse_config(R"({"train_batch_size": 1, "model": {"init_from": ")" + t / "fifo" + R"("}})", {}, "c.json",
                           1);
            }).find("model.init_from " + t / "fifo" + ": is a FIFO"),
            std::string::npos);
  EXPECT_NE(error_of<ConfigError>([&] {
              parse_config(R"({"train_batch_size": 1, "model": {"init_from": "/nonexistent/m.safetensors"}})", {},
                           "c.json", 1);
            }).find("model.init_from /nonexistent/m.safetensors: does not exist"),
            std::string::npos);
}

TEST(InputFiles, ATokenizerThatIsADirectoryOrNotAModelIsOneLineOfZinfsOwn) {
  TempDir t("files-test");
  std::ofstream(t / "junk.model") << "this is not a protobuf";
  DataConfig d;
  d.path = t / "text.txt";
  std::ofstream(d.path) << std::string(4000, 'a');
  d.tokenizer = t.path.string();
  EXPECT_NE(error_of<ConfigError>([&] {
              TokenData::load(d, 256, 8);
            }).find("data.tokenizer " + t.path.string() + ": the folder holds neither tokenizer.json nor tokenizer.model"),
            std::string::npos);  // a folder is a model folder (io/tokenizer.h); this one has no tokenizer
  d.tokenizer = t / "junk.model";
  const std::string e = error_of<ConfigError>([&] { TokenData::load(d, 256, 8); });
  EXPECT_NE(e.find("data.tokenizer " + t / "junk.model" + ": not a SentencePiece model"), std::string::npos) << e;
  EXPECT_EQ(e.find(".cc("), std::string::npos) << e;  // not the library's source location
}

TEST(InputFiles, SameFileComparesDeviceAndInode) {
  TempDir t("files-test");
  std::ofstream(t / "a") << "x";
  std::ofstream(t / "b") << "x";
  fs::create_hard_link(t / "a", t / "link");
  EXPECT_TRUE(same_file(t / "a", t / "link"));
  EXPECT_TRUE(same_file(t / "a", (t.path / "." / "a").string()));
  EXPECT_FALSE(same_file(t / "a", t / "b"));
  EXPECT_FALSE(same_file(t / "a", t / "missing"));
}

// ------------------------------------------------------------------------------------ bad model files

TEST(BadModelFiles, MalformedOrMissingSafetensorsAreBadInput) {
  TempDir t("files-test");
  std::ofstream(t / "short.safetensors") << "abc";
  EXPECT_THROW(read_safetensors(t / "short.safetensors"), ConfigError);
  EXPECT_THROW(read_safetensors(t / "missing.safetensors"), ConfigError);
  EXPECT_THROW(StReader(t / "short.safetensors"), ConfigError);
  EXPECT_THROW(parse_safetensors(std::string("\x02\0\0\0\0\0\0\0[]", 10), "x"), ConfigError);
}

TEST(BadModelFiles, ConfigJsonThatIsNotAnObjectIsOneLineNamingTheFile) {
  for (const char* text : {"[1,2]", "null", "42", "\"llama\""}) {
    SCOPED_TRACE(text);
    const std::string e = error_of<ConfigError>([&] { hf_shape_from_json(text, "m/config.json", 16); });
    EXPECT_EQ(e.rfind("m/config.json: expected a JSON object", 0), 0u) << e;
    EXPECT_EQ(e.find("json.exception"), std::string::npos) << e;
  }
  EXPECT_EQ(error_of<ConfigError>([] {
              parse_config("[1,2]", {}, "run.json", 1);
            }).rfind("run.json: the config must be a JSON object", 0),
            0u);
  EXPECT_EQ(error_of<ConfigError>([] {
              parse_config("null", {"train_batch_size=1"}, "run.json", 1);
            }).rfind("run.json: the config must be a JSON object", 0),
            0u);
}

// A JSON document followed by NUL bytes (JSON readers stop at the first one) is not text: a
// folder's config.json like that is one line naming the file and the offset, as read_input_text says.
TEST(BadModelFiles, AJsonFileWithNulBytesIsRefusedNamingTheOffset) {
  TempDir t("nul-json");
  std::ofstream(t / "plain.json") << "{}";
  EXPECT_EQ(read_input_text(t / "plain.json", "x"), "{}");
  std::ofstream(t / "nul.json", std::ios::binary) << std::string("{}\0\0{", 5);
  const std::string e = error_of<ConfigError>([&] { read_input_text(t / "nul.json", "x"); });
  EXPECT_EQ(e.rfind("x " + (t / "nul.json") + ": holds a NUL byte at offset 2, not text", 0), 0u) << e;
  fs::create_directories(t / "m");
  std::ofstream(t / "m/config.json", std::ios::binary)
      << std::string(R"({"model_type": "llama"})") + std::string(3, '\0');
  const std::string h = error_of<ConfigError>([&] { hf_shape(t / "m", 16); });
  EXPECT_NE(h.find("config.json: holds a NUL byte at offset 23"), std::string::npos) << h;
}

TEST(BadModelFiles, ImpossibleNumbersInConfigJsonAreRefusedNamingTheKey) {
  const nlohmann::json good = {
      {"model_type", "llama"},    {"hidden_size", 32},      {"intermediate_size", 40}, {"num_attention_heads", 4},
      {"num_key_value_heads", 2}, {"num_hidden_layers", 2}, {"vocab_size", 64},        {"max_position_embeddings", 64}};
  EXPECT_NO_THROW(hf_shape_from_json(good.dump(), "config.json", 16));
  const std::pair<nlohmann::json, std::string> cases[] = {
      {{{"rms_norm_eps", -1}}, "rms_norm_eps"},
      {{{"rms_norm_eps", 0}}, "rms_norm_eps"},
      {{{"rms_norm_eps", 5}}, "rms_norm_eps"},
      {{{"rope_theta", -5}}, "rope_theta"},
      {{{"rope_theta", 0}}, "rope_theta"},
      {{{"rope_scaling", 5}}, "rope_scaling"},
      {{{"rope_scaling", {{"rope_type", "llama3"}, {"factor", 0}}}}, "rope_scaling.factor"},
      {{{"rope_scaling", {{"rope_type", "llama3"}, {"factor", 8}, {"low_freq_factor", -1}}}},
       "rope_scaling.low_freq_factor"},
      {{{"rope_scaling", {{"rope_type", 3}}}}, "rope_scaling"},
      {{{"model_type", 3}}, "model_type"},
      {{{"hidden_act", 7}}, "hidden_act"},
      {{{"hidden_size", -32}}, "hidden_size"},
  };
  for (const auto& [patch, key] : cases) {
    nlohmann::json c = good;
    c.update(patch);
    SCOPED_TRACE(c.dump());
    const std::string e = error_of<ConfigError>([&] { hf_shape_from_json(c.dump(), "m/config.json", 16); });
    EXPECT_EQ(e.rfind("m/config.json: ", 0), 0u) << e;
    EXPECT_NE(e.find(key), std::string::npos) << e;
  }
}

TEST(BadModelFiles, AnIndexNamingAFileOutsideTheFolderIsRefused) {
  EXPECT_THROW(hf_index_files(R"({"weight_map": {"a": "../secret.safetensors"}})", "i.json"), ConfigError);
  EXPECT_THROW(hf_index_files(R"({"weight_map": {"a": "/etc/x.safetensors"}})", "i.json"), ConfigError);
  EXPECT_THROW(hf_index_files(R"([1])", "i.json"), ConfigError);
  EXPECT_EQ(
      hf_index_files(R"({"weight_map": {"a": "m-2.safetensors", "b": "m-1.safetensors", "c": "m-1.safetensors"}})",
                     "i.json"),
      (std::vector<std::string>{"m-1.safetensors", "m-2.safetensors"}));
}

TEST(BadModelFiles, NonFiniteWeightsAreRefusedNamingTheFileAndTensor) {
  TempDir t("files-test");
  const ModelShape s = tiny_llama();
  auto units = units_of(s, 0.01f);
  units[1][5] = std::numeric_limits<float>::quiet_NaN();  // unit 1 is layer 0: its input_layernorm.weight first
  write_hf_folder(t / "nan", s, units, StDtype::bf16);
  HfModelReader r(t / "nan");
  std::vector<float> buf(units[1].size());
  const std::string e = error_of<ConfigError>([&] { r.load_unit(s, 1, buf.data()); });
  EXPECT_NE(e.find(t / "nan" + "/model.safetensors: tensor model.layers.0.input_layernorm.weight holds NaN"),
            std::string::npos)
      << e;

  const ModelShape g{1, 2, 8, 16, 4};
  auto gu = units_of(g, 0.02f);
  gu[0][3] = std::numeric_limits<float>::infinity();
  write_gpt2_safetensors(t / "inf.safetensors", g, gu, StDtype::f16);
  const StFile f = read_safetensors(t / "inf.safetensors");
  std::vector<float> gb(gu[0].size());
  const std::string ge = error_of<ConfigError>([&] { load_gpt2_unit(f, "inf.safetensors", g, 0, gb.data()); });
  EXPECT_NE(ge.find("inf.safetensors: tensor wte.weight holds Inf at element 3"), std::string::npos) << ge;
}

// ------------------------------------------------------------------------------------------- writing

TEST(Outputs, AFileIsReplacedOnlyWhenCompleteAndAFailureLeavesNoTemporary) {
  TempDir t("files-test");
  std::ofstream(t / "out") << "old";
  {
    OutputFile f(t / "out");
    f.write("new", 3);
  }  // abandoned: no commit
  EXPECT_EQ(slurp(t / "out"), "old");
  EXPECT_EQ(std::distance(fs::directory_iterator(t.path), fs::directory_iterator()), 1);
  {
    FileSizeLimit limit(100000);
    const std::string big(300000, 'x');
    OutputFile f(t / "out");
    EXPECT_THROW(
        {
          f.write(big.data(), big.size());
          f.commit();
        },
        IoError);
  }
  EXPECT_EQ(slurp(t / "out"), "old");
  EXPECT_EQ(std::distance(fs::directory_iterator(t.path), fs::directory_iterator()), 1);
  OutputFile f(t / "out");
  f.write("new", 3);
  f.commit();
  EXPECT_EQ(slurp(t / "out"), "new");
}

TEST(Outputs, TokenFileAndSafetensorsOnAFullDiskLeaveTheOldFileAndNoTemporary) {
  TempDir t("files-test");
  const std::vector<std::uint32_t> few(10, 7), many(200000, 9);
  write_token_file(t / "tokens.bin", few);
  const ModelShape g{1, 2, 8, 16, 4};
  write_gpt2_safetensors(t / "m.safetensors", g, units_of(g, 0.1f), StDtype::f32);
  const auto before = snapshot(t.path);
  {
    FileSizeLimit limit(20000);
    EXPECT_THROW(write_token_file(t / "tokens.bin", many), IoError);
    const ModelShape big{2, 2, 64, 256, 16};
    EXPECT_THROW(write_gpt2_safetensors(t / "m.safetensors", big, units_of(big, 0.1f), StDtype::f32), IoError);
  }
  EXPECT_EQ(snapshot(t.path), before);
}

TEST(Outputs, AFolderExportReplacesAnEarlierExportsShardsAndKeepsOtherFiles) {
  TempDir t("files-test");
  const ModelShape s = tiny_llama();
  const auto old_units = units_of(s, 0.5f), new_units = units_of(s, -0.25f);
  write_hf_folder(t / "m", s, old_units, StDtype::f32, 8000);  // sharded, with an index
  ASSERT_TRUE(fs::exists(t / "m/model.safetensors.index.json"));
  std::ofstream(t / "m/tokenizer.json") << "{\"keep\": true}";
  fs::create_directories(t / "m/notes");
  std::ofstream(t / "m/notes/readme.txt") << "mine";
  write_hf_folder(t / "m", s, new_units, StDtype::f32);  // one file this time
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(t / "m")) names.insert(e.path().filename().string());
  EXPECT_EQ(names, (std::set<std::string>{"config.json", "model.safetensors", "notes", "tokenizer.json"}));
  EXPECT_EQ(slurp(t / "m/tokenizer.json"), "{\"keep\": true}");
  EXPECT_EQ(slurp(t / "m/notes/readme.txt"), "mine");
  HfModelReader r(t / "m");
  std::vector<float> u0(new_units[0].size());
  r.load_unit(s, 0, u0.data());
  EXPECT_EQ(u0, new_units[0]);  // the new weights, not the old shards'
  std::set<std::string> beside;
  for (const auto& e : fs::directory_iterator(t.path)) beside.insert(e.path().filename().string());
  EXPECT_EQ(beside, std::set<std::string>{"m"});  // no temporary or old folder left behind
}

TEST(Outputs, AFolderExportThatFailsLeavesThePreviousFolderUntouched) {
  TempDir t("files-test");
  const ModelShape s = tiny_llama();
  write_hf_folder(t / "m", s, units_of(s, 0.5f), StDtype::bf16, 8000);
  std::ofstream(t / "m/tokenizer.json") << "{}";
  const auto before = snapshot(t.path);
  {
    FileSizeLimit limit(30000);  // the new single file (about 72 KB) stops part way: the disk is "full"
    EXPECT_THROW(write_hf_folder(t / "m", s, units_of(s, -0.5f), StDtype::f32), IoError);
    EXPECT_THROW(write_hf_folder(t / "new/deeper/m", s, units_of(s, -0.5f), StDtype::f32), IoError);
  }
  EXPECT_EQ(snapshot(t.path), before);  // nor the folders made for a new output
}

TEST(Outputs, ModelSafetensorsIsReadBeforeAnIndexAsHuggingFaceDoes) {
  TempDir t("files-test");
  const ModelShape s = tiny_llama();
  const auto single = units_of(s, 0.5f), sharded = units_of(s, -0.5f);
  write_hf_folder(t / "sharded", s, sharded, StDtype::f32, 8000);
  write_hf_folder(t / "m", s, single, StDtype::f32);
  for (const auto& e : fs::directory_iterator(t / "sharded"))
    if (e.path().filename() != "config.json") fs::copy_file(e.path(), t.path / "m" / e.path().filename());
  HfModelReader r(t / "m");
  EXPECT_NE(r.weights().find("model.safetensors (model.safetensors.index.json beside it is ignored"), std::string::npos)
      << r.weights();
  std::vector<float> u0(single[0].size());
  r.load_unit(s, 0, u0.data());
  EXPECT_EQ(u0, single[0]);
}

TEST(Outputs, TheMetricsFilesFirstFailedWriteIsAnError) {
  MetricsFile m("/dev/full");  // every write: ENOSPC
  StepReport r;
  r.step = 1;
  const std::string e = error_of<IoError>([&] { m.step(r); });
  EXPECT_NE(e.find("train.metrics_file /dev/full: write failed (No space left on device)"), std::string::npos) << e;
}

}  // namespace
}  // namespace zinf
