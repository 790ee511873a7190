// model_shape_test.cpp — exact parameter counts against published figures and a per-tensor sum.
#include <gtest/gtest.h>

#include "zinf/model.h"

namespace zinf {
namespace {

// Sum of the GPT-2 tensors one by one (wte, wpe, per block: ln_1 w/b, c_attn w/b, c_proj w/b, ln_2
// w/b, c_fc w/b, mlp c_proj w/b; ln_f w/b), written independently of model_shape.cpp's closed form.
std::int64_t tensor_sum(const ModelShape& s) {
  const std::int64_t C = s.d_model;
  std::int64_t block = 0;
  block += C + C;                  // ln_1
  block += C * 3 * C + 3 * C;      // c_attn
  block += C * C + C;              // attn.c_proj
  block += C + C;                  // ln_2
  block += C * 4 * C + 4 * C;      // c_fc
  block += 4 * C * C + C;          // mlp.c_proj
  return std::int64_t{s.vocab_size} * C + std::int64_t{s.seq_len} * C + s.n_layer * block + 2 * C;
}

TEST(ModelShape, Gpt2PresetsMatchPublishedCounts) {
  // HF's GPT-2 checkpoints (tied head): 124,439,808 / 354,823,168 / 774,030,080 / 1,557,611,200.
  EXPECT_EQ(count_params(find_model_preset("gpt2-124m").shape), 124'439'808);
  EXPECT_EQ(count_params(find_model_preset("gpt2-350m").shape), 354'823'168);
  EXPECT_EQ(count_params(find_model_preset("gpt2-774m").shape), 774'030'080);
  EXPECT_EQ(count_params(find_model_preset("gpt2-1.5b").shape), 1'557'611'200);
}

TEST(ModelShape, ClosedFormEqualsTensorSumAndUnitsSum) {
  for (const auto& p : model_presets()) {
    SCOPED_TRACE(p.name);
    EXPECT_EQ(count_params(p.shape), tensor_sum(p.shape));
    std::int64_t units = 0, largest = 0;
    for (const auto& u : layer_units(p.shape)) units += u.params, largest = std::max(largest, u.params);
    EXPECT_EQ(units, count_params(p.shape));
    EXPECT_EQ(largest, largest_unit_params(p.shape));
    EXPECT_EQ(layer_units(p.shape).size(), static_cast<std::size_t>(p.shape.n_layer) + 2);
    EXPECT_EQ(p.shape.d_model % p.shape.n_head, 0);
  }
}

TEST(ModelShape, Gpt3PresetsAreInTheirNamedRange) {
  EXPECT_NEAR(count_params(find_model_preset("2.7b").shape) / 1e9, 2.7, 0.15);
  EXPECT_NEAR(count_params(find_model_preset("6.7b").shape) / 1e9, 6.7, 0.3);
  EXPECT_NEAR(count_params(find_model_preset("13b").shape) / 1e9, 13, 0.5);
  EXPECT_NEAR(count_params(find_model_preset("30b").shape) / 1e9, 30, 1.0);
  EXPECT_NEAR(count_params(find_model_preset("66b").shape) / 1e9, 66, 1.5);
  EXPECT_NEAR(count_params(find_model_preset("175b").shape) / 1e9, 175, 3.0);
}

}  // namespace
}  // namespace zinf
