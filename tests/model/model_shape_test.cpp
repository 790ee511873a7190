// model_shape_test.cpp — exact parameter counts against published figures and a per-tensor sum; the
// layout of the LM head's logits buffers in the model's activation buffers.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <memory>

#include "model/lm.h"
#include "model/shape.h"

namespace zinf {
namespace {

// Sum of the GPT-2 tensors one by one (wte, wpe, per block: ln_1 w/b, c_attn w/b, c_proj w/b, ln_2
// w/b, c_fc w/b, mlp c_proj w/b; ln_f w/b), written independently of model/shape.cpp's closed form.
std::int64_t gpt2_tensor_sum(const ModelShape& s) {
  const std::int64_t C = s.d_model;
  std::int64_t block = 0;
  block += C + C;              // ln_1
  block += C * 3 * C + 3 * C;  // c_attn
  block += C * C + C;          // attn.c_proj
  block += C + C;              // ln_2
  block += C * 4 * C + 4 * C;  // c_fc
  block += 4 * C * C + C;      // mlp.c_proj
  return std::int64_t{s.vocab_size} * C + std::int64_t{s.seq_len} * C + s.n_layer * block + 2 * C;
}

// Sum of a Hugging Face Llama checkpoint's tensors (embed_tokens; per layer input_layernorm, q/k/v/o
// projections with Qwen2's q/k/v biases, post_attention_layernorm, gate/up/down projections; norm;
// lm_head unless tied).
std::int64_t llama_tensor_sum(const ModelShape& s) {
  const std::int64_t C = s.d_model, D = C / s.n_head, KV = s.kv_heads(), F = s.d_ff, V = s.vocab_size;
  std::int64_t layer = C;                            // input_layernorm
  layer += C * C + KV * D * C + KV * D * C + C * C;  // q, k, v, o
  if (s.qkv_bias) layer += C + KV * D + KV * D;
  layer += C;                      // post_attention_layernorm
  layer += F * C + F * C + C * F;  // gate, up, down
  return V * C + s.n_layer * layer + C + (s.tie_embeddings ? 0 : V * C);
}

std::int64_t tensor_sum(const ModelShape& s) {
  return s.family == ModelFamily::gpt2 ? gpt2_tensor_sum(s) : llama_tensor_sum(s);
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

TEST(ModelShape, LlamaFamilyPresetsMatchPublishedCounts) {
  // The Hugging Face checkpoints' parameter counts.
  EXPECT_EQ(count_params(find_model_preset("llama-3.2-1b").shape), 1'235'814'400);  // tied head
  EXPECT_EQ(count_params(find_model_preset("llama-3.1-8b").shape), 8'030'261'248);
  EXPECT_EQ(count_params(find_model_preset("mistral-7b").shape), 7'241'732'096);
  EXPECT_EQ(count_params(find_model_preset("qwen2.5-7b").shape), 7'615'616'512);  // with q/k/v biases
  EXPECT_NEAR(count_params(find_model_preset("llama-2-13b").shape) / 1e9, 13.0, 0.1);
  EXPECT_NEAR(count_params(find_model_preset("llama-3.1-70b").shape) / 1e9, 70.6, 0.1);
  EXPECT_NEAR(count_params(find_model_preset("tinyllama-1.1b").shape) / 1e9, 1.1, 0.05);
}

TEST(ModelShape, Gpt3PresetsAreInTheirNamedRange) {
  EXPECT_NEAR(count_params(find_model_preset("2.7b").shape) / 1e9, 2.7, 0.15);
  EXPECT_NEAR(count_params(find_model_preset("6.7b").shape) / 1e9, 6.7, 0.3);
  EXPECT_NEAR(count_params(find_model_preset("13b").shape) / 1e9, 13, 0.5);
  EXPECT_NEAR(count_params(find_model_preset("30b").shape) / 1e9, 30, 1.0);
  EXPECT_NEAR(count_params(find_model_preset("66b").shape) / 1e9, 66, 1.5);
  EXPECT_NEAR(count_params(find_model_preset("175b").shape) / 1e9, 175, 3.0);
}

// The probs and dlogits views the model takes (ViewCursor::take_logits): rows V apart where the
// backend keeps them packed; where it pads them, rows a multiple of 64 elements apart and the view at
// a 256-byte offset, so that from an aligned allocation every row of a 16-bit buffer starts on a
// 128-byte boundary. The measuring cursor (null base) sizes the buffer for the same views.
TEST(ViewCursor, LogitsRowsArePaddedAndAlignedWhereTheBackendPadsThem) {
  constexpr std::size_t R = 6;
  constexpr int V = 50257, Vp = 50304;
  for (const DType S : {DType::bf16, DType::fp32})
    for (const LogitsRows rows : {LogitsRows::packed, LogitsRows::padded}) {
      SCOPED_TRACE(std::string(to_string(S)) + (rows == LogitsRows::padded ? " padded" : " packed"));
      const auto lay = [&](ViewCursor& c) {
        c.take(3);  // what the model takes before: a few odd-sized views
        c.take_fp32(5);
        return c.take_logits(R, V, rows);
      };
      ViewCursor measure(nullptr, S);
      lay(measure);
      const std::size_t bytes = measure.bytes();
      std::unique_ptr<char, decltype(&std::free)> mem(
          static_cast<char*>(std::aligned_alloc(kLogitsAlignBytes, (bytes + 255) / 256 * 256)), &std::free);
      ViewCursor c(mem.get(), S);
      const TensorView logits = lay(c);
      EXPECT_EQ(c.bytes(), bytes);
      const auto offset = static_cast<std::size_t>(static_cast<char*>(logits.data()) - mem.get());
      EXPECT_LE(offset + logits.numel() * dtype_bytes(S), bytes);
      if (rows == LogitsRows::packed) {
        EXPECT_EQ(logits.numel(), R * V);
        continue;
      }
      EXPECT_EQ(logits.numel(), R * Vp);
      EXPECT_EQ(offset % kLogitsAlignBytes, 0u);
      for (std::size_t r = 0; r < R; ++r)
        EXPECT_EQ(reinterpret_cast<std::uintptr_t>(static_cast<char*>(logits.data()) + r * Vp * dtype_bytes(S)) % 128,
                  0u)
            << "row " << r;
    }
}

}  // namespace
}  // namespace zinf
