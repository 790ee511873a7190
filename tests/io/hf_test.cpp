// hf_test.cpp — Hugging Face folders of the llama family, without downloads: tiny Llama-shaped models
// written here (one file and sharded, in each dtype), read back tensor by tensor with Hugging Face's
// [out, in] layout transposed, the shape taken from config.json, training started from them, and
// `zinf export --format hf` writing the same bytes back.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/random_floats.h"
#include "app/config/config.h"
#include "app/train/checkpoint.h"
#include "app/train/train.h"
#include "common/temp_dir.h"
#include "hf_units.h"
#include "io/hf.h"
#include "zinf/cpu_adam/convert.h"
#include "zinf/error.h"

namespace zinf {
namespace {

namespace fs = std::filesystem;

using test::random_units;
using test::slurp;
using test::TempDir;

ModelShape tiny(bool tied, bool bias) {
  ModelShape s{2, 4, 32, 256, 16};
  s.family = ModelFamily::llama;
  s.n_kv_head = 2, s.d_ff = 40, s.tie_embeddings = tied, s.qkv_bias = bias, s.norm_eps = 1e-5, s.rope_theta = 10000;
  s.max_positions = 64;
  return s;
}

TEST(HfFolders, WriteReadAndWriteAgainIsByteIdenticalInEveryDtypeAndSharding) {
  TempDir t("hf-test");
  for (StDtype dt : {StDtype::f32, StDtype::f16, StDtype::bf16})
    for (bool tied : {true, false})
      for (std::uint64_t shard : {std::uint64_t{1} << 30, std::uint64_t{8000}}) {  // one file; many shards
        SCOPED_TRACE(::testing::Message()
                     << "dtype " << static_cast<int>(dt) << " tied " << tied << " shard " << shard);
        const ModelShape s = tiny(tied, !tied);
        const auto units = random_units(s, dt, 7, 0.05f);
        const std::string a = t / "a", b = t / "b";
        fs::remove_all(a), fs::remove_all(b);
        write_hf_folder(a, s, units, dt, shard);
        EXPECT_EQ(fs::exists(fs::path(a) / "model.safetensors.index.json"), shard < (1u << 20));
        // The shape comes back from config.json.
        const ModelShape h = hf_shape(a, 16);
        ModelShape want = s;  // the folder now names its model type
        want.hf.model_type = s.qkv_bias ? "qwen2" : "llama";
        EXPECT_EQ(h, want);
        HfModelReader r(a);
        r.check(s);
        std::vector<std::vector<float>> back;
        for (std::size_t u = 0; u < units.size(); ++u) {
          back.emplace_back(units[u].size(), -1.0f);
          r.load_unit(s, u, back.back().data());
          ASSERT_EQ(back.back(), units[u]) << "unit " << u;  // every value in its place, transposes undone
        }
        write_hf_folder(b, s, back, dt, shard);
        for (const auto& e : fs::directory_iterator(a))
          EXPECT_EQ(slurp((fs::path(b) / e.path().filename()).string()), slurp(e.path().string()))
              << e.path().filename();
      }
}

TEST(HfFolders, TheLayoutIsHuggingFacesOutByIn) {
  TempDir t("hf-test");
  const ModelShape s = tiny(false, true);
  auto units = random_units(s, StDtype::f32, 7, 0.05f);
  write_hf_folder(t / "m", s, units, StDtype::f32);
  const StFile f = read_safetensors(t / "m/model.safetensors");
  const StTensor* q = f.find("model.layers.1.self_attn.q_proj.weight");
  const StTensor* k = f.find("model.layers.0.self_attn.k_proj.weight");
  const StTensor* down = f.find("model.layers.0.mlp.down_proj.weight");
  ASSERT_TRUE(q && k && down && f.find("lm_head.weight") && f.find("model.layers.0.self_attn.v_proj.bias"));
  EXPECT_EQ(k->shape, (std::vector<std::int64_t>{16, 32}));     // [KV·D out, C in]
  EXPECT_EQ(down->shape, (std::vector<std::int64_t>{32, 40}));  // [C out, F in]
  // q_proj.weight[o][i] is the unit's wq[i][o] (wq after attn_norm, at offset C in block 1).
  const float* file = reinterpret_cast<const float*>(f.bytes.data() + f.data_start + q->begin);
  const float* wq = units[2].data() + 32;
  for (int o = 0; o < 32; o += 7)
    for (int i = 0; i < 32; i += 5) ASSERT_EQ(file[o * 32 + i], wq[i * 32 + o]) << o << "," << i;
}

TEST(HfFolders, AConfigPointedAtAFolderTakesItsShapeAndTrainsFromItsWeights) {
  TempDir t("hf-test");
  const ModelShape s = tiny(false, false);
  const auto units = random_units(s, StDtype::bf16, 7, 0.05f);
  write_hf_folder(t / "m", s, units, StDtype::bf16, 8000);
  const std::string cfg = R"({"model": {"init_from": ")" + (t / "m") + R"(", "seq_len": 16},
      "train": {"steps": 0, "eval_batches": 2, "checkpoint_dir": ")" +
                          (t / "ck") + R"("},
      "device": {"type": "cpu", "memory_budget": "256MiB", "threads": 1}, "train_micro_batch_size_per_gpu": 2,
      "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}})";
  const Config c = parse_config(cfg);
  EXPECT_EQ(model_shape(c.model), [&] {
    ModelShape w = s;
    w.seq_len = 16;
    w.hf.model_type = "llama";
    return w;
  }());
  // train.steps 0: the parameters are exactly the folder's (the digest hashes every unit in order).
  std::uint64_t h = fnv1a64(nullptr, 0);
  for (const auto& u : units) h = fnv1a64(u.data(), u.size() * 4, h);
  char want[17];
  std::snprintf(want, sizeof want, "%016llx", static_cast<unsigned long long>(h));
  EXPECT_EQ(train(c, TrainHooks{}).params_digest, want);
  // And it trains: two steps with a checkpoint, which `zinf export --format hf` writes back as a folder.
  const TrainResult r = train(parse_config(cfg, {"train.steps=2"}), TrainHooks{});
  EXPECT_EQ(r.steps, 2);
  const std::string cmd = std::string(ZINF_BIN) + " export --format hf --dtype fp32 --shard-size 8000 --checkpoint " +
                          (t / "ck/step-00000002") + " -o " + (t / "out") + " > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  ASSERT_TRUE(fs::exists(t / "out/model.safetensors.index.json"));
  // `zinf eval --checkpoint` takes the model from the checkpoint, as export does: a config without
  // model.init_from evaluates it, and gets the loss the run ended with.
  std::ofstream(t / "eval.json") << R"({"train": {"eval_batches": 2},
      "device": {"type": "cpu", "memory_budget": "256MiB", "threads": 1}, "train_micro_batch_size_per_gpu": 2})";
  const std::string eval = std::string(ZINF_BIN) + " eval --json --config " + (t / "eval.json") + " --checkpoint " +
                           (t / "ck/step-00000002") + " > " + (t / "eval.out") + " 2>&1";
  ASSERT_EQ(std::system(eval.c_str()), 0) << slurp(t / "eval.out");
  const std::string eval_out = slurp(t / "eval.out");
  const auto brace = eval_out.find("{\n");
  ASSERT_NE(brace, std::string::npos) << eval_out;
  EXPECT_EQ(nlohmann::json::parse(eval_out.substr(brace))["val_loss"].get<double>(), r.val_loss) << eval_out;
  HfModelReader back(t / "out");
  const ModelShape bs = hf_shape(t / "out", 16);
  back.check(bs);
  std::vector<std::vector<float>> masters(units.size());
  load_checkpoint(t / "ck/step-00000002", bs, [&](std::size_t u, const float* m, const float*, const float*) {
    masters[u].assign(m, m + units[u].size());
  });
  for (std::size_t u = 0; u < units.size(); ++u) {
    std::vector<float> got(units[u].size());
    back.load_unit(bs, u, got.data());
    EXPECT_EQ(got, masters[u]) << "unit " << u;
  }
}

// A folder's model type, window and rotary settings live in the checkpoint's manifest, so an export
// of a run started from a Mistral folder is a Mistral folder again, in the source's config format.
TEST(HfFolders, ACheckpointOfAFolderExportsItsModelTypeWindowAndRotaryFormat) {
  for (const bool legacy : {false, true}) {
    SCOPED_TRACE(legacy ? "rope_theta and rope_scaling" : "rope_parameters");
    TempDir t("hf-test");
    const ModelShape s = tiny(false, false);
    write_hf_folder(t / "m", s, random_units(s, StDtype::f32, 7, 0.05f), StDtype::f32);
    nlohmann::json c = nlohmann::json::parse(slurp(t / "m/config.json"));
    const nlohmann::json yarn = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 16},
                                 {"beta_fast", 8.0}, {"beta_slow", 1.0}, {"truncate", false}};
    c.erase("rope_parameters"), c.erase("rope_scaling"), c.erase("rope_theta"), c.erase("attention_bias");
    c.erase("mlp_bias");
    c["model_type"] = "mistral", c["architectures"] = {"MistralForCausalLM"},
    c["sliding_window"] = 8;  // trains windowed
    if (legacy) {
      c["rope_theta"] = 500.0, c["rope_scaling"] = yarn;
    } else {
      c["rope_parameters"] = yarn;
      c["rope_parameters"]["rope_theta"] = 500.0;
    }
    std::ofstream(t / "m/config.json") << c.dump();
    const std::string cfg = R"({"model": {"init_from": ")" + (t / "m") + R"(", "seq_len": 16},
        "train": {"steps": 1, "eval_batches": 1, "checkpoint_dir": ")" + (t / "ck") + R"("},
        "device": {"type": "cpu", "memory_budget": "256MiB", "threads": 1}, "train_micro_batch_size_per_gpu": 2})";
    train(parse_config(cfg), TrainHooks{});
    const std::string cmd = std::string(ZINF_BIN) + " export --format hf --checkpoint " + (t / "ck/step-00000001") +
                            " -o " + (t / "out") + " > /dev/null";
    ASSERT_EQ(std::system(cmd.c_str()), 0);
    const nlohmann::json e = nlohmann::json::parse(slurp(t / "out/config.json"));
    EXPECT_EQ(e["architectures"], nlohmann::json({"MistralForCausalLM"})) << e.dump();
    EXPECT_EQ(e["model_type"], "mistral");
    EXPECT_EQ(e["sliding_window"], 8);
    EXPECT_EQ(e.contains("rope_parameters"), !legacy) << e.dump();
    EXPECT_EQ(e.contains("rope_scaling"), legacy) << e.dump();
    const nlohmann::json& r = legacy ? e["rope_scaling"] : e["rope_parameters"];
    for (const auto& [k, v] : yarn.items()) EXPECT_EQ(r[k], v) << k << ": " << r.dump();
    EXPECT_EQ(legacy ? e["rope_theta"] : r["rope_theta"], 500.0);
    EXPECT_EQ(hf_shape(t / "out", 16), hf_shape(t / "m", 16));
    // The window masks (8 < seq_len 16): resuming under another masking window is refused.
    c["sliding_window"] = 4;
    std::ofstream(t / "m/config.json") << c.dump();
    TrainHooks resume;
    resume.resume = "latest";
    try {
      train(parse_config(cfg), resume);
      ADD_FAILURE() << "resumed under another sliding window";
    } catch (const IncompatibleCheckpoint& refused) {
      EXPECT_NE(std::string(refused.what()).find("model shape differs"), std::string::npos) << refused.what();
    }
  }
}

TEST(HfFolders, WhatZinfCannotHonourIsOneErrorNamingTheKeyOrTensor) {
  TempDir t("hf-test");
  const ModelShape s = tiny(true, false);
  write_hf_folder(t / "m", s, random_units(s, StDtype::f32, 7, 0.05f), StDtype::f32);
  auto patch = [&](const std::function<void(nlohmann::json&)>& f) {
    nlohmann::json c = nlohmann::json::parse(slurp(t / "m/config.json"));
    f(c);
    std::ofstream(t / "m/config.json") << c.dump();
  };
  auto error = [&](const std::string& extra = "") {
    try {
      parse_config(R"({"train_batch_size": 2, "model": {"init_from": ")" + (t / "m") + "\"" + extra + "}}");
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(error(), "accepted");
  EXPECT_NE(error(R"(, "n_layer": 3)").find("model.n_layer: the shape comes from"), std::string::npos);
  EXPECT_NE(error(R"(, "preset": "llama-3.2-1b")").find("model.preset: 'llama-3.2-1b' does not match"),
            std::string::npos);
  patch([](nlohmann::json& c) { c["hidden_act"] = "gelu"; });
  EXPECT_NE(error().find("config.json: hidden_act: \"gelu\" is not silu"), std::string::npos) << error();
  patch([](nlohmann::json& c) { c["hidden_act"] = "silu", c["model_type"] = "gpt_neox"; });
  EXPECT_NE(error().find("config.json: model_type: 'gpt_neox' is not a family zinf trains"), std::string::npos)
      << error();
  patch([](nlohmann::json& c) {
    c["model_type"] = "llama", c["rope_scaling"] = {{"rope_type", "mrope"}, {"factor", 4}};
    c.erase("rope_parameters");
  });
  EXPECT_NE(error().find("config.json: rope_scaling.rope_type: 'mrope' is not supported"), std::string::npos)
      << error();
  // Numbers past the shape limits are refused from config.json itself, before anything is sized.
  patch([](nlohmann::json& c) { c["rope_scaling"] = nullptr, c["num_hidden_layers"] = 1000000000; });
  EXPECT_NE(error().find("config.json: num_hidden_layers: expected a positive integer of at most 4096, got 1000000000"),
            std::string::npos)
      << error();
  patch([](nlohmann::json& c) { c["num_hidden_layers"] = 2, c["vocab_size"] = 18446744073709551615ull; });
  EXPECT_NE(error().find("config.json: vocab_size: expected a positive integer of at most 16777216"), std::string::npos)
      << error();
  patch([&](nlohmann::json& c) { c["vocab_size"] = s.vocab_size, c["hidden_size"] = -8; });
  EXPECT_NE(error().find("config.json: hidden_size: expected a positive integer"), std::string::npos) << error();
  patch([&](nlohmann::json& c) { c["hidden_size"] = s.d_model, c["num_hidden_layers"] = 3; });  // the files hold 2 layers
  try {
    HfModelReader(t / "m").check(hf_shape(t / "m", 16));
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("tensor(s) the model needs are missing: model.layers.2."), std::string::npos)
        << e.what();
  }
}

// Qwen2's windowed layers: those from max_window_layers on, or those layer_types names
// sliding_attention (the last ones); an export writes them back so that the folder reads the same.
TEST(HfFolders, Qwen2WindowedLayersComeFromMaxWindowLayersOrLayerTypes) {
  const nlohmann::json base = {{"model_type", "qwen2"},      {"hidden_size", 64},
                               {"intermediate_size", 96},    {"num_attention_heads", 4},
                               {"num_key_value_heads", 2},   {"num_hidden_layers", 4},
                               {"vocab_size", 256},          {"max_position_embeddings", 128},
                               {"use_sliding_window", true}, {"sliding_window", 8},
                               {"max_window_layers", 2}};
  auto shape = [](const nlohmann::json& c) { return hf_shape_from_json(c.dump(), "/m/config.json", 64); };
  const ModelShape a = shape(base);
  EXPECT_EQ(a.sliding_window, 8);
  EXPECT_EQ(a.window_from, 2);
  EXPECT_EQ(a.layer_window(1), 0);
  EXPECT_EQ(a.layer_window(2), 8);
  nlohmann::json lt = base;
  lt["layer_types"] = {"full_attention", "full_attention", "full_attention", "sliding_attention"};
  const ModelShape b = shape(lt);
  EXPECT_EQ(b.window_from, 3);
  EXPECT_EQ(b.layer_window(2), 0);
  EXPECT_EQ(b.layer_window(3), 8);
  nlohmann::json off = base;
  off["use_sliding_window"] = false;
  EXPECT_EQ(shape(off).layer_window(3), 0);
  nlohmann::json gap = base;
  gap["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention", "sliding_attention"};
  try {
    shape(gap);
    FAIL() << "a full_attention layer after a sliding_attention one was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("layer_types: a full_attention layer after a sliding_attention one"),
              std::string::npos)
        << e.what();
  }
  TempDir t("hf-test");
  write_hf_folder(t / "m", b, random_units(b, StDtype::f32, 7, 0.05f), StDtype::f32);
  EXPECT_EQ(hf_shape(t / "m", 64), b);
}

// transformers 5's rope_parameters and transformers 4's rope_theta / rope_scaling give one shape;
// where a file holds both they must agree, and what zinf does not compute is refused by name.
TEST(HfFolders, RotarySettingsReadAlikeInBothFormats) {
  const nlohmann::json base = {{"model_type", "llama"},    {"hidden_size", 64},        {"intermediate_size", 96},
                               {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"num_hidden_layers", 2},
                               {"vocab_size", 256},        {"max_position_embeddings", 128}};
  auto shape = [](const nlohmann::json& c) { return hf_shape_from_json(c.dump(), "/m/config.json", 64); };
  auto refusal = [&](const nlohmann::json& c) {
    try {
      shape(c);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const nlohmann::json yarn = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32}};
  nlohmann::json v5 = base, v4 = base, both = base;
  v5["rope_parameters"] = yarn, v5["rope_parameters"]["rope_theta"] = 500000.0;
  v4["rope_theta"] = 500000.0, v4["rope_scaling"] = yarn;
  both["rope_parameters"] = v5["rope_parameters"], both["rope_theta"] = 500000.0, both["rope_scaling"] = yarn;
  ModelShape a = shape(v5), b = shape(v4), c = shape(both);
  EXPECT_EQ(a.rope.type, "yarn");
  EXPECT_EQ(a.rope_theta, 500000.0);
  EXPECT_EQ(a.rope_factor, 4.0);
  EXPECT_EQ(a.rope_original_max, 32.0);
  EXPECT_FALSE(a.hf.legacy_rope);
  EXPECT_TRUE(b.hf.legacy_rope);
  b.hf.legacy_rope = false;
  EXPECT_EQ(a, b);
  EXPECT_EQ(a, c);
  // Without any rotary key: theta 10000, no scaling. {"rope_type": "default"} is no scaling, too.
  EXPECT_EQ(shape(base).rope_theta, 10000.0);
  nlohmann::json d = base;
  d["rope_scaling"] = {{"rope_type", "default"}};
  EXPECT_EQ(shape(d).rope.type, "default");
  EXPECT_EQ(shape(d).rope_factor, 1.0);
  // The type under its older name, "type".
  d["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  EXPECT_EQ(shape(d).rope.type, "linear");
  const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> refused = {
      {[](nlohmann::json& j) { j["rope_theta"] = 10000.0; }, "rope_theta: 10000.0 disagrees with rope_parameters"},
      {[](nlohmann::json& j) { j["rope_scaling"] = {{"factor", 8.0}}; },
       "rope_scaling.factor: 8.0 disagrees with rope_parameters.factor 4.0"},
      {[](nlohmann::json& j) { j["rope_parameters"]["rope_type"] = "su"; }, "rope_parameters.rope_type: 'su' is not"},
      {[](nlohmann::json& j) { j["rope_parameters"]["mrope_section"] = {1, 2}; },
       "rope_parameters.mrope_section: is not a rotary setting zinf computes"},
      {[](nlohmann::json& j) { j["partial_rotary_factor"] = 0.5; }, "partial_rotary_factor: 0.5 is not supported"},
      {[](nlohmann::json& j) { j["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}}}}; },
       "rope_parameters.full_attention: rotary settings per layer type are not supported"},
      {[](nlohmann::json& j) { j["rope_parameters"] = {{"rope_type", "linear"}}; }, "rope_parameters.factor: missing"},
      {[](nlohmann::json& j) { j["rope_parameters"] = {{"rope_type", "longrope"}, {"short_factor", {1.0}}}; },
       "rope_parameters.short_factor: expected a list of 8 numbers"},
  };
  for (const auto& [patch, why] : refused) {
    nlohmann::json j = v5;
    patch(j);
    EXPECT_NE(refusal(j).find(why), std::string::npos) << j.dump() << ": " << refusal(j);
  }
}

// Every numeric field of config.json, mutated: out of range, the wrong type, or contradicting
// another field — each one ConfigError naming the file and the key, before anything is sized.
TEST(HfFolders, EveryNumericFieldOfConfigJsonIsCheckedBeforeUse) {
  const nlohmann::json llama = {{"model_type", "llama"},      {"hidden_size", 64},         {"intermediate_size", 96},
                                {"num_attention_heads", 4},   {"num_key_value_heads", 2},  {"num_hidden_layers", 2},
                                {"vocab_size", 256},          {"max_position_embeddings", 128},
                                {"rms_norm_eps", 1e-5},       {"rope_theta", 10000.0}};
  const nlohmann::json gpt2 = {{"model_type", "gpt2"}, {"n_embd", 64},      {"n_layer", 2},
                               {"n_head", 4},          {"vocab_size", 256}, {"n_positions", 128}};
  auto refusal = [](const nlohmann::json& c) {
    try {
      hf_shape_from_json(c.dump(), "/m/config.json", 0);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  ASSERT_EQ(refusal(llama), "accepted");
  ASSERT_EQ(refusal(gpt2), "accepted");
  const std::vector<nlohmann::json> bad_ints = {0, -1, 1.5, "8", true, nullptr, std::int64_t{1} << 40,
                                                18446744073709551615ull};
  for (const auto* base : {&llama, &gpt2})
    for (const auto& [key, value] : base->items()) {
      if (!value.is_number_integer()) continue;
      for (const nlohmann::json& v : bad_ints) {
        // null is "absent": these two have defaults (2048 positions; as many key/value heads as heads)
        if (v.is_null() && (key == "max_position_embeddings" || key == "num_key_value_heads")) continue;
        nlohmann::json c = *base;
        c[key] = v;
        const std::string e = refusal(c);
        EXPECT_EQ(e.rfind("/m/config.json: " + key + ":", 0), 0u) << key << " = " << v.dump() << ": " << e;
      }
    }
  for (const char* key : {"rms_norm_eps", "rope_theta"})
    for (const nlohmann::json& v : std::vector<nlohmann::json>{0, -1.0, "1e-5", true}) {
      nlohmann::json c = llama;
      c[key] = v;
      EXPECT_EQ(refusal(c).rfind(std::string("/m/config.json: ") + key + ":", 0), 0u) << key << " = " << v.dump();
    }
  // Contradictions between fields.
  const std::vector<std::pair<nlohmann::json, std::string>> contradictions = {
      {{{"hidden_size", 66}}, "hidden_size: not a multiple of num_attention_heads"},
      {{{"num_key_value_heads", 3}}, "num_key_value_heads: does not divide num_attention_heads"},
      {{{"head_dim", 32}}, "head_dim: 32 differs from hidden_size / num_attention_heads"},
      {{{"rms_norm_eps", 2}}, "rms_norm_eps: expected a small positive number"},
      {{{"num_attention_heads", 64}}, "the head width must be even"},
  };
  for (const auto& [patch, why] : contradictions) {
    nlohmann::json c = llama;
    c.update(patch);
    EXPECT_NE(refusal(c).find(why), std::string::npos) << patch.dump() << ": " << refusal(c);
  }
  nlohmann::json c = gpt2;
  c["n_embd"] = 66;
  EXPECT_NE(refusal(c).find("n_embd: not a multiple of n_head"), std::string::npos) << refusal(c);
  try {
    hf_shape_from_json(llama.dump(), "/m/config.json", 256);  // a sequence past the model's positions
    ADD_FAILURE() << "accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("max_position_embeddings is 128, below model.seq_len 256"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace zinf
