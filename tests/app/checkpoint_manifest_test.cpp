// checkpoint_manifest_test.cpp — a corrupt checkpoint manifest (a key missing, a value of the wrong
// type or out of range) is one zinf::Error naming manifest.json, from every reader of checkpoints;
// the resume path passes over such a checkpoint with that reason instead of stopping (or picking one
// that then fails to load); and no reader
// hands back a model shape nobody could build. (Inputs the fuzzer in tests/fuzz found.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "app/config/config.h"
#include "app/train/checkpoint.h"
#include "common/error_of.h"
#include "model/shape.h"
#include "zinf/error.h"

namespace zinf {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const ModelShape kShape{1, 2, 8, 16, 4};

class Manifest : public ::testing::Test {
 protected:
  fs::path root = fs::temp_directory_path() / ("zinf-manifest-test-" + std::to_string(::getpid()));
  std::string path;  // the one checkpoint
  json original;

  void SetUp() override {
    const Config c = parse_config(R"({"train_batch_size": 2, "train_micro_batch_size_per_gpu": 2,
        "model": {"n_layer": 1, "n_head": 2, "d_model": 8, "vocab_size": 16, "seq_len": 4}})");
    CheckpointState st;
    st.step = 3, st.opt_steps = 3, st.rows_drawn = 6;  // a consistent state: three steps of two rows
    CheckpointDir dir(root.string(), 1, kShape, nullptr);
    path = dir.save(c, st, [](std::size_t u, float* master, float* m, float* v) {
      const auto n = static_cast<std::size_t>(layer_units(kShape)[u].params);
      for (std::size_t i = 0; i < n; ++i) master[i] = 0.25f * static_cast<float>(i), m[i] = 0, v[i] = 1;
    });
    std::ifstream in(path + "/manifest.json");
    original = json::parse(in);
  }
  void TearDown() override { fs::remove_all(root); }

  void write(const json& j) const { std::ofstream(path + "/manifest.json") << j.dump(); }
  // The manifest with `edit` applied, as a format-version-1 manifest (no checksum of its own), so that
  // the edit reaches the readers behind the manifest's checksum; a checksummed manifest with any edit
  // fails that checksum first (checkpoint_test covers it).
  json edited(const std::function<void(json&)>& edit) const {
    json j = original;
    j["version"] = 1;
    j.erase("manifest_xxh64");
    edit(j);
    return j;
  }
};

TEST_F(Manifest, AManifestWithoutItsModelIsOneErrorAndResumePassesItOver) {
  write(edited([](json& j) { j.erase("model"); }));
  const std::string why = test::error_of<Error>([&] { verify_checkpoint(path, kShape); });
  EXPECT_NE(why.find(path + "/manifest.json: corrupt manifest (key 'model' not found)"), std::string::npos) << why;
  EXPECT_EQ(why.find("json.exception"), std::string::npos) << why;  // zinf's words, not the library's tag
  const ResumeChoice r = choose_checkpoint(root.string(), "latest", kShape);
  EXPECT_EQ(r.path, "");
  ASSERT_EQ(r.corrupt.size(), 1u);
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_NE(r.notes[0].find("manifest.json"), std::string::npos) << r.notes[0];
}

TEST_F(Manifest, MistypedOrImpossibleValuesAreOneErrorNamingTheManifest) {
  const std::vector<std::pair<const char*, std::function<void(json&)>>> cases = {
      {"model.n_layer as a string", [](json& j) { j["model"]["n_layer"] = "1"; }},
      {"model.n_head 0", [](json& j) { j["model"]["n_head"] = 0; }},
      {"model.d_model 1e300", [](json& j) { j["model"]["d_model"] = 1e300; }},
      {"model.n_head not dividing d_model", [](json& j) { j["model"]["n_head"] = 3; }},
      {"llama family without n_kv_head", [](json& j) { j["model"]["family"] = "llama"; }},
      {"tensors an object",
       [](json& j) {
         j["tensors"] = json::object({{"a", 1}, {"b", 2}, {"c", 3}});
       }},
      {"states_bytes 1e300", [](json& j) { j["states_bytes"] = 1e300; }},
      {"a tensor's offset 1e300", [](json& j) { j["tensors"][0]["offset"] = 1e300; }},
      {"a tensor's offset past the file", [](json& j) { j["tensors"][0]["offset"] = std::uint64_t{1} << 62; }},
      {"a tensor without a checksum", [](json& j) { j["tensors"][1].erase("xxh64"); }},
      {"step 1e300", [](json& j) { j["step"] = 1e300; }},
      {"scaler.hysteresis beyond an int", [](json& j) { j["scaler"]["hysteresis"] = std::int64_t{1} << 40; }},
      {"scaler not an object", [](json& j) { j["scaler"] = 5; }},
      {"version 1e300", [](json& j) { j["version"] = 1e300; }},
      {"a manifest that is an array",
       [](json& j) {
         j = json::array({1, 2});
       }},
  };
  for (const auto& [name, edit] : cases) {
    SCOPED_TRACE(name);
    write(edited(edit));
    const std::string why = test::error_of<Error>([&] {
      (void)checkpoint_shape(path);
      (void)load_checkpoint(path, kShape, [](std::size_t, const float*, const float*, const float*) {});
    });
    EXPECT_NE(why.find("checkpoint " + path + "/"), std::string::npos)
        << why;  // manifest.json, or states.bin for the offset
    EXPECT_EQ(why.find("json.exception"), std::string::npos) << why;
    EXPECT_EQ(choose_checkpoint(root.string(), "latest", kShape).path, "");
  }
  write(original);  // and the untouched manifest still loads
  EXPECT_EQ(load_checkpoint(path, kShape, [](std::size_t, const float*, const float*, const float*) {}).step, 3);
}

}  // namespace
}  // namespace zinf
