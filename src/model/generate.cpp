// generate.cpp — the KV-cache decoder and the sampler (generate.h).
#include "model/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <string>

#include "model/fixed_math.h"
#include "model/gpt.h"
#include "model/host_math.h"
#include "model/llama.h"
#include "zinf/error.h"

namespace zinf {

// ---- sampling ---------------------------------------------------------------------------------------

int argmax(const std::vector<float>& logits, std::size_t n) {
  int best = 0;
  if (n == 0 || n > logits.size()) n = logits.size();
  for (std::size_t i = 1; i < n; ++i)
    if (logits[i] > logits[static_cast<std::size_t>(best)]) best = static_cast<int>(i);
  return best;
}

Sampler::Sampler(const SamplingOptions& o) : o_(o), rng_(o.seed) {
  if (!(o.temperature >= 0) || !std::isfinite(o.temperature))
    throw ConfigError("--temperature: " + std::to_string(o.temperature) + " is not a finite number ≥ 0",
                      "0 picks the most likely token (greedy)");
  if (o.top_k < 0) throw ConfigError("--top-k: " + std::to_string(o.top_k) + " is negative (0 keeps every token)");
  if (!(o.top_p > 0 && o.top_p <= 1)) throw ConfigError("--top-p: " + std::to_string(o.top_p) + " is not in (0, 1]");
}

int Sampler::next(const std::vector<float>& logits) {
  const int V = o_.vocab > 0 ? std::min(o_.vocab, static_cast<int>(logits.size())) : static_cast<int>(logits.size());
  if (o_.temperature == 0) return argmax(logits, static_cast<std::size_t>(V));
  // Candidates most likely first, ties by lower id: a total order, so every sort agrees.
  std::vector<int> ids(static_cast<std::size_t>(V));
  std::iota(ids.begin(), ids.end(), 0);
  auto before = [&](int a, int b) {
    const float la = logits[static_cast<std::size_t>(a)], lb = logits[static_cast<std::size_t>(b)];
    return la > lb || (la == lb && a < b);
  };
  const int k = o_.top_k > 0 ? std::min(o_.top_k, V) : V;
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), before);
  ids.resize(static_cast<std::size_t>(k));
  const double top = logits[static_cast<std::size_t>(ids[0])];
  std::vector<double> p(ids.size());
  double sum = 0;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const double z = (logits[static_cast<std::size_t>(ids[i])] - top) / o_.temperature;
    p[i] = std::isfinite(z) ? fixed::exp(z) : 0.0;  // −inf logits have no chance
    sum += p[i];
  }
  std::size_t keep = p.size();
  if (o_.top_p < 1) {
    double acc = 0;
    for (std::size_t i = 0; i < p.size(); ++i) {
      acc += p[i];
      if (acc >= o_.top_p * sum) {
        keep = i + 1;
        break;
      }
    }
  }
  double kept = 0;
  for (std::size_t i = 0; i < keep; ++i) kept += p[i];
  // 53 random bits → [0, 1) exactly, whatever the library.
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53;
  const double target = u * kept;
  double acc = 0;
  for (std::size_t i = 0; i < keep; ++i) {
    acc += p[i];
    if (target < acc) return ids[i];
  }
  return ids[keep - 1];  // rounding left target at the very top
}

// ---- the decoder ----------------------------------------------------------------------------------------

KvDecoder::KvDecoder(const ModelShape& s, Device& dev, OpsBackend& ops, std::vector<ConstTensorView> units,
                     int capacity)
    : s_(s),
      dev_(dev),
      ops_(ops),
      units_(std::move(units)),
      P_(capacity),
      C_(s.d_model),
      H_(s.n_head),
      KV_(s.family == ModelFamily::llama ? s.kv_heads() : s.n_head),
      D_(s.head_dim()),
      F_(s.family == ModelFamily::llama ? s.d_ff : 4 * s.d_model),
      V_(s.vocab_size) {
  if (capacity < 1 || capacity > s.seq_len)
    throw ConfigError("generation context of " + std::to_string(capacity) + " positions: the model has " +
                      std::to_string(s.seq_len));
  // transformers switches longrope to its long factors once the sequence passes the original
  // context, keeping the keys cached before with the short ones: one table cannot match that.
  if (s.family == ModelFamily::llama && s.rope.type == "longrope" && capacity > s.rope_original_max)
    throw ConfigError("generation context of " + std::to_string(capacity) +
                      " positions: a longrope model generates here only within its original_max_position_embeddings " +
                      std::to_string(static_cast<long long>(s.rope_original_max)));
  if (units_.size() != layer_units(s).size())
    throw Error("generate: " + std::to_string(units_.size()) + " weight units for a model of " +
                std::to_string(layer_units(s).size()));
  const bool llama = s.family == ModelFamily::llama;
  const std::size_t P = static_cast<std::size_t>(P_), C = static_cast<std::size_t>(C_),
                    F = static_cast<std::size_t>(F_), V = static_cast<std::size_t>(V_),
                    L = static_cast<std::size_t>(s.n_layer), KVD = static_cast<std::size_t>(KV_) * D_;
  // Activations for up to P rows (a prompt is fed whole), the last row's norm and logits.
  auto carve = [&](ViewCursor& c) {
    xa_ = c.take(P * C), xb_ = c.take(P * C), ln_ = c.take(P * C), mean_ = c.take_fp32(P), rstd_ = c.take_fp32(P);
    q_ = c.take(P * C), atty_ = c.take(P * C), res2_ = c.take(P * C);
    ff1_ = c.take(P * F), ff2_ = c.take(P * F), ff3_ = c.take(P * F);
    lnf_ = c.take(C), logits_ = c.take_fp32(V);
    if (llama) cos_ = c.take_fp32(P * static_cast<std::size_t>(D_ / 2)), sin_ = c.take_fp32(P * (D_ / 2));
  };
  ViewCursor measure(nullptr, DType::fp32);
  carve(measure);
  buf_ = DeviceBuffer(dev, measure.bytes(), "generation activations");
  ViewCursor c(buf_.as<void>(), DType::fp32);
  carve(c);
  const std::size_t per_layer = llama ? 2 * P * KVD : 3 * P * C;
  cache_bytes_ = L * per_layer * sizeof(float);
  cache_buf_ = DeviceBuffer(dev, std::max<std::size_t>(cache_bytes_, 4), "KV cache");
  float* base = cache_buf_.as<float>();
  for (std::size_t l = 0; l < L; ++l) {
    if (llama) {
      k_.emplace_back(base + l * per_layer, P * KVD);
      v_.emplace_back(base + l * per_layer + P * KVD, P * KVD);
    } else {
      k_.emplace_back(base + l * per_layer, per_layer);
      v_.emplace_back();
    }
  }
  tokens_ = DeviceBuffer(dev, P * sizeof(int), "generation token ids");
  device_bytes_ = measure.bytes() + cache_bytes_ + P * sizeof(int);
  host_logits_.resize(V);
  if (llama) {  // the rotary tables of positions 0..P-1, as the training forward makes them for its T
    std::vector<float> co, si;
    llama_rope_tables(s, P_, co, si);
    dev.copy_to_device(cos_.data(), co.data(), co.size() * sizeof(float), StreamRole::compute);
    dev.copy_to_device(sin_.data(), si.data(), si.size() * sizeof(float), StreamRole::compute);
    dev.synchronize(StreamRole::compute);
  }
}

void KvDecoder::gpt_layers(int n) {
  const int C = C_;
  const std::size_t nC = static_cast<std::size_t>(n) * C, C3 = 3 * static_cast<std::size_t>(C),
                    pos = static_cast<std::size_t>(pos_);
  TensorView x = xa_, out = xb_;
  for (std::size_t l = 0; l < static_cast<std::size_t>(s_.n_layer); ++l) {
    const GptBlock<ConstTensorView> w = block_view(units_[l + 1], C);
    const TensorView& cache = k_[l];  // packed rows [P, 3C]: q, k, v of each position
    const std::size_t rows = cache.numel() / C3;
    ops_.layernorm_forward(ln_, mean_, rstd_, x, w.ln1w, w.ln1b, n, C);
    ops_.matmul_forward(slice(cache, pos * C3, nC * 3), ln_, w.qkvw, w.qkvb, n, C, 3 * C);
    ops_.attention_decode(atty_, slice(cache, pos * C3, nC * 3), slice(cache, C, rows * C3 - C),
                          slice(cache, 2 * static_cast<std::size_t>(C), rows * C3 - 2 * C), n, pos_, H_, H_, D_, 3 * C,
                          3 * C);
    ops_.matmul_forward(res2_, atty_, w.projw, w.projb, n, C, C);
    ops_.add_inplace(res2_, x, nC);
    ops_.layernorm_forward(ln_, mean_, rstd_, res2_, w.ln2w, w.ln2b, n, C);
    ops_.matmul_gelu_forward(ff1_, ff2_, ln_, w.fcw, w.fcb, n, C, 4 * C);
    ops_.matmul_forward(out, ff2_, w.fcprojw, w.fcprojb, n, 4 * C, C);
    ops_.add_inplace(out, res2_, nC);
    std::swap(x, out);
  }
  if (x.data() != xa_.data()) ops_.copy(xa_, x, nC);  // the blocks' output back where feed reads it
}

void KvDecoder::llama_layers(int n) {
  const int C = C_, KVD = KV_ * D_, F = F_, half = D_ / 2;
  const std::size_t nC = static_cast<std::size_t>(n) * C, pos = static_cast<std::size_t>(pos_);
  const float eps = static_cast<float>(s_.norm_eps);
  const ConstTensorView co = slice(cos_, pos * half, static_cast<std::size_t>(n) * half),
                        si = slice(sin_, pos * half, static_cast<std::size_t>(n) * half);
  TensorView x = xa_, out = xb_;
  for (std::size_t l = 0; l < static_cast<std::size_t>(s_.n_layer); ++l) {
    const LlamaBlock<ConstTensorView> w = llama_block_view(units_[l + 1], s_);
    const TensorView kn = slice(k_[l], pos * KVD, static_cast<std::size_t>(n) * KVD),
                     vn = slice(v_[l], pos * KVD, static_cast<std::size_t>(n) * KVD);
    ops_.rmsnorm_forward(ln_, rstd_, x, w.attn_norm, n, C, eps);
    ops_.matmul_forward(q_, ln_, w.wq, w.bq, n, C, C);
    ops_.matmul_forward(kn, ln_, w.wk, w.bk, n, C, KVD);
    ops_.matmul_forward(vn, ln_, w.wv, w.bv, n, C, KVD);
    ops_.rope_apply(q_, co, si, n, n, H_, D_, false);  // row r of the tables is position pos + r
    ops_.rope_apply(kn, co, si, n, n, KV_, D_, false);
    const int W = s_.layer_window(static_cast<int>(l));
    // The rows whose window still starts at position 0 attend the whole cache so far; each later row
    // (position p = pos + i) attends the W keys p − W + 1..p: the cache from its window's first key,
    // so its sums run over the keys gqa_attention_forward sums, in the same order.
    const int whole = W > 0 ? std::clamp(W - pos_, 0, n) : n;
    if (whole > 0) ops_.attention_decode(atty_, q_, k_[l], v_[l], whole, pos_, H_, KV_, D_, C, KVD);
    for (int i = whole; i < n; ++i) {
      const std::size_t lo = static_cast<std::size_t>(pos_ + i - W + 1), keys = static_cast<std::size_t>(W);
      ops_.attention_decode(slice(atty_, static_cast<std::size_t>(i) * C, C),
                            slice(ConstTensorView(q_), static_cast<std::size_t>(i) * C, C),
                            slice(ConstTensorView(k_[l]), lo * KVD, keys * KVD),
                            slice(ConstTensorView(v_[l]), lo * KVD, keys * KVD), 1, W - 1, H_, KV_, D_, C, KVD);
    }
    ops_.matmul_forward(res2_, atty_, w.wo, nullptr, n, C, C);
    ops_.add_inplace(res2_, x, nC);
    ops_.rmsnorm_forward(ln_, rstd_, res2_, w.ffn_norm, n, C, eps);
    ops_.matmul_forward(ff1_, ln_, w.w_gate, nullptr, n, C, F);
    ops_.matmul_forward(ff2_, ln_, w.w_up, nullptr, n, C, F);
    ops_.swiglu_forward(ff3_, ff1_, ff2_, static_cast<std::size_t>(n) * F);
    ops_.matmul_forward(out, ff3_, w.w_down, nullptr, n, F, C);
    ops_.add_inplace(out, res2_, nC);
    std::swap(x, out);
  }
  if (x.data() != xa_.data()) ops_.copy(xa_, x, nC);
}

const std::vector<float>& KvDecoder::feed(const int* tokens, int n) {
  if (n < 1 || pos_ + n > P_)
    throw Error("generate: " + std::to_string(n) + " tokens at position " + std::to_string(pos_) +
                " do not fit the context of " + std::to_string(P_));
  for (int i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= V_)
      throw Error("generate: token id " + std::to_string(tokens[i]) + " is outside the model's vocabulary of " +
                  std::to_string(V_));
  const std::size_t C = static_cast<std::size_t>(C_), V = static_cast<std::size_t>(V_),
                    L = static_cast<std::size_t>(s_.n_layer), pos = static_cast<std::size_t>(pos_);
  // On the compute stream, ahead of the ops that read them: stream order hands the ids over to ops
  // that are stream work (CUDA, the asynchronous CPU device); ops that run on this thread (the
  // synchronous CPU device) wait for the copy here. Either way `tokens` is read before feed returns.
  dev_.copy_to_device(tokens_.as<void>(), tokens, static_cast<std::size_t>(n) * sizeof(int), StreamRole::compute);
  if (!dev_.ops_stream_ordered()) dev_.synchronize(StreamRole::compute);
  const ConstTensorView emb = units_[0];
  if (s_.family == ModelFamily::llama) {
    ops_.embedding_forward(xa_, tokens_.as<int>(), slice(emb, 0, V * C), n, C_);
    llama_layers(n);
  } else {
    const std::size_t T = static_cast<std::size_t>(s_.seq_len);
    // Position rows pos..pos+n-1 of wpe: the encoder adds row t of the table it is given to row t.
    ops_.encoder_forward(xa_, tokens_.as<int>(), slice(emb, 0, V * C), slice(emb, V * C + pos * C, (T - pos) * C), 1, n,
                         C_);
    gpt_layers(n);
  }
  const ConstTensorView last = slice(ConstTensorView(xa_), (static_cast<std::size_t>(n) - 1) * C, C);
  const ConstTensorView fin = units_[L + 1];
  ConstTensorView head;
  if (s_.family == ModelFamily::llama) {
    ops_.rmsnorm_forward(lnf_, rstd_, last, slice(fin, 0, C), 1, C_, static_cast<float>(s_.norm_eps));
    head = s_.tie_embeddings ? slice(emb, 0, V * C) : slice(fin, C, V * C);
  } else {
    ops_.layernorm_forward(lnf_, mean_, rstd_, last, slice(fin, 0, C), slice(fin, C, C), 1, C_);
    head = slice(emb, 0, V * C);
  }
  ops_.lm_head_logits(logits_, lnf_, head, 1, C_, V_);
  dev_.copy_to_host(host_logits_.data(), logits_.data(), V * sizeof(float), StreamRole::compute);
  dev_.synchronize(StreamRole::compute);
  pos_ += n;
  return host_logits_;
}

// ---- generation -----------------------------------------------------------------------------------------

GenerateResult generate(KvDecoder& d, const std::vector<int>& prompt, int max_new, const SamplingOptions& o,
                        const std::vector<int>& eos, const std::function<void(int)>& on_token) {
  using clock = std::chrono::steady_clock;
  if (prompt.empty()) throw ConfigError("the prompt is empty: give at least one token");
  if (static_cast<int>(prompt.size()) >= d.capacity())
    throw ConfigError("the prompt is " + std::to_string(prompt.size()) + " tokens; the model's context holds " +
                      std::to_string(d.capacity()) + ", leaving no room for a new one");
  Sampler sampler(o);
  GenerateResult r;
  r.prompt_tokens = static_cast<int>(prompt.size());
  d.reset();
  auto t0 = clock::now();
  const std::vector<float>* logits = &d.feed(prompt.data(), static_cast<int>(prompt.size()));
  r.prefill_s = std::chrono::duration<double>(clock::now() - t0).count();
  t0 = clock::now();
  for (int i = 0; i < max_new; ++i) {
    const int id = sampler.next(*logits);
    r.ids.push_back(id);
    if (on_token) on_token(id);
    if (std::find(eos.begin(), eos.end(), id) != eos.end()) {
      r.stopped_at_eos = true;
      break;
    }
    if (i + 1 == max_new) break;
    if (d.position() >= d.capacity()) {
      r.context_full = true;
      break;
    }
    logits = &d.feed(&id, 1);
  }
  r.decode_s = std::chrono::duration<double>(clock::now() - t0).count();
  return r;
}

}  // namespace zinf
