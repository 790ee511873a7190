// config_fuzz_test.cpp — random, truncated and mutated JSON never crashes the config reader: every
// input either parses or raises zinf::ConfigError (never another exception, never a signal).
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <sstream>

#include "app/config/config.h"
#include "zinf/error.h"

namespace zinf {
namespace {

std::string read_file(const std::string& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  std::string s = ss.str();
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  return s;
}

// Returns 1 if parsed, 0 if a ConfigError; fails the test on anything else.
int try_parse(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse_config(text, overrides, "fuzz");
    return 1;
  } catch (const ConfigError&) {
    return 0;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "unexpected exception type: " << e.what() << "\ninput: " << text.substr(0, 200);
    return 0;
  }
}

const std::string kSeeds[] = {
    read_file(std::string(ZINF_SOURCE_DIR) + "/configs/gpt2-124m-cpu.json"),
    read_file(std::string(ZINF_SOURCE_DIR) + "/configs/13b-nvme.json"),
    read_file(std::string(ZINF_SOURCE_DIR) + "/configs/hf-zero3-auto.json"),
};

TEST(ConfigFuzz, EveryTruncationIsHandled) {
  for (const auto& seed : kSeeds) {
    ASSERT_FALSE(seed.empty());
    EXPECT_EQ(try_parse(seed), 1);
    int parsed = 0;
    for (std::size_t n = 0; n < seed.size(); ++n) parsed += try_parse(seed.substr(0, n));
    EXPECT_EQ(parsed, 0);  // no strict prefix of an object is a complete object
  }
}

TEST(ConfigFuzz, RandomMutationsAreHandled) {
  std::mt19937 rng(12345);
  const std::string alphabet = "{}[]\":,0123456789.eE+-truefalsnl \"auto\"abcxyz_";
  int parsed = 0, total = 0;
  for (const auto& seed : kSeeds) {
    for (int i = 0; i < 1500; ++i) {
      std::string s = seed;
      int edits = 1 + static_cast<int>(rng() % 4);
      for (int k = 0; k < edits; ++k) {
        std::size_t pos = rng() % s.size();
        switch (rng() % 3) {
          case 0: s[pos] = alphabet[rng() % alphabet.size()]; break;
          case 1: s.erase(pos, 1 + rng() % 8); break;
          default: s.insert(pos, 1, alphabet[rng() % alphabet.size()]); break;
        }
        if (s.empty()) s = "{";
      }
      parsed += try_parse(s);
      ++total;
    }
  }
  EXPECT_LT(parsed, total);  // the mutations really do produce bad input
}

TEST(ConfigFuzz, RandomBytesAndValuesAreHandled) {
  std::mt19937 rng(777);
  for (int i = 0; i < 2000; ++i) {
    std::string s(rng() % 64, '\0');
    for (auto& ch : s) ch = static_cast<char>(rng() % 256);
    try_parse(s);
  }
  // Well-formed JSON with hostile values in every key zinf reads.
  const char* values[] = {"null", "true", "-1", "1e400", "1e18", "\"auto\"", "\"\"", "[]", "{}", "0", "0.5", "\"x\""};
  const char* keys[] = {"train_batch_size",
                        "fp16.enabled",
                        "fp16.loss_scale",
                        "zero_optimization.stage",
                        "zero_optimization.offload_optimizer.device",
                        "zero_optimization.sub_group_size",
                        "optimizer.params.betas",
                        "optimizer.type",
                        "scheduler.type",
                        "aio.block_size",
                        "model.n_head",
                        "model.d_model",
                        "device.memory_budget",
                        "train.steps",
                        "bf16"};
  for (const char* k : keys)
    for (const char* v : values) try_parse(R"({"train_batch_size": 8})", {std::string(k) + "=" + v});
}

// nlohmann reports a number beyond a double as out_of_range, not as a parse error; it must still be
// one ConfigError line naming the file, not the library's exception.
TEST(ConfigFuzz, ANumberTooLargeForADoubleIsAConfigError) {
  try {
    parse_config(R"({"train_batch_size": 8, "gradient_clipping": 1e400})", {}, "big.json");
    FAIL() << "1e400 was accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), "big.json: invalid JSON: number overflow parsing '1e400'");
  }
}

// An override is taken as a string when it is not JSON, bypassing the parser's UTF-8 check; bytes
// that are not UTF-8 then made nlohmann throw type_error.316 when zinf showed or stored the value.
TEST(ConfigFuzz, AnOverrideThatIsNotUtf8IsAConfigError) {
  for (const std::string item : {"data.path=caf\xe9.txt", "model.n_layer=\xf6", "model.\xff=1"}) {
    try {
      parse_config(R"({"train_batch_size": 8})", {item}, "o.json");
      ADD_FAILURE() << "accepted " << item;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("not valid UTF-8"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace zinf
