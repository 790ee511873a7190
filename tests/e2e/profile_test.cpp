// profile_test.cpp — the op profiler behind `zinf bench step --profile`: every kind of op is
// counted with the right number of calls and FLOPs, on the synchronous CPU device (host clock) and
// the asynchronous one (timed stream events), and profiling leaves the math unchanged.
#include <gtest/gtest.h>

#include <algorithm>

#include "app/config/config.h"
#include "app/train/train.h"

namespace zinf {
namespace {

const char* kConfig = R"({"model": {"n_layer": 2, "n_head": 2, "d_model": 32, "vocab_size": 256, "seq_len": 16},
  "train": {"steps": 3, "eval_interval": 0, "eval_batches": 1, "seed": 3},
  "device": {"type": "cpu", "memory_budget": "256MiB", "threads": 1},
  "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "steps_per_print": 1000,
  "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}})";

const OpTime* find(const TrainResult& r, const std::string& name) {
  auto it = std::find_if(r.profile.begin(), r.profile.end(), [&](const OpTime& o) { return o.name == name; });
  return it == r.profile.end() ? nullptr : &*it;
}

TEST(OpProfile, CountsEveryKindWithItsWorkAndLeavesTheMathAlone) {
  const TrainResult plain = train(parse_config(kConfig), TrainHooks{});
  EXPECT_TRUE(plain.profile.empty());
  for (const char* async : {"false", "true"}) {
    TrainHooks h;
    h.profile = true;
    const TrainResult r = train(parse_config(kConfig, {std::string("device.async=") + async}), h);
    EXPECT_EQ(r.params_digest, plain.params_digest) << "async " << async;
    ASSERT_EQ(r.measured_steps, 2);
    // Per measured step: 2 layers × GA 2 × (forward + backward) of each block GEMM.
    const double R = 2 * 16, C = 32, L = 2, GA = 2, steps = 2;
    for (const auto& [name, out] :
         {std::pair{"gemm qkv", 3 * C}, std::pair{"gemm attn proj", C}, std::pair{"gemm mlp up", 4 * C}}) {
      const OpTime* o = find(r, name);
      ASSERT_NE(o, nullptr) << name;
      EXPECT_EQ(o->calls, static_cast<std::int64_t>(2 * L * GA * steps)) << name;
      EXPECT_DOUBLE_EQ(o->flops, (2 + 4) * R * C * out * L * GA * steps)
          << name;  // 2·R·IC·OC forward, twice that backward
      EXPECT_GT(o->seconds, 0.0) << name;
    }
    const OpTime* down = find(r, "gemm mlp down");
    ASSERT_NE(down, nullptr);
    EXPECT_DOUBLE_EQ(down->flops, 6 * R * 4 * C * C * L * GA * steps);
    const OpTime* head = find(r, "lm head");
    ASSERT_NE(head, nullptr);
    EXPECT_EQ(head->calls, static_cast<std::int64_t>(2 * GA * steps));
    for (const char* k : {"attention", "norm", "elementwise", "embedding"}) EXPECT_NE(find(r, k), nullptr) << k;
    for (std::size_t i = 1; i < r.profile.size(); ++i)
      EXPECT_GE(r.profile[i - 1].seconds, r.profile[i].seconds) << "slowest first";
  }
}

}  // namespace
}  // namespace zinf
