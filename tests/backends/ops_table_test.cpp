// ops_table_test.cpp — every op of the seam (model/op_list.h), driven by the list itself: each op has
// a case here (deterministic random inputs and one call), and the test runs it on a backend and on
// the CPU reference and compares every tensor the op can touch, inputs included.
//   * the CPU backend with another thread count: bitwise equal (the reference's results do not
//     depend on the thread count);
//   * the CPU backend wrapped as compute-stream work on the asynchronous, jittered CPU device, and
//     the profiling wrapper around that: bitwise equal (the wrappers only forward);
//   * the CUDA backend where a GPU is present (skipped with the reason otherwise), within the
//     tolerances of cuda_ops_test.cpp: elementwise ops 1e-6 relative, GEMMs and reductions 1e-4
//     relative + 1e-5 absolute.
// The cases are declared and tabled from the list: an op added to the list without a case here does
// not compile, and a case that calls another op than its own fails.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/random_floats.h"
#include "cpu/cpu_ops.h"
#include "cpu/ops_stream.h"
#include "model/backend.h"
#include "model/host_math.h"
#include "model/op_list.h"
#include "model/ops_profile.h"
#include "zinf/backends/backend.h"
#include "zinf/backends/gpu.h"
#include "zinf/device.h"

namespace zinf {
namespace {

using VF = std::vector<float>;
using VI = std::vector<int>;

// The tensors of one case, as one backend sees them (host or device memory).
struct Bufs {
  std::vector<float*> f;
  std::vector<std::size_t> n;
  std::vector<int*> i;
  TensorView w(int k) const { return {f[static_cast<std::size_t>(k)], n[static_cast<std::size_t>(k)]}; }
  ConstTensorView r(int k) const { return {f[static_cast<std::size_t>(k)], n[static_cast<std::size_t>(k)]}; }
  const int* ids(int k) const { return i[static_cast<std::size_t>(k)]; }
};

// One op's case: the initial values of its tensors (outputs too: accumulating ops add to them) and
// the call, plus the CUDA tolerance.
struct Case {
  std::vector<VF> f;
  std::vector<VI> i;
  std::function<void(OpsBackend&, const Bufs&)> call;
  double rel = 1e-4, abs = 1e-5;

  int rand(std::size_t n, float scale = 1.0f) {
    f.push_back(randf(n, static_cast<std::uint32_t>(101 + f.size() * 7919 + i.size()), scale));
    return static_cast<int>(f.size() - 1);
  }
  // With `masked`, every third id is kIgnoreTarget (a target the LM head skips).
  int tokens(std::size_t n, int vocab, bool masked = false) {
    std::mt19937 rng(static_cast<std::uint32_t>(7 + i.size()));
    VI v(n);
    for (int& t : v) t = static_cast<int>(rng() % static_cast<unsigned>(vocab));
    if (masked)
      for (std::size_t k = 1; k < n; k += 3) v[k] = kIgnoreTarget;
    i.push_back(std::move(v));
    return static_cast<int>(i.size() - 1);
  }
  float* host(int k) { return f[static_cast<std::size_t>(k)].data(); }
  void elementwise() { rel = 1e-6, abs = 1e-7; }
};

// Records the name of every op called through it (generated from the list, like the wrappers), so
// a case is known to call its own op. Declared before the cases' sizes, which its parameters would
// shadow.
class Recorder final : public OpsBackend {
 public:
  Recorder(OpsBackend& in, std::vector<std::string>& log) : in_(in), log_(log) {}
#define ZINF_RECORD_OP(name, info, params, args) \
  void name params override {                    \
    log_.push_back(#name);                       \
    in_.name args;                               \
  }
  ZINF_OPS(ZINF_RECORD_OP)
#undef ZINF_RECORD_OP

 private:
  OpsBackend& in_;
  std::vector<std::string>& log_;
};

// The reference's threads, for the inputs a backward case makes with its forward op.
ops::ChunkPool& ref_par() {
  static ops::ChunkPool par(1);
  return par;
}

constexpr int B = 2, T = 9, C = 24, H = 3, V = 37, R = B * T;
constexpr int LH = 4, KV = 2, D = C / LH, F = 40;  // the llama cases' heads and MLP width
constexpr std::size_t RC = static_cast<std::size_t>(R) * C;
constexpr std::size_t sz(long long x) { return static_cast<std::size_t>(x); }

// ---- the cases, one per op of the list ---------------------------------------------------------
#define ZINF_DECLARE_CASE(name, info, params, args) void case_##name(Case& c);
ZINF_OPS(ZINF_DECLARE_CASE)
#undef ZINF_DECLARE_CASE

void case_matmul_forward(Case& c) {
  const int out = c.rand(sz(R) * 3 * C), inp = c.rand(RC), w = c.rand(sz(C) * 3 * C), b = c.rand(3 * C);
  c.call = [=](OpsBackend& o, const Bufs& t) { o.matmul_forward(t.w(out), t.r(inp), t.r(w), t.r(b), R, C, 3 * C); };
}
void case_matmul_gelu_forward(Case& c) {
  const int pre = c.rand(sz(R) * 4 * C), out = c.rand(sz(R) * 4 * C), inp = c.rand(RC), w = c.rand(sz(C) * 4 * C),
            b = c.rand(4 * C);
  c.call = [=](OpsBackend& o, const Bufs& t) {
    o.matmul_gelu_forward(t.w(pre), t.w(out), t.r(inp), t.r(w), t.r(b), R, C, 4 * C);
  };
}
void case_matmul_backward(Case& c) {
  const int dinp = c.rand(RC), dw = c.rand(sz(C) * 4 * C), db = c.rand(4 * C), dout = c.rand(sz(R) * 4 * C),
            inp = c.rand(RC), w = c.rand(sz(C) * 4 * C);
  c.call = [=](OpsBackend& o, const Bufs& t) {
    o.matmul_backward(t.w(dinp), t.w(dw), t.w(db), t.r(dout), t.r(inp), t.r(w), R, C, 4 * C);
  };
}
void case_layernorm_forward(Case& c) {
  const int out = c.rand(RC), mean = c.rand(R), rstd = c.rand(R), inp = c.rand(RC), w = c.rand(C), b = c.rand(C);
  c.call = [=](OpsBackend& o, const Bufs& t) {
    o.layernorm_forward(t.w(out), t.w(mean), t.w(rstd), t.r(inp), t.r(w), t.r(b), R, C);
  };
}
void case_layernorm_backward(Case& c) {
  const int dinp = c.rand(RC), dw = c.rand(C), db = c.rand(C), dout = c.rand(RC), inp = c.rand(RC), w = c.rand(C),
            b = c.rand(C), mean = c.rand(R), rstd = c.rand(R), out = c.rand(RC);
  ops::layernorm_forward(ref_par(), c.host(out), c.host(mean), c.host(rstd), c.host(inp), c.host(w), c.host(b), R, C);
  c.call = [=](OpsBackend& o, const Bufs& t) {
    o.layernorm_backward(t.w(dinp), t.w(dw), t.w(db), t.r(dout), t.r(inp), t.r(w), t.r(mean), t.r(rstd), R, C);
  };
}
void case_gelu_forward(Case& c) {
  const int out = c.rand(RC), inp = c.rand(RC);
  c.elementwise();
  c.call = [=](OpsBackend& o, const Bufs& t) { o.gelu_forward(t.w(out), t.r(inp), RC); };
}
void case_gelu_backward(Case& c) {
  const int dinp = c.rand(RC), inp = c.rand(RC), dout = c.rand(RC);
  c.elementwise();
  c.call = [=](OpsBackend& o, const Bufs& t) { o.gelu_backward(t.w(dinp), t.r(inp), t.r(dout), RC); };
}
void case_add_inplace(Case& c) {
  const int acc = c.rand(RC), x = c.rand(RC);
  c.elementwise();
  c.call = [=](OpsBackend& o, const Bufs& t) { o.add_inplace(t.w(acc), t.r(x), RC); };
}
void case_attention_forward(Case& c) {
  const int out = c.rand(RC), att = c.rand(sz(B) * H * T * T), qkv = c.rand(3 * RC);
  c.rel = 1e-4, c.abs = 1e-6;
  c.call = [=](OpsBackend& o, const Bufs& t) { o.attention_forward(t.w(out), t.w(att), t.r(qkv), B, T, C, H); };
}
void case_attention_backward(Case& c) {
  const int dqkv = c.rand(3 * RC), dout = c.rand(RC), qkv = c.rand(3 * RC), att = c.rand(sz(B) * H * T * T),
            out = c.rand(RC);
  ops::attention_forward(ref_par(), c.host(out), c.host(att), c.host(qkv), B, T, C, H);  // a causal softmax
  c.call = [=](OpsBackend& o, const Bufs& t) {
    o.attention_backward(t.w(dqkv), t.r(dout), t.r(qkv), t.r(att), t.r(out), B, T, C, H);
  };
}
void case_encoder_forward(Case& c) {
  const int out = c.rand(RC), wte = c.rand(sz(V) * C, 0.3f), wpe = c.rand(sz(T) * C, 0.3f), tok = c.tokens(R, V);
  c.elementwise();
  c.call = [=](OpsBackend& o, const Bufs& t) { o.encoder_forward(t.w(out), t.ids(tok), t.r(wte), t.r(wpe), B, T, C); };
}
void case_encoder_backward(Case& c) {
  const int dwte = c.rand(sz(V) * C), dwpe = c.rand(sz(T) * C), dout = c.rand(RC), tok = c.tokens(R, V);
  c.rel = 1e-5, c.abs = 1e-6;
  c.call = [=](OpsBackend& o, const Bufs& t) {
    o.encoder_backward(t.w(dwte), t.w(dwpe), t.r(dout), t.ids(tok), B, T, C);
  };
}
void case_lm_head_forward(Case& c) {
  const int probs = c.rand(sz(R) * V), losses = c.rand(R), x = c.rand(RC), wte = c.rand(sz(V) * C, 0.3f),
            tg = c.tokens(R, V, /*masked=*/true);
  c.rel = 1e-4, c.abs = 1e-6;
  c.call = [=](OpsBackend& o, const Bufs& t) {
    o.lm_head_forward(t.w(probs), t.w(losses), t.r(x), t.r(wte), t.ids(tg), R, C, V);
  };
}
void case_lm_head_backward(Case& c) {
  const int dx = c.rand(RC), dwte = c.rand(sz(V) * C), dl = c.rand(sz(R) * V), probs = c.rand(sz(R) * V),
            x = c.rand(RC), wte = c.rand(sz(V) * C, 0.3f), losses = c.rand(R), tg = c.tokens(R, V, true);
  ops::lm_head_forward(ref_par(), c.host(probs), c.host(losses), c.host(x), c.host(wte),
                       c.i[static_cast<std::size_t>(tg)].data(), R, C, V);
  c.rel = 1e-4, c.abs = 1e-6;
  c.call = [=](OpsBackend& o, const Bufs& t) {
    o.lm_head_backward(t.w(dx), t.w(dwte), t.w(dl), t.r(probs), t.r(x), t.r(wte), t.ids(tg), 1.0f / R, R, C, V);
  };
}
void case_copy(Case& c) {
  const int dst = c.rand(RC), src = c.rand(RC);
  c.rel = 0, c.abs = 0;
  c.call = [=](OpsBackend& o, const Bufs& t) { o.copy(t.w(dst), t.r(src), RC - 5); };  // the tail stays as it was
}
void case_zero(Case& c) {
  const int p = c.rand(RC);
  c.rel = 0, c.abs = 0;
  c.call = [=](OpsBackend& o, const Bufs& t) { o.zero(t.w(p), RC - 5); };
}
void case_rmsnorm_forward(Case& c) {
  const int out = c.rand(RC), rstd = c.rand(R), inp = c.rand(RC), w = c.rand(C);
  c.call = [=](OpsBackend& o, const Bufs& t) { o.rmsnorm_forward(t.w(out), t.w(rstd), t.r(inp), t.r(w), R, C, 1e-5f); };
}
void case_rmsnorm_backward(Case& c) {
  const int dinp = c.rand(RC), dw = c.rand(C), dout = c.rand(RC), inp = c.rand(RC), w = c.rand(C), rstd = c.rand(R),
            out = c.rand(RC);
  ops::rmsnorm_forward(ref_par(), c.host(out), c.host(rstd), c.host(inp), c.host(w), R, C, 1e-5f);
  c.call = [=](OpsBackend& o, const Bufs& t) {
    o.rmsnorm_backward(t.w(dinp), t.w(dw), t.r(dout), t.r(inp), t.r(w), t.r(rstd), R, C);
  };
}
void rope_case(Case& c, bool backward) {  // with real cos/sin tables
  const int x = c.rand(sz(R) * LH * D), co = c.rand(sz(T) * D / 2), si = c.rand(sz(T) * D / 2);
  std::vector<float> cos_t, sin_t;
  ops::rope_tables(ops::rope_inv_freq(D, 10000.0), T, cos_t, sin_t);
  c.f[static_cast<std::size_t>(co)] = cos_t, c.f[static_cast<std::size_t>(si)] = sin_t;
  c.rel = 1e-5, c.abs = 1e-6;
  c.call = [=](OpsBackend& o, const Bufs& t) { o.rope_apply(t.w(x), t.r(co), t.r(si), R, T, LH, D, backward); };
}
void case_rope_apply(Case& c) { rope_case(c, false); }  // backward: the same rotation, by the opposite angle
void case_swiglu_forward(Case& c) {
  const int out = c.rand(sz(R) * F), gate = c.rand(sz(R) * F), up = c.rand(sz(R) * F);
  c.rel = 1e-5, c.abs = 1e-6;
  c.call = [=](OpsBackend& o, const Bufs& t) { o.swiglu_forward(t.w(out), t.r(gate), t.r(up), sz(R) * F); };
}
void case_swiglu_backward(Case& c) {
  const int dg = c.rand(sz(R) * F), du = c.rand(sz(R) * F), dout = c.rand(sz(R) * F), gate = c.rand(sz(R) * F),
            up = c.rand(sz(R) * F);
  c.rel = 1e-5, c.abs = 1e-6;
  c.call = [=](OpsBackend& o, const Bufs& t) {
    o.swiglu_backward(t.w(dg), t.w(du), t.r(dout), t.r(gate), t.r(up), sz(R) * F);
  };
}
// The attention cases run with a sliding window of 4 keys (T = 9): rows 0..3 see every earlier key,
// as without a window, the later ones only their window.
constexpr int kWindow = 4;
void case_gqa_attention_forward(Case& c) {
  const int out = c.rand(sz(R) * LH * D), att = c.rand(sz(B) * LH * T * T), q = c.rand(sz(R) * LH * D),
            k = c.rand(sz(R) * KV * D), v = c.rand(sz(R) * KV * D);
  c.rel = 1e-4, c.abs = 1e-6;
  c.call = [=](OpsBackend& o, const Bufs& t) {
    o.gqa_attention_forward(t.w(out), t.w(att), t.r(q), t.r(k), t.r(v), B, T, LH, KV, D, kWindow);
  };
}
void case_gqa_attention_backward(Case& c) {
  const int dq = c.rand(sz(R) * LH * D), dk = c.rand(sz(R) * KV * D), dv = c.rand(sz(R) * KV * D),
            dout = c.rand(sz(R) * LH * D), q = c.rand(sz(R) * LH * D), k = c.rand(sz(R) * KV * D),
            v = c.rand(sz(R) * KV * D), att = c.rand(sz(B) * LH * T * T), out = c.rand(sz(R) * LH * D);
  ops::gqa_attention_forward(ref_par(), c.host(out), c.host(att), c.host(q), c.host(k), c.host(v), B, T, LH, KV, D,
                             kWindow);
  c.call = [=](OpsBackend& o, const Bufs& t) {
    o.gqa_attention_backward(t.w(dq), t.w(dk), t.w(dv), t.r(dout), t.r(q), t.r(k), t.r(v), t.r(att), t.r(out), B, T, LH,
                             KV, D, kWindow);
  };
}
void case_embedding_forward(Case& c) {
  const int out = c.rand(RC), wte = c.rand(sz(V) * C), tok = c.tokens(R, V);
  c.rel = 0, c.abs = 0;
  c.call = [=](OpsBackend& o, const Bufs& t) { o.embedding_forward(t.w(out), t.ids(tok), t.r(wte), R, C); };
}
void case_embedding_backward(Case& c) {
  const int dwte = c.rand(sz(V) * C), dout = c.rand(RC), tok = c.tokens(R, V);
  c.rel = 1e-5, c.abs = 1e-6;
  c.call = [=](OpsBackend& o, const Bufs& t) { o.embedding_backward(t.w(dwte), t.r(dout), t.ids(tok), R, C); };
}
// Three query rows at positions 5..7 over 8 cached rows, GQA, rows strided as in a packed cache.
void case_attention_decode(Case& c) {
  constexpr int Q = 3, pos = 5, qs = LH * D + 5, kvs = KV * D + 3;
  const int out = c.rand(sz(Q) * LH * D), q = c.rand(sz(Q) * qs), k = c.rand(sz(pos + Q) * kvs),
            v = c.rand(sz(pos + Q) * kvs);
  c.rel = 1e-4, c.abs = 1e-6;
  c.call = [=](OpsBackend& o, const Bufs& t) {
    o.attention_decode(t.w(out), t.r(q), t.r(k), t.r(v), Q, pos, LH, KV, D, qs, kvs);
  };
}
void case_lm_head_logits(Case& c) {
  const int logits = c.rand(sz(R) * V), x = c.rand(RC), wte = c.rand(sz(V) * C, 0.3f);
  c.call = [=](OpsBackend& o, const Bufs& t) { o.lm_head_logits(t.w(logits), t.r(x), t.r(wte), R, C, V); };
}

struct OpEntry {
  const char* name;
  void (*make)(Case&);
};
#define ZINF_CASE_ENTRY(name, info, params, args) OpEntry{#name, &case_##name},
const OpEntry kOps[] = {ZINF_OPS(ZINF_CASE_ENTRY)};
#undef ZINF_CASE_ENTRY

// Runs a case on host memory (the CPU device's memory is host memory) and returns every float tensor.
std::vector<VF> run_on_host(const Case& c, OpsBackend& ops, Device* dev, std::vector<std::string>* log = nullptr) {
  std::vector<VF> f = c.f;
  std::vector<VI> ids = c.i;
  Bufs t;
  for (auto& v : f) t.f.push_back(v.data()), t.n.push_back(v.size());
  for (auto& v : ids) t.i.push_back(v.data());
  std::vector<std::string> own;
  Recorder rec(ops, log ? *log : own);
  c.call(rec, t);
  if (dev) dev->synchronize(StreamRole::compute);
  return f;
}

bool bitwise_equal(const VF& a, const VF& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void expect_bitwise(const char* backend, const char* op, const std::vector<VF>& got, const std::vector<VF>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t k = 0; k < got.size(); ++k)
    EXPECT_TRUE(bitwise_equal(got[k], want[k]))
        << backend << ": " << op << ", tensor " << k << " differs from the CPU reference";
}

Case make_case(const OpEntry& e) {
  Case c;
  e.make(c);
  return c;
}

TEST(OpsTable, EveryOpHasACaseThatCallsIt) {
  ops::ChunkPool par(1);
  CpuOps cpu(par);
  for (const OpEntry& e : kOps) {
    const Case c = make_case(e);
    ASSERT_TRUE(c.call) << e.name << ": its case sets no call";
    std::vector<std::string> log;
    run_on_host(c, cpu, nullptr, &log);
    EXPECT_EQ(log, std::vector<std::string>{e.name}) << "the case for " << e.name << " must call that op, once";
  }
}

TEST(OpsTable, CpuBackendWithTwoThreadsIsBitwiseTheReference) {
  ops::ChunkPool ref_par(1), par(2);
  CpuOps ref(ref_par), cpu(par);
  for (const OpEntry& e : kOps) {
    const Case c = make_case(e);
    const auto want = run_on_host(c, ref, nullptr);
    expect_bitwise("CPU backend, 2 threads", e.name, run_on_host(c, cpu, nullptr), want);
    // The op must have done something: some tensor differs from its initial value.
    bool changed = false;
    for (std::size_t k = 0; k < want.size(); ++k) changed |= !bitwise_equal(want[k], c.f[k]);
    EXPECT_TRUE(changed) << e.name << ": the case's call changes nothing";
  }
}

TEST(OpsTable, StreamAndProfileWrappersOnTheJitteredAsyncDeviceAreBitwiseTheReference) {
  ops::ChunkPool ref_par(1), par(2);
  CpuOps ref(ref_par);
  CpuDeviceOptions o;
  o.async = true;
  o.jitter = JitterSpec{11, 40};
  auto dev = make_cpu_device(64 << 20, o);
  auto stream = make_stream_ops(*dev, std::make_unique<CpuOps>(par));
  ModelShape shape{2, H, C, V, T};
  std::shared_ptr<OpProfile> profile;
  auto profiled = make_profile_ops(*dev, shape, make_stream_ops(*dev, std::make_unique<CpuOps>(par)), &profile);
  for (const OpEntry& e : kOps) {
    const Case c = make_case(e);
    const auto want = run_on_host(c, ref, nullptr);
    expect_bitwise("stream-wrapped CPU backend (async, jitter)", e.name, run_on_host(c, *stream, dev.get()), want);
    expect_bitwise("profiled stream-wrapped CPU backend", e.name, run_on_host(c, *profiled, dev.get()), want);
    std::int64_t calls = 0;
    for (const OpTime& t : profile->take()) calls += t.calls;
    EXPECT_EQ(calls, 1) << e.name << ": the profiler saw " << calls << " ops";
  }
}

TEST(OpsTable, CpuBackendRefusesViewsThatAreNotFp32) {
  ops::ChunkPool par(1);
  CpuOps cpu(par);
  std::vector<std::uint16_t> half(RC);
  VF x(RC);
  try {
    cpu.gelu_forward(TensorView(x.data(), RC), ConstTensorView(half.data(), DType::bf16, RC), RC);
    FAIL() << "a bf16 input was accepted";
  } catch (const Error& err) {
    EXPECT_STREQ(err.what(), "CPU op gelu_forward: argument 'inp' is bf16, but this backend computes in fp32 only");
  }
  EXPECT_THROW(cpu.zero(TensorView(half.data(), DType::fp16, RC), RC), Error);
}

// ---- CUDA ---------------------------------------------------------------------------------------
struct Gpu {
  std::unique_ptr<Device> dev;
  std::unique_ptr<OpsBackend> ops;
};

std::vector<VF> run_on_gpu(const Case& c, Gpu& g) {
  std::vector<DeviceBuffer> keep;
  Bufs t;
  for (const VF& v : c.f) {
    keep.emplace_back(*g.dev, v.size() * sizeof(float), "ops table test");
    g.dev->copy_to_device(keep.back().as<void>(), v.data(), v.size() * sizeof(float), StreamRole::compute);
    t.f.push_back(keep.back().as<float>()), t.n.push_back(v.size());
  }
  for (const VI& v : c.i) {
    keep.emplace_back(*g.dev, v.size() * sizeof(int), "ops table test");
    g.dev->copy_to_device(keep.back().as<void>(), v.data(), v.size() * sizeof(int), StreamRole::compute);
    t.i.push_back(keep.back().as<int>());
  }
  c.call(*g.ops, t);
  std::vector<VF> out;
  for (std::size_t k = 0; k < c.f.size(); ++k) {
    out.emplace_back(c.f[k].size());
    g.dev->copy_to_host(out.back().data(), t.f[k], out.back().size() * sizeof(float), StreamRole::compute);
  }
  g.dev->synchronize(StreamRole::compute);
  return out;
}

TEST(OpsTable, CudaBackendMatchesTheReferenceWithinTolerance) {
  const cuda::GpuQuery q = cuda::query_gpus();
  if (q.gpus.empty()) GTEST_SKIP() << "no GPU: " << q.status;
  Gpu g;
  const backends::Backend& cuda_backend = backends::backend_for(DeviceType::cuda);
  backends::DeviceSpec spec;
  spec.budget_bytes = std::size_t{1} << 30;
  g.dev = cuda_backend.make_device(spec);
  g.ops = cuda_backend.make_ops(*g.dev, Precision::fp32, 1, Kernels::reference);
  ops::ChunkPool par(2);
  CpuOps ref(par);
  for (const OpEntry& e : kOps) {
    const Case c = make_case(e);
    const auto want = run_on_host(c, ref, nullptr);
    const auto got = run_on_gpu(c, g);
    for (std::size_t k = 0; k < got.size(); ++k) {
      int bad = 0;
      for (std::size_t j = 0; j < got[k].size(); ++j) {
        const double d = std::fabs(static_cast<double>(got[k][j]) - want[k][j]);
        if (d > c.rel * std::fabs(want[k][j]) + c.abs && bad++ < 3)
          ADD_FAILURE() << e.name << ", tensor " << k << "[" << j << "]: " << got[k][j] << " vs " << want[k][j];
      }
    }
  }
}

}  // namespace
}  // namespace zinf
