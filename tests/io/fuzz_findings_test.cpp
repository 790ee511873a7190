// fuzz_findings_test.cpp — inputs the libFuzzer targets in tests/fuzz found, kept as unit tests so the
// GCC suite holds the fixes too: each is bad input that must be one zinf error naming the file and
// the key, never a library exception, a crash or undefined behaviour. (The run config's and the
// checkpoint manifest's have their own files: config_fuzz_test, checkpoint_manifest_test.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include "common/temp_dir.h"
#include "io/hf.h"
#include "io/safetensors.h"
#include "zinf/error.h"

namespace zinf {
namespace {

namespace fs = std::filesystem;

using test::TempDir;

// hf_shape's message for `config_json`, or "accepted"; fails the test on any other exception.
std::string hf_shape_error(const std::string& config_json) {
  TempDir f("fuzz-findings");
  f.write("config.json", config_json);
  try {
    (void)hf_shape(f.path.string(), 16);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "accepted";
}

const std::string kLlama =
    R"("hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_hidden_layers": 2,
                              "vocab_size": 256, "max_position_embeddings": 64)";

TEST(FuzzFindings, HfConfigOfTheWrongShapeIsOneConfigError) {
  EXPECT_EQ(hf_shape_error(R"({"model_type": "llama", )" + kLlama + "}"), "accepted");
  // Not an object at all: nlohmann's value() threw type_error.306.
  EXPECT_NE(hf_shape_error("0").find("config.json: expected a JSON object, got number"), std::string::npos);
  EXPECT_NE(hf_shape_error(R"(["rope_scaling"])").find("got array"), std::string::npos);
  // model_type not a string: type_error.302.
  EXPECT_NE(hf_shape_error(R"({"model_type": 7, )" + kLlama + "}").find("model_type: expected a string, got 7"),
            std::string::npos);
  // rope_scaling a string, or its numbers strings: type_error.306 and .302.
  EXPECT_NE(hf_shape_error(R"({"model_type": "llama", "rope_scaling": "llama3", )" + kLlama + "}")
                .find("config.json: rope_scaling: expected an object or null, got \"llama3\""),
            std::string::npos);
  EXPECT_NE(hf_shape_error(R"({"model_type": "llama", "rope_scaling": {"rope_type": 3}, )" + kLlama + "}")
                .find("rope_scaling.rope_type: expected a string, got 3"),
            std::string::npos);
  EXPECT_NE(hf_shape_error(R"({"model_type": "llama", "rope_scaling": {"rope_type": "llama3", "factor": "8"}, )" +
                           kLlama + "}")
                .find("config.json: rope_scaling.factor: expected a number, got \"8\""),
            std::string::npos);
}

TEST(FuzzFindings, AHugeSlidingWindowIsNotReadAsAShortOne) {
  // 2^32 + 8 read as an int was 8: a window of four billion masking all but 8 keys.
  TempDir f("fuzz-findings");
  f.write("config.json", R"({"model_type": "mistral", "sliding_window": 4294967304, )" + kLlama + "}");
  const ModelShape huge = hf_shape(f.path.string(), 16);
  EXPECT_EQ(huge.sliding_window, std::numeric_limits<int>::max());
  EXPECT_EQ(huge.layer_window(0), 0) << "a window longer than the sequence masks nothing";
  f.write("config.json", R"({"model_type": "mistral", "sliding_window": 8, )" + kLlama + "}");
  EXPECT_EQ(hf_shape(f.path.string(), 16).layer_window(1), 8);
}

// A shape of 2^31 × 2^31 F32 needs 2^64 bytes, which wrapped to 0 and matched data_offsets [0, 0]:
// the file was accepted, and reading the tensor transposed walked 2^62 elements of an empty buffer.
TEST(FuzzFindings, ASafetensorsShapeWhoseByteCountWrapsIsRefused) {
  const std::string header = R"({"w":{"dtype":"F32","shape":[2147483648,2147483648],"data_offsets":[0,0]}})";
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i) file[static_cast<std::size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xFF);
  file += header;
  try {
    (void)parse_safetensors(file, "wrap.safetensors");
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "wrap.safetensors: invalid safetensors file: tensor w: shape overflows");
  }
}

}  // namespace
}  // namespace zinf
