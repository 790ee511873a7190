// fast_ops_twin_test.cpp — every op of the seam (model/op_list.h) on the CUDA fast ops (CudaFastOps,
// device.kernels fast) against the CPU device's twin of them (the CPU backend's make_ops with
// Kernels::fast), on the same inputs, for bf16 and fp32 storage. The twin stores and rounds where the
// GPU does, so the two differ only by summation order and the last bits of exp/tanh:
//   * an output stored in 16 bits: within 4 ulps of its dtype relative to the output's scale (its
//     largest magnitude), times √K for an output that sums K products (GEMMs, attention, norms);
//   * an fp32 output (weight gradients, norm statistics, the log-sum-exp) and every output of an
//     fp32-storage run: within 64 fp32 ulps relative to its scale, times √K; an fp32 output the op
//     computes from values it rounds to S on the way (row losses from the stored logits, the LM
//     head's weight gradient from the stored dlogits) counts ulps of S instead;
//   * running the GPU twice gives the same bits (the fast kernels use no atomics).
// Inputs a backward op reads from its forward (mean/rstd, the attention output and log-sum-exp, the
// probabilities) are made by the twin's forward op, so both sides see a consistent state.
// The LM head's probs and dlogits are laid out as each backend says (OpsBackend::logits_rows): rows
// V apart on the twin, padded to a multiple of 64 on the GPU, at a vocabulary that is not a multiple
// of 64. On the GPU the pad columns start as NaN bytes and must come back unchanged: no kernel
// writes them, and a kernel that read them would spread the NaN into the compared outputs.
// Generation's ops (attention_decode, lm_head_logits) run on the twin like the others; the fast kernels
// have none, and on the GPU the test checks that they refuse them with an Error.
// Skipped, with the reason, without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "model/backend.h"
#include "model/host_math.h"
#include "model/op_list.h"
#include "zinf/backends/backend.h"
#include "zinf/backends/gpu.h"
#include "zinf/cpu_adam/spec.h"
#include "zinf/device.h"

namespace zinf {
namespace {

using Bytes = std::vector<unsigned char>;

float widen(const Bytes& b, DType t, std::size_t i) {
  if (t == DType::fp32) {
    float f;
    std::memcpy(&f, b.data() + 4 * i, 4);
    return f;
  }
  std::uint16_t h;
  std::memcpy(&h, b.data() + 2 * i, 2);
  return t == DType::bf16 ? cpu_adam::spec::bf16_to_fp32(h) : cpu_adam::spec::fp16_to_fp32(h);
}
void store(Bytes& b, DType t, std::size_t i, float x) {
  if (t == DType::fp32) {
    std::memcpy(b.data() + 4 * i, &x, 4);
    return;
  }
  const std::uint16_t h = t == DType::bf16 ? cpu_adam::spec::fp32_to_bf16(x) : cpu_adam::spec::fp32_to_fp16(x);
  std::memcpy(b.data() + 2 * i, &h, 2);
}
double eps(DType t) {  // the spacing of the dtype's values at 1
  return t == DType::bf16 ? std::ldexp(1.0, -7) : t == DType::fp16 ? std::ldexp(1.0, -10) : std::ldexp(1.0, -23);
}

// One tensor of a case: its dtype (S for activations and weights, fp32 for the rest), its
// elements, K, the number of terms summed into each of its elements (1: elementwise), and the dtype
// whose ulps its tolerance counts: its own, or S for an fp32 output computed from values the op
// rounds to S on the way (a last-bit difference there moves it by an ulp of S).
struct Tensor {
  DType t;
  std::size_t n;
  double k;
  Bytes init;
  DType tol_t;
  int rows = 0, cols = 0;  // the LM head's logits (rows > 0): rows of cols classes, in the backend's layout
};

// The tensors of one case as one backend sees them (host or device memory).
struct Bufs {
  std::vector<void*> p;
  std::vector<DType> t;
  std::vector<std::size_t> n;
  std::vector<int*> i;
  TensorView w(int k) const {
    const auto u = static_cast<std::size_t>(k);
    return TensorView(p[u], t[u], n[u]);
  }
  ConstTensorView r(int k) const { return w(k); }
  const int* ids(int k) const { return i[static_cast<std::size_t>(k)]; }
};

using Call = std::function<void(OpsBackend&, const Bufs&)>;

// Host buffers of a tensor list, and views of them.
struct HostSet {
  std::vector<Bytes> f;
  std::vector<std::vector<int>> i;
  Bufs bufs(const std::vector<Tensor>& ts) {
    Bufs b;
    for (std::size_t k = 0; k < f.size(); ++k)
      b.p.push_back(f[k].data()), b.t.push_back(ts[k].t), b.n.push_back(ts[k].n);
    for (auto& v : i) b.i.push_back(v.data());
    return b;
  }
};

struct Case {
  DType S = DType::bf16;
  OpsBackend* twin = nullptr;  // for the forward state a backward case needs
  std::vector<Tensor> t;
  std::vector<std::vector<int>> i;
  Call call;

  int add(DType dt, std::size_t n, double k, float scale) {
    std::mt19937 rng(static_cast<std::uint32_t>(101 + t.size() * 7919));
    std::normal_distribution<float> d(0.0f, scale);
    Tensor x{dt, n, k, Bytes(n * dtype_bytes(dt)), dt};
    for (std::size_t j = 0; j < n; ++j) store(x.init, dt, j, d(rng));
    t.push_back(std::move(x));
    return static_cast<int>(t.size() - 1);
  }
  int act(std::size_t n, double k = 1, float scale = 1.0f) { return add(S, n, k, scale); }  // stored in S
  int f32(std::size_t n, double k = 1, float scale = 1.0f) { return add(DType::fp32, n, k, scale); }
  // The LM head's probs or dlogits: R rows of `vocab` classes in S (held packed here).
  int logits(int rows, int vocab, double k = 1) {
    const int id = act(static_cast<std::size_t>(rows) * static_cast<std::size_t>(vocab), k);
    t.back().rows = rows, t.back().cols = vocab;
    return id;
  }
  int tokens(std::size_t n, int vocab) {
    std::mt19937 rng(static_cast<std::uint32_t>(7 + i.size()));
    std::vector<int> v(n);
    for (int& x : v) x = static_cast<int>(rng() % static_cast<unsigned>(vocab));
    i.push_back(std::move(v));
    return static_cast<int>(i.size() - 1);
  }
  // Runs a forward op on the twin over the current values: the state a backward case reads.
  void prepare(const Call& forward) {
    HostSet h;
    for (const Tensor& x : t) h.f.push_back(x.init);
    h.i = i;
    forward(*twin, h.bufs(t));
    for (std::size_t k = 0; k < t.size(); ++k) t[k].init = h.f[k];
  }
};

constexpr int B = 2, T = 40, C = 64, H = 4, V = 96, R = B * T;
constexpr int LH = 4, KV = 2, D = 16, F = 128;  // the llama cases' heads and MLP width
constexpr int VH = 257;  // the LM head's vocabulary: odd, as GPT-2's 50257, so its rows are padded on the GPU
constexpr std::size_t RC = static_cast<std::size_t>(R) * C;
constexpr std::size_t sz(long long x) { return static_cast<std::size_t>(x); }

#define ZINF_DECLARE_CASE(name, info, params, args) void case_##name(Case& c);
ZINF_OPS(ZINF_DECLARE_CASE)
#undef ZINF_DECLARE_CASE

void case_matmul_forward(Case& c) {
  const int out = c.act(sz(R) * 3 * C, C), inp = c.act(RC), w = c.act(sz(C) * 3 * C, 1, 0.2f), b = c.act(3 * C);
  c.call = [=](OpsBackend& o, const Bufs& t) { o.matmul_forward(t.w(out), t.r(inp), t.r(w), t.r(b), R, C, 3 * C); };
}
void case_matmul_gelu_forward(Case& c) {
  const int pre = c.act(sz(R) * 4 * C, C), out = c.act(sz(R) * 4 * C, C), inp = c.act(RC),
            w = c.act(sz(C) * 4 * C, 1, 0.2f), b = c.act(4 * C);
  c.call = [=](OpsBackend& o, const Bufs& t) {
    o.matmul_gelu_forward(t.w(pre), t.w(out), t.r(inp), t.r(w), t.r(b), R, C, 4 * C);
  };
}
void case_matmul_backward(Case& c) {
  const int dinp = c.act(RC, 4 * C), dw = c.f32(sz(C) * 4 * C, R), db = c.f32(4 * C, R), dout = c.act(sz(R) * 4 * C),
            inp = c.act(RC), w = c.act(sz(C) * 4 * C, 1, 0.2f);
  c.call = [=](OpsBackend& o, const Bufs& t) {
    o.matmul_backward(t.w(dinp), t.w(dw), t.w(db), t.r(dout), t.r(inp), t.r(w), R, C, 4 * C);
  };
}
void case_layernorm_forward(Case& c) {
  const int out = c.act(RC, C), mean = c.f32(R, C), rstd = c.f32(R, C), inp = c.act(RC), w = c.act(C), b = c.act(C);
  c.call = [=](OpsBackend& o, const Bufs& t) {
    o.layernorm_forward(t.w(out), t.w(mean), t.w(rstd), t.r(inp), t.r(w), t.r(b), R, C);
  };
}
void case_layernorm_backward(Case& c) {
  const int dinp = c.act(RC, C), dw = c.f32(C, R), db = c.f32(C, R), dout = c.act(RC), inp = c.act(RC), w = c.act(C),
            b = c.act(C), mean = c.f32(R), rstd = c.f32(R), out = c.act(RC);
  c.prepare([=](OpsBackend& o, const Bufs& t) {
    o.layernorm_forward(t.w(out), t.w(mean), t.w(rstd), t.r(inp), t.r(w), t.r(b), R, C);
  });
  c.call = [=](OpsBackend& o, const Bufs& t) {
    o.layernorm_backward(t.w(dinp), t.w(dw), t.w(db), t.r(dout), t.r(inp), t.r(w), t.r(mean), t.r(rstd), R, C);
  };
}
void case_gelu_forward(Case& c) {
  const int out = c.act(RC), inp = c.act(RC);
  c.call = [=](OpsBackend& o, const Bufs& t) { o.gelu_forward(t.w(out), t.r(inp), RC); };
}
void case_gelu_backward(Case& c) {
  const int dinp = c.act(RC), inp = c.act(RC), dout = c.act(RC);
  c.call = [=](OpsBackend& o, const Bufs& t) { o.gelu_backward(t.w(dinp), t.r(inp), t.r(dout), RC); };
}
void case_add_inplace(Case& c) {
  const int acc = c.act(RC), x = c.act(RC);
  c.call = [=](OpsBackend& o, const Bufs& t) { o.add_inplace(t.w(acc), t.r(x), RC); };
}
void case_attention_forward(Case& c) {
  const int out = c.act(RC, T), att = c.f32(sz(B) * H * T, T), qkv = c.act(3 * RC);
  c.call = [=](OpsBackend& o, const Bufs& t) { o.attention_forward(t.w(out), t.w(att), t.r(qkv), B, T, C, H); };
}
void case_attention_backward(Case& c) {
  const int dqkv = c.act(3 * RC, T), dout = c.act(RC), qkv = c.act(3 * RC), att = c.f32(sz(B) * H * T), out = c.act(RC);
  c.prepare([=](OpsBackend& o, const Bufs& t) { o.attention_forward(t.w(out), t.w(att), t.r(qkv), B, T, C, H); });
  c.call = [=](OpsBackend& o, const Bufs& t) {
    o.attention_backward(t.w(dqkv), t.r(dout), t.r(qkv), t.r(att), t.r(out), B, T, C, H);
  };
}
void case_encoder_forward(Case& c) {
  const int out = c.act(RC), wte = c.act(sz(V) * C, 1, 0.3f), wpe = c.act(sz(T) * C, 1, 0.3f), tok = c.tokens(R, V);
  c.call = [=](OpsBackend& o, const Bufs& t) { o.encoder_forward(t.w(out), t.ids(tok), t.r(wte), t.r(wpe), B, T, C); };
}
void case_encoder_backward(Case& c) {
  const int dwte = c.f32(sz(V) * C, R), dwpe = c.f32(sz(T) * C, B), dout = c.act(RC), tok = c.tokens(R, V);
  c.call = [=](OpsBackend& o, const Bufs& t) {
    o.encoder_backward(t.w(dwte), t.w(dwpe), t.r(dout), t.ids(tok), B, T, C);
  };
}
void case_lm_head_forward(Case& c) {
  const int probs = c.logits(R, VH, C), losses = c.f32(R, VH), x = c.act(RC), wte = c.act(sz(VH) * C, 1, 0.3f),
            tg = c.tokens(R, VH);
  c.t[static_cast<std::size_t>(losses)].tol_t = c.S;  // from the logits, stored in S before the softmax
  c.call = [=](OpsBackend& o, const Bufs& t) {
    o.lm_head_forward(t.w(probs), t.w(losses), t.r(x), t.r(wte), t.ids(tg), R, C, VH);
  };
}
void case_lm_head_backward(Case& c) {
  const int dx = c.act(RC, VH), dwte = c.f32(sz(VH) * C, R), dl = c.logits(R, VH), probs = c.logits(R, VH),
            x = c.act(RC), wte = c.act(sz(VH) * C, 1, 0.3f), losses = c.f32(R), tg = c.tokens(R, VH);
  c.prepare([=](OpsBackend& o, const Bufs& t) {
    o.lm_head_forward(t.w(probs), t.w(losses), t.r(x), t.r(wte), t.ids(tg), R, C, VH);
  });
  c.t[static_cast<std::size_t>(dwte)].tol_t = c.S;  // from dlogits, stored in S before the GEMM
  c.call = [=](OpsBackend& o, const Bufs& t) {
    o.lm_head_backward(t.w(dx), t.w(dwte), t.w(dl), t.r(probs), t.r(x), t.r(wte), t.ids(tg), 1.0f / R, R, C, VH);
  };
}
void case_copy(Case& c) {
  const int dst = c.act(RC), src = c.act(RC);
  c.call = [=](OpsBackend& o, const Bufs& t) { o.copy(t.w(dst), t.r(src), RC - 5); };  // the tail stays as it was
}
void case_zero(Case& c) {
  const int p = c.act(RC);
  c.call = [=](OpsBackend& o, const Bufs& t) { o.zero(t.w(p), RC - 5); };
}
void case_rmsnorm_forward(Case& c) {
  const int out = c.act(RC, C), rstd = c.f32(R, C), inp = c.act(RC), w = c.act(C);
  c.call = [=](OpsBackend& o, const Bufs& t) { o.rmsnorm_forward(t.w(out), t.w(rstd), t.r(inp), t.r(w), R, C, 1e-5f); };
}
void case_rmsnorm_backward(Case& c) {
  const int dinp = c.act(RC, C), dw = c.f32(C, R), dout = c.act(RC), inp = c.act(RC), w = c.act(C), rstd = c.f32(R),
            out = c.act(RC);
  c.prepare(
      [=](OpsBackend& o, const Bufs& t) { o.rmsnorm_forward(t.w(out), t.w(rstd), t.r(inp), t.r(w), R, C, 1e-5f); });
  c.call = [=](OpsBackend& o, const Bufs& t) {
    o.rmsnorm_backward(t.w(dinp), t.w(dw), t.r(dout), t.r(inp), t.r(w), t.r(rstd), R, C);
  };
}
void case_rope_apply(Case& c) {  // forward, then backward: the rotation by the opposite angle
  const int x = c.act(sz(R) * LH * D, 2), co = c.f32(sz(T) * D / 2), si = c.f32(sz(T) * D / 2);
  std::vector<float> cos_t, sin_t;
  ops::rope_tables(ops::rope_inv_freq(D, 10000.0), T, cos_t, sin_t);
  for (std::size_t j = 0; j < cos_t.size(); ++j) {
    store(c.t[static_cast<std::size_t>(co)].init, DType::fp32, j, cos_t[j]);
    store(c.t[static_cast<std::size_t>(si)].init, DType::fp32, j, sin_t[j]);
  }
  c.call = [=](OpsBackend& o, const Bufs& t) { o.rope_apply(t.w(x), t.r(co), t.r(si), R, T, LH, D, false); };
}
void case_swiglu_forward(Case& c) {
  const int out = c.act(sz(R) * F), gate = c.act(sz(R) * F), up = c.act(sz(R) * F);
  c.call = [=](OpsBackend& o, const Bufs& t) { o.swiglu_forward(t.w(out), t.r(gate), t.r(up), sz(R) * F); };
}
void case_swiglu_backward(Case& c) {
  const int dg = c.act(sz(R) * F), du = c.act(sz(R) * F), dout = c.act(sz(R) * F), gate = c.act(sz(R) * F),
            up = c.act(sz(R) * F);
  c.call = [=](OpsBackend& o, const Bufs& t) {
    o.swiglu_backward(t.w(dg), t.w(du), t.r(dout), t.r(gate), t.r(up), sz(R) * F);
  };
}
// Each attention case runs its op twice: without a window and with a sliding window of 7 keys.
constexpr int kWindow = 7;
void case_gqa_attention_forward(Case& c) {
  const int out = c.act(sz(R) * LH * D, T), att = c.f32(sz(B) * LH * T, T), q = c.act(sz(R) * LH * D),
            k = c.act(sz(R) * KV * D), v = c.act(sz(R) * KV * D), wout = c.act(sz(R) * LH * D, kWindow),
            watt = c.f32(sz(B) * LH * T, kWindow);
  c.call = [=](OpsBackend& o, const Bufs& t) {
    o.gqa_attention_forward(t.w(out), t.w(att), t.r(q), t.r(k), t.r(v), B, T, LH, KV, D, 0);
    o.gqa_attention_forward(t.w(wout), t.w(watt), t.r(q), t.r(k), t.r(v), B, T, LH, KV, D, kWindow);
  };
}
void case_gqa_attention_backward(Case& c) {
  const double kv_terms = static_cast<double>(T) * (LH / KV);  // a key/value head sums its query heads' rows
  const int dq = c.act(sz(R) * LH * D, T), dk = c.act(sz(R) * KV * D, kv_terms), dv = c.act(sz(R) * KV * D, kv_terms),
            dout = c.act(sz(R) * LH * D), q = c.act(sz(R) * LH * D), k = c.act(sz(R) * KV * D),
            v = c.act(sz(R) * KV * D), att = c.f32(sz(B) * LH * T), out = c.act(sz(R) * LH * D),
            wdq = c.act(sz(R) * LH * D, kWindow), wdk = c.act(sz(R) * KV * D, kv_terms),
            wdv = c.act(sz(R) * KV * D, kv_terms), watt = c.f32(sz(B) * LH * T), wout = c.act(sz(R) * LH * D);
  c.prepare([=](OpsBackend& o, const Bufs& t) {
    o.gqa_attention_forward(t.w(out), t.w(att), t.r(q), t.r(k), t.r(v), B, T, LH, KV, D, 0);
    o.gqa_attention_forward(t.w(wout), t.w(watt), t.r(q), t.r(k), t.r(v), B, T, LH, KV, D, kWindow);
  });
  c.call = [=](OpsBackend& o, const Bufs& t) {
    o.gqa_attention_backward(t.w(dq), t.w(dk), t.w(dv), t.r(dout), t.r(q), t.r(k), t.r(v), t.r(att), t.r(out), B, T, LH,
                             KV, D, 0);
    o.gqa_attention_backward(t.w(wdq), t.w(wdk), t.w(wdv), t.r(dout), t.r(q), t.r(k), t.r(v), t.r(watt), t.r(wout), B,
                             T, LH, KV, D, kWindow);
  };
}
void case_embedding_forward(Case& c) {
  const int out = c.act(RC), wte = c.act(sz(V) * C), tok = c.tokens(R, V);
  c.call = [=](OpsBackend& o, const Bufs& t) { o.embedding_forward(t.w(out), t.ids(tok), t.r(wte), R, C); };
}
void case_embedding_backward(Case& c) {
  const int dwte = c.f32(sz(V) * C, R), dout = c.act(RC), tok = c.tokens(R, V);
  c.call = [=](OpsBackend& o, const Bufs& t) { o.embedding_backward(t.w(dwte), t.r(dout), t.ids(tok), R, C); };
}
// Generation's ops (the fast kernels refuse them: generation runs on the reference kernels).
void case_attention_decode(Case& c) {
  constexpr int Q = 3, pos = 9, qs = LH * D + 8, kvs = KV * D + 4;
  const int out = c.act(sz(Q) * LH * D, pos + Q), q = c.act(sz(Q) * qs), k = c.act(sz(pos + Q) * kvs),
            v = c.act(sz(pos + Q) * kvs);
  c.call = [=](OpsBackend& o, const Bufs& t) {
    o.attention_decode(t.w(out), t.r(q), t.r(k), t.r(v), Q, pos, LH, KV, D, qs, kvs);
  };
}
void case_lm_head_logits(Case& c) {
  const int logits = c.act(sz(R) * V, C), x = c.act(RC), wte = c.act(sz(V) * C, 1, 0.3f);
  c.call = [=](OpsBackend& o, const Bufs& t) { o.lm_head_logits(t.w(logits), t.r(x), t.r(wte), R, C, V); };
}
// The ops the fast kernels do not have: on the GPU each must raise its error, not compute.
bool fast_kernels_refuse(const std::string& op) { return op == "attention_decode" || op == "lm_head_logits"; }

struct OpEntry {
  const char* name;
  void (*make)(Case&);
};
#define ZINF_CASE_ENTRY(name, info, params, args) OpEntry{#name, &case_##name},
const OpEntry kOps[] = {ZINF_OPS(ZINF_CASE_ENTRY)};
#undef ZINF_CASE_ENTRY

// The matmuls again at widths that are no multiples of 8. The models' shapes never have them, but a
// user's may, and there cuBLASLt has no fused epilogue: the fast ops take their unfused path (the
// GEMM into an fp32 block, then bias and GELU from it with one rounding; the bias gradient by a
// column sum instead of the BGRADB epilogue).
constexpr int RU = 13, ICU = 20, OCU = 44;
void case_matmul_forward_unaligned(Case& c) {
  const int out = c.act(sz(RU) * OCU, ICU), inp = c.act(sz(RU) * ICU), w = c.act(sz(ICU) * OCU, 1, 0.2f),
            b = c.act(OCU);
  c.call = [=](OpsBackend& o, const Bufs& t) { o.matmul_forward(t.w(out), t.r(inp), t.r(w), t.r(b), RU, ICU, OCU); };
}
void case_matmul_gelu_forward_unaligned(Case& c) {
  const int pre = c.act(sz(RU) * OCU, ICU), out = c.act(sz(RU) * OCU, ICU), inp = c.act(sz(RU) * ICU),
            w = c.act(sz(ICU) * OCU, 1, 0.2f), b = c.act(OCU);
  c.call = [=](OpsBackend& o, const Bufs& t) {
    o.matmul_gelu_forward(t.w(pre), t.w(out), t.r(inp), t.r(w), t.r(b), RU, ICU, OCU);
  };
}
void case_matmul_backward_unaligned(Case& c) {
  const int dinp = c.act(sz(RU) * ICU, OCU), dw = c.f32(sz(ICU) * OCU, RU), db = c.f32(OCU, RU),
            dout = c.act(sz(RU) * OCU), inp = c.act(sz(RU) * ICU), w = c.act(sz(ICU) * OCU, 1, 0.2f);
  c.call = [=](OpsBackend& o, const Bufs& t) {
    o.matmul_backward(t.w(dinp), t.w(dw), t.w(db), t.r(dout), t.r(inp), t.r(w), RU, ICU, OCU);
  };
}

// Every op of the seam, then the unaligned matmuls.
const std::vector<OpEntry> kCases = [] {
  std::vector<OpEntry> v(std::begin(kOps), std::end(kOps));
  v.push_back({"matmul_forward, unaligned widths", &case_matmul_forward_unaligned});
  v.push_back({"matmul_gelu_forward, unaligned widths", &case_matmul_gelu_forward_unaligned});
  v.push_back({"matmul_backward, unaligned widths", &case_matmul_backward_unaligned});
  return v;
}();

std::vector<Bytes> run_on_host(const Case& c, OpsBackend& ops) {
  HostSet h;
  for (const Tensor& x : c.t) h.f.push_back(x.init);
  h.i = c.i;
  c.call(ops, h.bufs(c.t));
  return h.f;
}

// A tensor as the backend lays it out: the LM head's logits with rows `ld` apart, the pad columns
// filled with 0xFF bytes (a NaN in every float type); anything else as it is.
constexpr unsigned char kPad = 0xFF;
int logits_ld(const Tensor& x, const OpsBackend& ops) { return logits_row_stride(x.cols, ops.logits_rows()); }
Bytes laid_out(const Tensor& x, const OpsBackend& ops) {
  if (x.rows == 0) return x.init;
  const std::size_t e = dtype_bytes(x.t), row = sz(x.cols) * e, ld = sz(logits_ld(x, ops)) * e;
  Bytes b(sz(x.rows) * ld, kPad);
  for (std::size_t r = 0; r < sz(x.rows); ++r) std::memcpy(b.data() + r * ld, x.init.data() + r * row, row);
  return b;
}
// Back to the packed layout the comparisons use; the pad columns must hold kPad still.
Bytes packed(const Tensor& x, const OpsBackend& ops, const Bytes& b) {
  if (x.rows == 0) return b;
  const std::size_t e = dtype_bytes(x.t), row = sz(x.cols) * e, ld = sz(logits_ld(x, ops)) * e;
  Bytes out(sz(x.rows) * row);
  int written = 0;
  for (std::size_t r = 0; r < sz(x.rows); ++r) {
    std::memcpy(out.data() + r * row, b.data() + r * ld, row);
    written += static_cast<int>(std::count_if(b.begin() + static_cast<long>(r * ld + row),
                                              b.begin() + static_cast<long>((r + 1) * ld),
                                              [](unsigned char u) { return u != kPad; }));
  }
  EXPECT_EQ(written, 0) << "bytes of the logits' pad columns were written";
  return out;
}

std::vector<Bytes> run_on_gpu(const Case& c, Device& dev, OpsBackend& ops) {
  std::vector<DeviceBuffer> keep;
  Bufs b;
  for (const Tensor& x : c.t) {
    const Bytes image = laid_out(x, ops);
    keep.emplace_back(dev, image.size(), "fast ops twin test");
    dev.copy_to_device(keep.back().as<void>(), image.data(), image.size(), StreamRole::compute);
    dev.synchronize(StreamRole::compute);  // `image` is a local: the copy must be done before it goes
    b.p.push_back(keep.back().as<void>()), b.t.push_back(x.t), b.n.push_back(image.size() / dtype_bytes(x.t));
  }
  for (const auto& v : c.i) {
    keep.emplace_back(dev, v.size() * sizeof(int), "fast ops twin test");
    dev.copy_to_device(keep.back().as<void>(), v.data(), v.size() * sizeof(int), StreamRole::compute);
    b.i.push_back(keep.back().as<int>());
  }
  c.call(ops, b);
  std::vector<Bytes> out;
  for (std::size_t k = 0; k < c.t.size(); ++k) {
    out.emplace_back(b.n[k] * dtype_bytes(c.t[k].t));
    dev.copy_to_host(out.back().data(), b.p[k], out.back().size(), StreamRole::compute);
  }
  dev.synchronize(StreamRole::compute);
  for (std::size_t k = 0; k < c.t.size(); ++k) out[k] = packed(c.t[k], ops, out[k]);
  return out;
}

// The cases themselves, on every build: each runs on the twin (its views sized and typed as the
// twin requires), changes some tensor, and gives the same bits on another thread count.
TEST(FastOpsTwin, EveryCaseRunsOnTheTwinWhateverItsThreadCount) {
  const backends::Backend& cpu = backends::backend_for(DeviceType::cpu);
  backends::DeviceSpec spec;
  spec.budget_bytes = std::size_t{1} << 20;
  auto cdev = cpu.make_device(spec);
  for (Precision p : {Precision::bf16, Precision::fp32}) {
    const DType S = dtype_of(p);
    auto one = cpu.make_ops(*cdev, p, 1, Kernels::fast), two = cpu.make_ops(*cdev, p, 2, Kernels::fast);
    for (const OpEntry& e : kCases) {
      SCOPED_TRACE(std::string(to_string(S)) + " " + e.name);
      Case c;
      c.S = S;
      c.twin = one.get();
      e.make(c);
      ASSERT_TRUE(c.call);
      const auto a = run_on_host(c, *one), b = run_on_host(c, *two);
      bool changed = false;
      for (std::size_t k = 0; k < a.size(); ++k) {
        EXPECT_TRUE(a[k] == b[k]) << "tensor " << k << " depends on the thread count";
        changed |= a[k] != c.t[k].init;
      }
      EXPECT_TRUE(changed) << "the case's call changes nothing";
    }
  }
}

TEST(FastOpsTwin, EveryOpOnTheGpuMatchesTheCpuTwinAndRepeatsBitwise) {
  const cuda::GpuQuery q = cuda::query_gpus();
  if (q.gpus.empty()) GTEST_SKIP() << "no GPU: " << q.status;
  const backends::Backend& gpu = backends::backend_for(DeviceType::cuda);
  const backends::Backend& cpu = backends::backend_for(DeviceType::cpu);
  backends::DeviceSpec spec;
  spec.budget_bytes = std::size_t{1} << 30;
  auto gdev = gpu.make_device(spec);
  auto cdev = cpu.make_device(spec);
  // Each attention of the fast kernels: the wmma kernel and, where this zinf has cuDNN, cuDNN's
  // (16-bit only: fp32 runs keep the wmma path's FMA tiles whatever device.attention says).
  struct Run {
    Precision p;
    Attention attention;
  };
  std::vector<Run> runs{{Precision::bf16, Attention::wmma}, {Precision::fp32, Attention::wmma}};
  if (backends::cudnn_built()) runs.push_back({Precision::bf16, Attention::cudnn});
  for (const Run& run : runs) {
    const Precision p = run.p;
    const DType S = dtype_of(p);
    SCOPED_TRACE(std::string("device.attention ") + std::string(to_string(run.attention)));
    auto fast = gpu.make_ops(*gdev, p, 1, Kernels::fast, run.attention);
    auto twin = cpu.make_ops(*cdev, p, 2, Kernels::fast);
    ASSERT_EQ(fast->storage_dtype(), S);
    ASSERT_EQ(twin->storage_dtype(), S);
    ASSERT_EQ(fast->logits_rows(), LogitsRows::padded);
    ASSERT_EQ(twin->logits_rows(), LogitsRows::packed);
    ASSERT_NE(logits_row_stride(VH, LogitsRows::padded), VH) << "the LM head cases must exercise the padding";
    for (const OpEntry& e : kCases) {
      SCOPED_TRACE(std::string(to_string(S)) + " " + e.name);
      Case c;
      c.S = S;
      c.twin = twin.get();
      e.make(c);
      if (fast_kernels_refuse(e.name)) {
        EXPECT_THROW(run_on_gpu(c, *gdev, *fast), Error) << "the fast kernels have no " << e.name;
        continue;
      }
      const auto want = run_on_host(c, *twin);
      const auto got = run_on_gpu(c, *gdev, *fast);
      const auto again = run_on_gpu(c, *gdev, *fast);
      ASSERT_EQ(got.size(), want.size());
      for (std::size_t k = 0; k < got.size(); ++k) {
        const Tensor& x = c.t[k];
        EXPECT_TRUE(got[k] == again[k]) << "tensor " << k << ": two GPU runs differ";
        double scale = 0;
        for (std::size_t j = 0; j < x.n; ++j) scale = std::max(scale, std::fabs(double{widen(want[k], x.t, j)}));
        const double ulps = x.tol_t == DType::fp32 ? 64 : 4;
        const double tol = ulps * eps(x.tol_t) * std::sqrt(x.k) * std::max(scale, 1e-30);
        int bad = 0;
        double worst = 0;
        for (std::size_t j = 0; j < x.n; ++j) {
          const double d = std::fabs(double{widen(got[k], x.t, j)} - double{widen(want[k], x.t, j)});
          worst = std::max(worst, d);
          if (!(d <= tol) && bad++ < 3)
            ADD_FAILURE() << "tensor " << k << "[" << j << "]: GPU " << widen(got[k], x.t, j) << ", twin "
                          << widen(want[k], x.t, j) << " (tolerance " << tol << ")";
        }
        RecordProperty(std::string(to_string(S)) + "." + std::string(to_string(run.attention)) + "." + e.name + ".t" +
                           std::to_string(k) + ".worst_over_tol",
                       std::to_string(worst / tol));
      }
    }
  }
}

// What the cuDNN fallback tests share: a device, the twin and the wmma kernels, and a case by name.
struct FallbackRig {
  const backends::Backend& gpu = backends::backend_for(DeviceType::cuda);
  const backends::Backend& cpu = backends::backend_for(DeviceType::cpu);
  std::unique_ptr<Device> gdev, cdev;
  std::unique_ptr<OpsBackend> twin, wmma;
  FallbackRig() {
    backends::DeviceSpec spec;
    spec.budget_bytes = std::size_t{1} << 30;
    gdev = gpu.make_device(spec);
    cdev = cpu.make_device(spec);
    twin = cpu.make_ops(*cdev, Precision::bf16, 2, Kernels::fast);
    wmma = gpu.make_ops(*gdev, Precision::bf16, 1, Kernels::fast, Attention::wmma);
  }
  std::unique_ptr<OpsBackend> cudnn() { return gpu.make_ops(*gdev, Precision::bf16, 1, Kernels::fast, Attention::cudnn); }
  Case make(const char* name) {
    Case c;
    c.S = DType::bf16;
    c.twin = twin.get();
    for (const OpEntry& e : kCases)
      if (std::string(e.name) == name) {
        e.make(c);
        return c;
      }
    throw Error(std::string("no case ") + name);
  }
};

// The cuDNN fallback that cannot surprise: a shape cuDNN refuses while its plans are built runs the
// wmma kernel (the same bits as device.attention wmma) with one line naming the shape, said once;
// a failure while running a plan is an Error, never a switch. On the executor the fake's test hooks
// refuse the shape (ZINF_CUDNN_FAKE_REFUSE: the query tensor's dims [B, H, T, D]) and fail the run
// (ZINF_CUDNN_FAKE_FAIL_EXECUTE); on a GPU, with the real cuDNN, the test skips.
TEST(FastOpsTwin, CudnnRefusedShapeRunsTheWmmaKernelAndARunFailureThrows) {
  const cuda::GpuQuery q = cuda::query_gpus();
  if (q.gpus.empty()) GTEST_SKIP() << "no GPU: " << q.status;
  if (!backends::cudnn_built()) GTEST_SKIP() << "this zinf was built without cuDNN (ZINF_CUDNN)";
#if !ZINF_CUDA_EXECUTOR
  GTEST_SKIP() << "needs the executor's cuDNN fake, whose hooks refuse a shape and fail a run";
#else
  FallbackRig rig;
  Device* gdev = rig.gdev.get();
  for (const char* name : {"gqa_attention_forward", "gqa_attention_backward"}) {
    SCOPED_TRACE(name);
    const Case c = rig.make(name);
    const std::string dims = std::to_string(B) + "," + std::to_string(LH) + "," + std::to_string(T) + "," +
                             std::to_string(D);
    setenv("ZINF_CUDNN_FAKE_REFUSE", dims.c_str(), 1);
    auto cudnn = rig.cudnn();
    ::testing::internal::CaptureStderr();
    const auto got = run_on_gpu(c, *gdev, *cudnn);
    const auto again = run_on_gpu(c, *gdev, *cudnn);
    const std::string said = ::testing::internal::GetCapturedStderr();
    unsetenv("ZINF_CUDNN_FAKE_REFUSE");
    const auto want = run_on_gpu(c, *gdev, *rig.wmma);
    EXPECT_TRUE(got == want) << "a refused shape must run the wmma kernel";
    EXPECT_TRUE(again == want);
    std::size_t lines = 0;
    for (std::size_t at = said.find("cuDNN refused attention"); at != std::string::npos;
         at = said.find("cuDNN refused attention", at + 1))
      ++lines;
    // said once per shape: the case's attention without and with its window
    EXPECT_EQ(lines, 2u) << "said once per shape: " << said;
    EXPECT_NE(said.find("B " + std::to_string(B) + ", T " + std::to_string(T) + ", H " + std::to_string(LH) +
                        ", KV " + std::to_string(KV) + ", D " + std::to_string(D)),
              std::string::npos)
        << "the line names the shape: " << said;

    // Accepted at plan time, failing while it runs: an Error, not the wmma kernel.
    auto failing = rig.cudnn();
    setenv("ZINF_CUDNN_FAKE_FAIL_EXECUTE", "1", 1);
    EXPECT_THROW(run_on_gpu(c, *gdev, *failing), Error);
    unsetenv("ZINF_CUDNN_FAKE_FAIL_EXECUTE");
  }
#endif
}

// cuDNN accepting a shape's forward and refusing its backward — the fake refusing graphs with
// RESHAPE nodes (the backward has them, the forward has not), or a cuDNN version whose backward zinf
// refuses (9.12 and 9.15 at this sequence length, 40, not a multiple of 128; at 9.10.0 and 9.10.1 the
// forward is refused too, FlashAttention.CudnnRulesFollowTheFrontendByVersion): the forward runs cuDNN's
// plan, the backward the wmma kernel, and one line a shape says so.
TEST(FastOpsTwin, CudnnRefusedBackwardRunsTheWmmaBackwardAfterCudnnsForward) {
  const cuda::GpuQuery q = cuda::query_gpus();
  if (q.gpus.empty()) GTEST_SKIP() << "no GPU: " << q.status;
  if (!backends::cudnn_built()) GTEST_SKIP() << "this zinf was built without cuDNN (ZINF_CUDNN)";
#if !ZINF_CUDA_EXECUTOR
  GTEST_SKIP() << "needs the executor's cuDNN fake, whose hook refuses the backward's graph";
#else
  FallbackRig rig;
  Device* gdev = rig.gdev.get();
  auto cudnn = rig.cudnn();
  const Case fwd = rig.make("gqa_attention_forward"), bwd = rig.make("gqa_attention_backward");
  ASSERT_FALSE(fwd.t.empty());
  ASSERT_FALSE(bwd.t.empty());
  static_assert(T % 128 != 0, "the cuDNN 9.15 case needs a sequence length cuDNN 9.15's backward is refused at");
  const auto want_fwd = run_on_gpu(fwd, *gdev, *cudnn);
  const auto want_bwd = run_on_gpu(bwd, *gdev, *rig.wmma);
  const std::pair<const char*, const char*> hooks[] = {{"ZINF_CUDNN_FAKE_REFUSE_RESHAPE", "1"},
                                                       {"ZINF_CUDNN_FAKE_VERSION", "91200"},
                                                       {"ZINF_CUDNN_FAKE_VERSION", "91500"}};
  for (const auto& [hook, value] : hooks) {
    SCOPED_TRACE(std::string(hook) + "=" + value);
    setenv(hook, value, 1);
    auto mixed = rig.cudnn();
    ::testing::internal::CaptureStderr();
    const auto fwd_got = run_on_gpu(fwd, *gdev, *mixed);  // builds the plans: the backward's is refused
    const auto bwd_got = run_on_gpu(bwd, *gdev, *mixed);
    const std::string said = ::testing::internal::GetCapturedStderr();
    unsetenv(hook);
    EXPECT_TRUE(fwd_got == want_fwd) << "the forward runs cuDNN's plan";
    EXPECT_TRUE(bwd_got == want_bwd) << "the backward runs the wmma kernel";
    std::size_t lines = 0;
    for (std::size_t at = said.find("cuDNN refused the attention backward"); at != std::string::npos;
         at = said.find("cuDNN refused the attention backward", at + 1))
      ++lines;
    EXPECT_EQ(lines, 2u) << "said once per shape (without and with the window): " << said;
    EXPECT_EQ(said.find("cuDNN refused attention at"), std::string::npos) << "the forward was accepted: " << said;
  }
#endif
}

TEST(FastOpsTwin, AttentionChoicesOutsideTheFastKernelsAreRefused) {
  const cuda::GpuQuery q = cuda::query_gpus();
  if (q.gpus.empty()) GTEST_SKIP() << "no GPU: " << q.status;
  const backends::Backend& gpu = backends::backend_for(DeviceType::cuda);
  backends::DeviceSpec spec;
  spec.budget_bytes = std::size_t{1} << 30;
  auto gdev = gpu.make_device(spec);
  EXPECT_THROW(gpu.make_ops(*gdev, Precision::bf16, 1, Kernels::fast, Attention::reference), ConfigError);
  if (!backends::cudnn_built()) {
    EXPECT_THROW(gpu.make_ops(*gdev, Precision::bf16, 1, Kernels::fast, Attention::cudnn), ConfigError);
  }
}

}  // namespace
}  // namespace zinf
