// generate.h — text generation from a trained model: a forward for one sequence that keeps every
// layer's keys and values (the KV cache), so each new token costs one row through the model instead
// of the whole sequence again; and a deterministic sampler for the next token.
//
// The decoder runs GPT-2 and the Llama family (grouped-query heads, rotary positions at each row's
// true position) on any op backend that has the generation ops of op_list.h (attention_decode,
// lm_head_logits): the CPU reference and the CUDA reference kernels, in fp32. Weights are whole
// units resident in device memory. The prompt is fed in one call (prefill); each later call feeds
// the tokens it is given after it. Only the last position's logits are computed.
//
// KV cache, per layer, fp32: GPT-2 keeps its packed q,k,v rows (3·C floats per position, the q third
// unused once its step is done); Llama keeps K and V (2·KV·D floats per position). Capacity is fixed
// at construction: positions 0..capacity-1.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "model/backend.h"
#include "model/shape.h"
#include "zinf/device.h"

namespace zinf {

// How the next token is chosen from the last position's logits.
//   temperature 0: greedy, the first index of the largest logit;
//   else: logits / temperature, then the top_k largest (0: all; ties by lower id), then the smallest
//   set of those, most likely first, whose probability reaches top_p (1: all), renormalised; one
//   uniform draw in [0, 1) picks from it.
// The draw is the top 53 bits of std::mt19937_64 (seeded with `seed`) times 2⁻⁵³ and the softmax uses
// fixed::exp (model/fixed_math.h): the same seed gives the same ids on every machine and standard
// library (std::uniform_real_distribution's output is left to the library).
struct SamplingOptions {
  double temperature = 0;
  int top_k = 0;
  double top_p = 1.0;
  std::uint64_t seed = 1;
  int vocab = 0;  // > 0: ids from vocab on are never chosen (a model vocabulary padded past its tokenizer's)
};

class Sampler {
 public:
  explicit Sampler(const SamplingOptions& o);  // ConfigError for a negative temperature or top_k, top_p not in (0, 1]
  int next(const std::vector<float>& logits);

 private:
  SamplingOptions o_;
  std::mt19937_64 rng_;
};

// The first index of the largest of the first n values (n = 0: all; NaN never wins).
int argmax(const std::vector<float>& logits, std::size_t n = 0);

class KvDecoder {
 public:
  // units: each layer unit's fp32 weights in device memory (model/shape.h's layer_units order), alive
  // while the decoder is. capacity: the most positions, at most the model's seq_len (GPT-2's position
  // table; the rotary tables are made for it).
  KvDecoder(const ModelShape& s, Device& dev, OpsBackend& ops, std::vector<ConstTensorView> units, int capacity);

  void reset() { pos_ = 0; }  // forget the cached positions
  int position() const { return pos_; }
  int capacity() const { return P_; }
  // Runs tokens[0..n) at positions position()..position()+n-1, appends their keys and values, and
  // returns the last one's logits (vocab_size floats, on the host, after waiting for the device).
  // n ≥ 1 and position() + n ≤ capacity(); every id < vocab_size (an Error otherwise).
  const std::vector<float>& feed(const int* tokens, int n);
  // Device bytes: the cache alone, and everything the decoder allocated.
  std::size_t cache_bytes() const { return cache_bytes_; }
  std::size_t device_bytes() const { return device_bytes_; }

 private:
  void gpt_layers(int n);
  void llama_layers(int n);

  ModelShape s_;
  Device& dev_;
  OpsBackend& ops_;
  std::vector<ConstTensorView> units_;
  int P_, C_, H_, KV_, D_, F_, V_, pos_ = 0;
  DeviceBuffer buf_, cache_buf_, tokens_;
  TensorView xa_, xb_, ln_, mean_, rstd_, q_, atty_, res2_, ff1_, ff2_, ff3_, lnf_, logits_, cos_, sin_;
  std::vector<TensorView> k_, v_;  // per layer; GPT-2: k_ is the packed q,k,v rows, v_ unused
  std::vector<float> host_logits_;
  std::size_t cache_bytes_ = 0, device_bytes_ = 0;
};

// One generation: the prompt, then up to max_new tokens, stopping after any id of `eos` (kept in
// ids) or when the decoder's capacity is reached.
struct GenerateResult {
  std::vector<int> ids;  // the new tokens only
  int prompt_tokens = 0;
  bool stopped_at_eos = false, context_full = false;
  double prefill_s = 0, decode_s = 0;  // wall time of the prompt's feed, and of the later feeds
};
// on_token (optional) sees each new id as soon as it is chosen. The decoder is reset first.
GenerateResult generate(KvDecoder& d, const std::vector<int>& prompt, int max_new, const SamplingOptions& o,
                        const std::vector<int>& eos, const std::function<void(int)>& on_token = {});

}  // namespace zinf
