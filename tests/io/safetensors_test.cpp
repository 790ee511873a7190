// safetensors_test.cpp — the writer against an independent reading of the format, round trips in
// every dtype, every class of bad header refused with the file and tensor named, a fuzz of random and
// mutated headers (never a crash, only zinf::Error), and export → model.init_from end to end.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "app/config/config.h"
#include "app/train/checkpoint.h"
#include "app/train/train.h"
#include "common/temp_dir.h"
#include "io/safetensors.h"
#include "zinf/cpu_adam/convert.h"
#include "zinf/error.h"

namespace zinf {
namespace {

namespace fs = std::filesystem;

const ModelShape kShape{2, 2, 8, 16, 4};

using test::TempDir;

std::vector<std::vector<float>> random_units(const ModelShape& s, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<std::vector<float>> u;
  for (const auto& lu : layer_units(s)) {
    u.emplace_back(static_cast<std::size_t>(lu.params));
    for (auto& x : u.back()) x = nd(rng);
  }
  return u;
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

std::string make_file(const nlohmann::json& header, std::size_t data_bytes) {
  const std::string h = header.dump();
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<std::size_t>(i)] = static_cast<char>((h.size() >> (8 * i)) & 0xFF);
  return s + h + std::string(data_bytes, '\x01');
}

TEST(Safetensors, WriterFollowsTheFormatByAnIndependentReading) {
  TempDir t("st");
  const auto units = random_units(kShape, 1);
  const fs::path p = t.path / "m.safetensors";
  write_gpt2_safetensors(p.string(), kShape, units, StDtype::f32);
  const std::string b = slurp(p);
  std::uint64_t n = 0;
  std::memcpy(&n, b.data(), 8);  // little-endian u64 on x86-64
  ASSERT_LE(8 + n, b.size());
  EXPECT_EQ((8 + n) % 8, 0u);  // data 8-byte aligned
  const auto h = nlohmann::json::parse(b.substr(8, n));
  EXPECT_EQ(h["__metadata__"]["format"], "pt");
  const auto& w = h["h.1.mlp.c_fc.weight"];
  EXPECT_EQ(w["dtype"], "F32");
  EXPECT_EQ(w["shape"], nlohmann::json::array({8, 32}));
  // h.1.mlp.c_fc.weight sits at element offset 2C + 3C² + 3C + C² + C + 2C in unit 2.
  const std::size_t off = 2 * 8 + 3 * 64 + 3 * 8 + 64 + 8 + 2 * 8;
  const std::uint64_t begin = w["data_offsets"][0].get<std::uint64_t>();
  EXPECT_EQ(std::memcmp(b.data() + 8 + n + begin, units[2].data() + off, 8 * 32 * 4), 0);
  std::size_t tensors = 0;
  for (auto it = h.begin(); it != h.end(); ++it) tensors += it.key() != "__metadata__";
  EXPECT_EQ(tensors, 2u + 12u * 2 + 2u);
}

TEST(Safetensors, RoundTripsInEveryDtype) {
  TempDir t("st");
  const auto units = random_units(kShape, 2);
  for (StDtype d : {StDtype::f32, StDtype::f16, StDtype::bf16}) {
    const fs::path p = t.path / "r.safetensors";
    write_gpt2_safetensors(p.string(), kShape, units, d);
    const StFile f = read_safetensors(p.string());
    for (std::size_t u = 0; u < units.size(); ++u) {
      std::vector<float> back(units[u].size());
      load_gpt2_unit(f, p.string(), kShape, u, back.data());
      for (std::size_t i = 0; i < back.size(); ++i) {
        float want = units[u][i];
        if (d == StDtype::f16) want = cpu_adam::fp16_to_fp32_reference(cpu_adam::fp32_to_fp16_reference(want));
        if (d == StDtype::bf16) want = cpu_adam::bf16_to_fp32_reference(cpu_adam::fp32_to_bf16_reference(want));
        ASSERT_EQ(back[i], want) << "unit " << u << " [" << i << "]";
      }
    }
  }
}

TEST(Safetensors, BadHeadersAreRefusedWithTheReason) {
  auto err = [](const std::string& bytes) {
    try {
      parse_safetensors(bytes, "x.safetensors");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  using nlohmann::json;
  EXPECT_NE(err("abc").find("shorter than"), std::string::npos);
  std::string big(16, '\0');
  big[0] = '\x7f';
  EXPECT_NE(err(big).find("exceeds the file"), std::string::npos);
  std::string notjson = make_file(json::object(), 0);
  notjson[9] = '[';
  EXPECT_NE(err(notjson).find("not valid JSON"), std::string::npos);
  EXPECT_NE(err(make_file(json::array(), 0)).find("not a JSON object"), std::string::npos);
  EXPECT_NE(err(make_file({{"a", {{"dtype", "F32"}}}}, 0)).find("tensor a needs"), std::string::npos);
  EXPECT_NE(err(make_file({{"a", {{"dtype", "I8"}, {"shape", {1}}, {"data_offsets", {0, 1}}}}}, 1))
                .find("unsupported dtype I8"),
            std::string::npos);
  EXPECT_NE(err(make_file({{"a", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 4}}}}}, 4))
                .find("shape needs 8 bytes"),
            std::string::npos);
  EXPECT_NE(err(make_file({{"a", {{"dtype", "F32"}, {"shape", {-1}}, {"data_offsets", {0, 4}}}}}, 4)).find("negative"),
            std::string::npos);
  EXPECT_NE(
      err(make_file({{"a", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {4, 8}}}}}, 4)).find("outside the data"),
      std::string::npos);
  EXPECT_NE(err(make_file({{"a", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 8}}}},
                           {"b", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {4, 8}}}}},
                          8))
                .find("overlaps"),
            std::string::npos);
  EXPECT_NE(err(make_file({{"a", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {4, 8}}}}}, 8)).find("hole"),
            std::string::npos);
  EXPECT_NE(
      err(make_file({{"a", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {0, 4}}}}}, 8)).find("after the last"),
      std::string::npos);
  EXPECT_EQ(err(make_file({{"a", {{"dtype", "F16"}, {"shape", {2, 1}}, {"data_offsets", {0, 4}}}},
                           {"__metadata__", json::object()}},
                          4)),
            "(accepted)");
}

TEST(Safetensors, MissingOrMisshapenTensorsAreNamed) {
  TempDir t("st");
  const auto units = random_units(kShape, 3);
  const fs::path p = t.path / "m.safetensors";
  write_gpt2_safetensors(p.string(), kShape, units, StDtype::f32);
  const StFile f = read_safetensors(p.string());
  std::vector<float> buf(units[1].size());
  const ModelShape wider{2, 2, 16, 16, 4};
  try {
    load_gpt2_unit(f, p.string(), wider, 1, buf.data());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("h.0.ln_1.weight has shape [8], the model needs [16]"), std::string::npos)
        << e.what();
  }
  const ModelShape deeper{3, 2, 8, 16, 4};
  std::vector<float> b3(units[1].size());
  try {
    load_gpt2_unit(f, p.string(), deeper, 3, b3.data());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor h.2.ln_1.weight is missing"), std::string::npos) << e.what();
  }
}

TEST(Safetensors, FuzzedHeadersNeverCrash) {
  TempDir t("st");
  const fs::path p = t.path / "f.safetensors";
  write_gpt2_safetensors(p.string(), kShape, random_units(kShape, 4), StDtype::f16);
  const std::string good = slurp(p);
  std::uint64_t n = 0;
  std::memcpy(&n, good.data(), 8);
  std::mt19937 rng(99);
  int accepted = 0;
  const std::string alphabet = "{}[]\":,0123456789eE-+ abcdefFIB_.";
  for (int i = 0; i < 4000; ++i) {
    std::string s = good;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < edits; ++k) {
      const std::size_t pos = rng() % (i % 10 == 0 ? 8 : 8 + n);  // mostly the header, sometimes the length
      s[pos] = (i % 3 == 0) ? static_cast<char>(rng()) : alphabet[rng() % alphabet.size()];
    }
    if (i % 7 == 0) s.resize(rng() % s.size());
    try {
      parse_safetensors(s, "fuzz");
      ++accepted;
    } catch (const Error&) {
    } catch (const std::exception& e) {
      FAIL() << "unexpected exception type: " << e.what();
    }
  }
  for (int i = 0; i < 2000; ++i) {
    std::string s(rng() % 64, '\0');
    for (auto& c : s) c = static_cast<char>(rng());
    EXPECT_THROW(parse_safetensors(s, "random"), Error);
  }
  EXPECT_LT(accepted, 4000);
}

TEST(Safetensors, ExportThenInitFromContinuesFromTheSameWeights) {
  TempDir t("st");
  const std::string cfg = R"({"model": {"n_layer": 2, "n_head": 2, "d_model": 32, "vocab_size": 256, "seq_len": 16},
      "train": {"steps": 4, "eval_interval": 0, "eval_batches": 2, "checkpoint_dir": ")" +
                          (t.path / "ck").string() + R"("},
      "device": {"type": "cpu", "memory_budget": "256MiB", "threads": 1}, "train_micro_batch_size_per_gpu": 2})";
  const TrainResult first = train(parse_config(cfg), TrainHooks{});
  // Export the final checkpoint's masters (what `zinf export` does) and start a new run from them.
  const ModelShape s{2, 2, 32, 256, 16};
  std::vector<std::vector<float>> units;
  for (const auto& u : layer_units(s)) units.emplace_back(static_cast<std::size_t>(u.params));
  const std::string file = (t.path / "m.safetensors").string();
  TrainHooks h;
  const std::string ck = (t.path / "ck" / "step-00000004").string();
  ASSERT_TRUE(fs::exists(ck));
  load_checkpoint(ck, s, [&](std::size_t u, const float* master, const float*, const float*) {
    std::copy(master, master + units[u].size(), units[u].begin());
  });
  write_gpt2_safetensors(file, s, units, StDtype::f32);
  const TrainResult second =
      train(parse_config(cfg, {"model.init_from=\"" + file + "\"", "train.checkpoint_dir=\"\"", "train.steps=1"}), h);
  EXPECT_EQ(second.first_val_loss, first.val_loss);  // the same weights, the same validation windows
}

// model.init_from must hold exactly the model's tensors: a file of another depth or width is refused
// before anything is loaded, naming the tensors and the likely fix; a directory is one clear line.
TEST(Safetensors, InitFromChecksTheTensorSetBeforeLoading) {
  TempDir t("st");
  auto write = [&](const ModelShape& s, const std::string& name) {
    std::vector<std::vector<float>> units;
    for (const auto& u : layer_units(s)) units.emplace_back(static_cast<std::size_t>(u.params), 0.01f);
    const std::string file = (t.path / name).string();
    write_gpt2_safetensors(file, s, units, StDtype::f32);
    return file;
  };
  const ModelShape three{3, 2, 32, 256, 16};
  auto message = [&](const std::string& file) {
    try {
      check_gpt2_tensor_set(read_safetensors(file), file, three);
    } catch (const ConfigError& e) {
      return std::string(e.what()) + " ---> " + e.hint();
    }
    return std::string("accepted");
  };
  EXPECT_EQ(message(write(three, "same.safetensors")), "accepted");
  std::string m = message(write({4, 2, 32, 256, 16}, "deeper.safetensors"));
  EXPECT_NE(m.find("tensor(s) the model has no place for: h.3."), std::string::npos) << m;
  EXPECT_NE(m.find("set model.n_layer to 4"), std::string::npos) << m;
  m = message(write({2, 2, 32, 256, 16}, "shallower.safetensors"));
  EXPECT_NE(m.find("tensor(s) the model needs are missing: h.2."), std::string::npos) << m;
  EXPECT_NE(m.find("set model.n_layer to 2"), std::string::npos) << m;
  m = message(write({3, 2, 64, 256, 16}, "wider.safetensors"));
  EXPECT_NE(m.find("tensor wte.weight has shape [256, 64], the model needs [256, 32]"), std::string::npos) << m;
  try {
    read_safetensors(t.path.string());
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(": is a directory"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace zinf
