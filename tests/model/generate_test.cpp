// generate_test.cpp — generation over a KV cache (model/generate.h) against the training forward, for
// GPT-2 and a Llama with grouped-query heads, rotary positions, q/k/v biases and an untied head:
//   * the cached decoder's log-probabilities at every position equal the training forward's
//     (which sees the whole sequence at once, with no cache) within fp32 rounding;
//   * feeding tokens one at a time gives bit for bit the logits of feeding the whole prefix at once;
//   * attention_decode's rows are bit for bit gqa_attention_forward's rows (the CPU reference);
//   * the sampler: same seed → same ids, greedy = argmax, top-k 1 = greedy, EOS stops, a padded
//     vocabulary's extra ids are never chosen, bad options are refused;
//   * on a GPU (skipped with the reason without one): greedy ids on the CUDA reference kernels equal
//     the CPU's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "cpu/cpu_ops.h"
#include "model/generate.h"
#include "model/llama.h"
#include "model/lm.h"
#include "zinf/backends/backend.h"
#include "zinf/backends/cpu.h"
#include "zinf/backends/gpu.h"
#include "zinf/error.h"

namespace zinf {
namespace {

ModelShape gpt_shape() {
  ModelShape s{2, 4, 32, 61, 20};
  return s;
}
ModelShape llama_shape() {
  ModelShape s{2, 4, 32, 61, 20};
  s.family = ModelFamily::llama;
  s.n_kv_head = 2;
  s.d_ff = 48;
  s.tie_embeddings = false;
  s.qkv_bias = true;
  s.rope_theta = 100;  // angles that turn visibly within 20 positions
  return s;
}

// The family's initialisation, scaled up so that attention and the logits are far from uniform
// (a wrong position or a stale cache row then moves them well past the tolerance).
std::vector<std::vector<float>> make_units(const ModelShape& s, std::uint64_t seed) {
  std::vector<std::vector<float>> u;
  const auto units = layer_units(s);
  for (std::size_t i = 0; i < units.size(); ++i) {
    u.emplace_back(static_cast<std::size_t>(units[i].params));
    init_model_unit(u.back().data(), i, s, seed);
    for (float& x : u.back()) x *= 12.0f;
    if (s.qkv_bias && i > 0 && i <= static_cast<std::size_t>(s.n_layer)) {  // give the zero biases values
      std::mt19937 rng(static_cast<std::uint32_t>(seed + i));
      std::normal_distribution<float> d(0.0f, 0.3f);
      const LlamaBlock<float*> b = llama_block_view(u.back().data(), s);
      const std::size_t KVD = static_cast<std::size_t>(s.kv_heads()) * s.head_dim();
      for (std::size_t j = 0; j < static_cast<std::size_t>(s.d_model); ++j) b.bq[j] = d(rng);
      for (std::size_t j = 0; j < KVD; ++j) {
        b.bk[j] = d(rng);
        b.bv[j] = d(rng);
      }
    }
  }
  return u;
}

std::vector<ConstTensorView> views(const std::vector<std::vector<float>>& u) {
  std::vector<ConstTensorView> v;
  for (const auto& x : u) v.emplace_back(x.data(), x.size());
  return v;
}

std::vector<int> some_tokens(int n, int V, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int> t(static_cast<std::size_t>(n));
  for (int& x : t) x = static_cast<int>(rng() % static_cast<unsigned>(V));
  return t;
}

std::vector<double> log_softmax(const std::vector<float>& l) {
  double m = l[0];
  for (float x : l) m = std::max(m, static_cast<double>(x));
  double s = 0;
  for (float x : l) s += std::exp(x - m);
  std::vector<double> r;
  for (float x : l) r.push_back(x - m - std::log(s));
  return r;
}

struct Cpu {
  std::unique_ptr<Device> dev = make_cpu_device(std::size_t{256} << 20);
  ops::ChunkPool pool{2};
  CpuOps ops{pool};
};

// The training forward's log p_t(v) for every position t and token v: one forward per target v
// (every row's target set to v), each row's loss being −log p_t(v), p clamped at 1e-30.
std::vector<std::vector<double>> training_log_probs(const ModelShape& s, const std::vector<std::vector<float>>& u,
                                                    const std::vector<int>& tokens, Cpu& c) {
  auto m = make_model(s, 1, false, *c.dev, c.ops);
  std::vector<const float*> w;
  std::vector<float*> g;
  std::vector<std::size_t> n;
  for (const auto& x : u) w.push_back(x.data()), g.push_back(nullptr), n.push_back(x.size());
  ResidentUnits src(w, g, n);
  std::vector<std::vector<double>> lp(tokens.size(), std::vector<double>(static_cast<std::size_t>(s.vocab_size)));
  for (int v = 0; v < s.vocab_size; ++v) {
    const std::vector<int> targets(tokens.size(), v);
    m->forward(src, tokens.data(), targets.data());
    c.dev->synchronize();
    for (std::size_t t = 0; t < tokens.size(); ++t) lp[t][static_cast<std::size_t>(v)] = -m->row_losses()[t];
  }
  return lp;
}

void expect_cache_matches_training_forward(const ModelShape& s) {
  Cpu c;
  const auto u = make_units(s, 7);
  const std::vector<int> tokens = some_tokens(s.seq_len, s.vocab_size, 3);
  const auto want = training_log_probs(s, u, tokens, c);
  KvDecoder d(s, *c.dev, c.ops, views(u), s.seq_len);
  KvDecoder fresh(s, *c.dev, c.ops, views(u), s.seq_len);
  constexpr int kPrompt = 5;
  double worst = 0, spread = 0;
  for (int t = kPrompt - 1; t < s.seq_len; ++t) {
    const std::vector<float> got =
        t == kPrompt - 1 ? d.feed(tokens.data(), kPrompt) : d.feed(&tokens[static_cast<std::size_t>(t)], 1);
    ASSERT_EQ(d.position(), t + 1);
    const auto lp = log_softmax(got);
    for (std::size_t v = 0; v < lp.size(); ++v) {
      // The training loss clamps a probability at 1e-30 (log −69): below e^−60 both sides only need
      // to agree that the token is that unlikely.
      const double w = want[static_cast<std::size_t>(t)][v];
      if (w < -60)
        EXPECT_LT(lp[v], -59) << "position " << t << ", token " << v;
      else
        worst = std::max(worst, std::fabs(lp[v] - w));
      spread = std::max(spread, std::fabs(lp[v] - lp[0]));
    }
    // The whole prefix at once, on a fresh cache: the same bits.
    fresh.reset();
    const std::vector<float>& all = fresh.feed(tokens.data(), t + 1);
    ASSERT_EQ(all.size(), got.size());
    EXPECT_EQ(std::memcmp(all.data(), got.data(), got.size() * sizeof(float)), 0)
        << "position " << t << ": one token at a time differs from the prefix at once";
  }
  EXPECT_LT(worst, 5e-5) << "cached log-probabilities differ from the training forward's";
  EXPECT_GT(spread, 1.0) << "the test model's distributions are too flat to tell positions apart";
}

TEST(Generate, GptCacheMatchesTheTrainingForward) { expect_cache_matches_training_forward(gpt_shape()); }
TEST(Generate, LlamaGqaCacheMatchesTheTrainingForward) { expect_cache_matches_training_forward(llama_shape()); }
// A sliding window of 6 positions on the second layer only (Qwen2's max_window_layers = 1): the
// 5-token prompt fits it, the later positions and the longer prefixes do not.
TEST(Generate, LlamaSlidingWindowCacheMatchesTheTrainingForward) {
  ModelShape s = llama_shape();
  s.sliding_window = 6, s.window_from = 1;
  ASSERT_EQ(s.layer_window(0), 0);
  ASSERT_EQ(s.layer_window(1), 6);
  expect_cache_matches_training_forward(s);
}

TEST(Generate, AttentionDecodeRowsAreTheFullForwardsRowsBitwise) {
  constexpr int T = 11, H = 6, KV = 2, D = 8, pos = 7, Q = T - pos;
  const auto rnd = [](std::size_t n, std::uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, 1.5f);
    std::vector<float> x(n);
    for (float& v : x) v = d(rng);
    return x;
  };
  const auto q = rnd(static_cast<std::size_t>(T) * H * D, 1), k = rnd(static_cast<std::size_t>(T) * KV * D, 2),
             v = rnd(static_cast<std::size_t>(T) * KV * D, 3);
  ops::ChunkPool p(2);
  std::vector<float> full(q.size()), att(static_cast<std::size_t>(H) * T * T), dec(static_cast<std::size_t>(Q) * H * D);
  ops::gqa_attention_forward(p, full.data(), att.data(), q.data(), k.data(), v.data(), 1, T, H, KV, D, 0);
  ops::attention_decode(p, dec.data(), q.data() + static_cast<std::size_t>(pos) * H * D, k.data(), v.data(), Q, pos, H,
                        KV, D, H * D, KV * D);
  EXPECT_EQ(std::memcmp(dec.data(), full.data() + static_cast<std::size_t>(pos) * H * D, dec.size() * sizeof(float)),
            0);
}

struct Model {
  ModelShape s = gpt_shape();
  Cpu c;
  std::vector<std::vector<float>> u = make_units(s, 11);
  KvDecoder d{s, *c.dev, c.ops, views(u), s.seq_len};
  std::vector<int> prompt = some_tokens(4, s.vocab_size, 5);
};

TEST(Generate, SameSeedSameIdsAndAnotherSeedOthers) {
  Model m;
  SamplingOptions o;
  o.temperature = 1.5, o.top_k = 40, o.top_p = 0.95, o.seed = 9;
  const auto a = generate(m.d, m.prompt, 14, o, {});
  const auto b = generate(m.d, m.prompt, 14, o, {});
  ASSERT_EQ(a.ids.size(), 14u);
  EXPECT_EQ(a.ids, b.ids);
  o.seed = 10;
  EXPECT_NE(generate(m.d, m.prompt, 14, o, {}).ids, a.ids) << "the seed does not reach the draws";
}

TEST(Generate, GreedyIsTheArgmaxAndTopKOneIsGreedy) {
  Model m;
  const auto g = generate(m.d, m.prompt, 12, SamplingOptions{}, {});
  ASSERT_EQ(g.ids.size(), 12u);
  // Replay: at each step the chosen id is the largest logit's.
  m.d.reset();
  std::vector<float> logits = m.d.feed(m.prompt.data(), static_cast<int>(m.prompt.size()));
  for (int id : g.ids) {
    const auto best = std::max_element(logits.begin(), logits.end()) - logits.begin();
    EXPECT_EQ(id, best);
    logits = m.d.feed(&id, 1);
  }
  SamplingOptions k1;
  k1.temperature = 2.0, k1.top_k = 1, k1.seed = 3;
  EXPECT_EQ(generate(m.d, m.prompt, 12, k1, {}).ids, g.ids);
  SamplingOptions p0;  // a top-p below the first token's probability keeps that token alone
  p0.temperature = 1.0, p0.top_p = 1e-9, p0.seed = 4;
  EXPECT_EQ(generate(m.d, m.prompt, 12, p0, {}).ids, g.ids);
}

TEST(Generate, EosStopsAndTheContextEnds) {
  Model m;
  const auto g = generate(m.d, m.prompt, 12, SamplingOptions{}, {});
  ASSERT_FALSE(g.stopped_at_eos);
  const int stop = g.ids[3];
  const auto first = static_cast<std::size_t>(std::find(g.ids.begin(), g.ids.end(), stop) - g.ids.begin());
  const auto e = generate(m.d, m.prompt, 12, SamplingOptions{}, {1000, stop});
  EXPECT_TRUE(e.stopped_at_eos);
  EXPECT_EQ(e.ids, std::vector<int>(g.ids.begin(), g.ids.begin() + static_cast<long>(first) + 1));
  // A context of seq_len = 20 positions: a prompt of 4 leaves room for 17 new tokens (the last one
  // is chosen from position 19's logits and never fed).
  const auto full = generate(m.d, m.prompt, 100, SamplingOptions{}, {});
  EXPECT_TRUE(full.context_full);
  EXPECT_EQ(full.ids.size(), 17u);
  EXPECT_THROW(generate(m.d, some_tokens(20, m.s.vocab_size, 1), 1, SamplingOptions{}, {}), ConfigError);
  EXPECT_THROW(generate(m.d, {}, 1, SamplingOptions{}, {}), ConfigError);
  const int bad = m.s.vocab_size;
  m.d.reset();
  EXPECT_THROW(m.d.feed(&bad, 1), Error);
}

TEST(Generate, SamplerKeepsToTheTokenizersVocabularyAndRefusesBadOptions) {
  std::vector<float> logits(10, 0.0f);
  logits[8] = 50.0f;  // a padding id past the tokenizer's vocabulary of 8
  logits[2] = 1.0f;
  SamplingOptions o;
  o.vocab = 8;
  EXPECT_EQ(Sampler(o).next(logits), 2);
  o.temperature = 1.0;
  Sampler s(o);
  for (int i = 0; i < 200; ++i) EXPECT_LT(s.next(logits), 8);
  SamplingOptions bad;
  bad.temperature = -1;
  EXPECT_THROW(Sampler{bad}, ConfigError);
  bad = {};
  bad.top_p = 0;
  EXPECT_THROW(Sampler{bad}, ConfigError);
  bad = {};
  bad.top_k = -2;
  EXPECT_THROW(Sampler{bad}, ConfigError);
}

TEST(Generate, TheDrawsFollowTheDistribution) {
  // Two tokens with probabilities 0.2 and 0.8 (logits log 1 and log 4): 4000 draws land within 4σ.
  std::vector<float> logits = {0.0f, static_cast<float>(std::log(4.0)), -INFINITY};
  SamplingOptions o;
  o.temperature = 1.0, o.seed = 77;
  Sampler s(o);
  int ones = 0;
  constexpr int kDraws = 4000;
  for (int i = 0; i < kDraws; ++i) {
    const int id = s.next(logits);
    ASSERT_LT(id, 2);
    ones += id == 1;
  }
  EXPECT_NEAR(ones, 0.8 * kDraws, 4 * std::sqrt(kDraws * 0.8 * 0.2));
}

TEST(Generate, CudaGreedyIdsEqualTheCpus) {
  const cuda::GpuQuery q = cuda::query_gpus();
  if (q.gpus.empty()) GTEST_SKIP() << "no GPU: " << q.status;
  for (const ModelShape& s : {gpt_shape(), llama_shape()}) {
    Cpu c;
    const auto u = make_units(s, 21);
    const std::vector<int> prompt = some_tokens(5, s.vocab_size, 8);
    KvDecoder cpu_dec(s, *c.dev, c.ops, views(u), s.seq_len);
    const auto want = generate(cpu_dec, prompt, 12, SamplingOptions{}, {});

    const backends::Backend& be = backends::backend_for(DeviceType::cuda);
    backends::DeviceSpec spec;
    spec.budget_bytes = std::size_t{1} << 30;
    auto dev = be.make_device(spec);
    auto ops = be.make_ops(*dev, Precision::fp32, 1, Kernels::reference);
    std::vector<DeviceBuffer> w;
    std::vector<ConstTensorView> v;
    for (const auto& x : u) {
      w.emplace_back(*dev, x.size() * sizeof(float), "generate test weights");
      dev->copy_to_device(w.back().as<void>(), x.data(), x.size() * sizeof(float), StreamRole::compute);
      v.emplace_back(w.back().as<float>(), x.size());
    }
    dev->synchronize(StreamRole::compute);
    KvDecoder gpu_dec(s, *dev, *ops, v, s.seq_len);
    const auto got = generate(gpu_dec, prompt, 12, SamplingOptions{}, {});
    EXPECT_EQ(got.ids, want.ids) << (s.family == ModelFamily::llama ? "llama" : "gpt2");
  }
}

}  // namespace
}  // namespace zinf
