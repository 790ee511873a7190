// gpt2_hf_test.cpp — GPT-2 Hugging Face folders in and out. zinf's own folders round-trip byte for
// byte in every dtype and sharding; a tiny GPT-2 folder that numpy and safetensors write (the
// checkers in .venv-check, in Hugging Face's names, buffers and tied head included) loads with its
// shape from config.json and gives the per-token losses of a float64 numpy GPT-2 forward; what zinf
// exports, numpy reads back under transformers' names with the same values and losses; and what zinf
// cannot load is one error naming the file and the key or tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/random_floats.h"
#include "app/config/config.h"
#include "app/train/checkpoint.h"
#include "app/train/train.h"
#include "common/checkers.h"
#include "common/temp_dir.h"
#include "hf_units.h"
#include "io/hf.h"
#include "model/lm.h"
#include "zinf/backends/backend.h"
#include "zinf/backends/cpu.h"
#include "zinf/cpu_adam/convert.h"
#include "zinf/error.h"

namespace zinf {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::random_units;
using test::slurp;
using test::TempDir;

ModelShape tiny() { return ModelShape{2, 4, 32, 256, 16}; }  // n_layer, n_head, d_model, vocab, seq_len

std::vector<std::vector<float>> load_all(const std::string& dir, const ModelShape& s) {
  HfModelReader r(dir);
  r.check(s);
  std::vector<std::vector<float>> units;
  std::size_t u = 0;
  for (const auto& lu : layer_units(s)) {
    units.emplace_back(static_cast<std::size_t>(lu.params), -1.0f);
    r.load_unit(s, u++, units.back().data());
  }
  return units;
}

TEST(Gpt2HfFolders, WriteReadAndWriteAgainIsByteIdenticalInEveryDtypeAndSharding) {
  TempDir t("gpt2-hf-test");
  for (StDtype dt : {StDtype::f32, StDtype::f16, StDtype::bf16})
    for (std::uint64_t shard : {std::uint64_t{1} << 30, std::uint64_t{9000}}) {  // one file; many shards
      SCOPED_TRACE(::testing::Message() << "dtype " << static_cast<int>(dt) << " shard " << shard);
      const ModelShape s = tiny();
      const auto units = random_units(s, dt, 11, 0.1f);
      const std::string a = t / "a", b = t / "b";
      fs::remove_all(a), fs::remove_all(b);
      write_hf_folder(a, s, units, dt, shard);
      EXPECT_EQ(fs::exists(fs::path(a) / "model.safetensors.index.json"), shard < (1u << 20));
      EXPECT_EQ(hf_shape(a, 0), s);  // the shape comes back from config.json, seq_len from n_positions
      const auto back = load_all(a, s);
      for (std::size_t u = 0; u < units.size(); ++u) ASSERT_EQ(back[u], units[u]) << "unit " << u;
      write_hf_folder(b, s, back, dt, shard);
      std::size_t files = 0;
      for (const auto& e : fs::directory_iterator(a)) {
        ++files;
        EXPECT_EQ(slurp((fs::path(b) / e.path().filename()).string()), slurp(e.path().string())) << e.path().filename();
      }
      EXPECT_EQ(files, static_cast<std::size_t>(std::distance(fs::directory_iterator(b), fs::directory_iterator())));
      if (shard < (1u << 20)) {
        EXPECT_GT(files, 4u) << "config.json, the index and several shards";
      }
    }
}

TEST(Gpt2HfFolders, NamesConfigAndLayoutAreTransformers) {
  TempDir t("gpt2-hf-test");
  const ModelShape s = tiny();
  const auto units = random_units(s, StDtype::f32, 11, 0.1f);
  write_hf_folder(t / "m", s, units, StDtype::f32);
  const json c = json::parse(slurp(t / "m/config.json"));
  EXPECT_EQ(c["model_type"], "gpt2");
  EXPECT_EQ(c["architectures"], json::array({"GPT2LMHeadModel"}));
  EXPECT_EQ(c["n_embd"], 32);
  EXPECT_EQ(c["n_layer"], 2);
  EXPECT_EQ(c["n_head"], 4);
  EXPECT_EQ(c["n_positions"], 16);
  EXPECT_EQ(c["vocab_size"], 256);
  EXPECT_EQ(c["torch_dtype"], "float32");
  const StFile f = read_safetensors(t / "m/model.safetensors");
  EXPECT_EQ(f.tensors.size(), 2 + 2 * 12 + 2u);  // no lm_head.weight: GPT2LMHeadModel ties it and saves none
  EXPECT_EQ(f.find("lm_head.weight"), nullptr);
  const StTensor* fc = f.find("transformer.h.1.mlp.c_fc.weight");
  ASSERT_TRUE(fc && f.find("transformer.wte.weight") && f.find("transformer.wpe.weight") &&
              f.find("transformer.ln_f.bias"));
  EXPECT_EQ(fc->shape, (std::vector<std::int64_t>{32, 128}));  // Conv1D: [in, out]
  // c_fc.weight is [in, out] in the file as in block 1's unit (after ln_1, c_attn, c_proj, ln_2).
  const std::size_t C = 32, off = 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + 2 * C;
  const float* file = reinterpret_cast<const float*>(f.bytes.data() + f.data_start + fc->begin);
  for (std::size_t i = 0; i < C * 4 * C; i += 37) ASSERT_EQ(file[i], units[2][off + i]) << i;
}

TEST(Gpt2HfFolders, AConfigPointedAtAFolderTakesItsShapeTrainsAndExportsBack) {
  TempDir t("gpt2-hf-test");
  ModelShape s = tiny();
  s.seq_len = 24;  // the folder has 24 positions; training takes 16
  const auto units = random_units(s, StDtype::bf16, 11, 0.1f);
  write_hf_folder(t / "m", s, units, StDtype::bf16, 9000);
  const std::string cfg = R"({"model": {"init_from": ")" + (t / "m") + R"(", "seq_len": 16},
      "train": {"steps": 0, "eval_batches": 2, "checkpoint_dir": ")" +
                          (t / "ck") + R"("},
      "device": {"type": "cpu", "memory_budget": "256MiB", "threads": 1}, "train_micro_batch_size_per_gpu": 2,
      "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}})";
  const Config c = parse_config(cfg);
  const ModelShape want = tiny();
  EXPECT_EQ(model_shape(c.model), want);
  // train.steps 0: the parameters are exactly the folder's, wpe cut to its first 16 rows.
  std::vector<std::vector<float>> cut = units;
  cut[0].resize(static_cast<std::size_t>(256 * 32 + 16 * 32));
  std::uint64_t h = fnv1a64(nullptr, 0);
  for (const auto& u : cut) h = fnv1a64(u.data(), u.size() * 4, h);
  char digest[17];
  std::snprintf(digest, sizeof digest, "%016llx", static_cast<unsigned long long>(h));
  EXPECT_EQ(train(c, TrainHooks{}).params_digest, digest);
  // Two steps with a checkpoint, which `zinf export --format hf` writes as a GPT-2 folder.
  ASSERT_EQ(train(parse_config(cfg, {"train.steps=2"}), TrainHooks{}).steps, 2);
  const std::string cmd = std::string(ZINF_BIN) + " export --format hf --dtype fp32 --shard-size 9000 --checkpoint " +
                          (t / "ck/step-00000002") + " -o " + (t / "out") + " > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  ASSERT_TRUE(fs::exists(t / "out/model.safetensors.index.json"));
  EXPECT_EQ(json::parse(slurp(t / "out/config.json"))["n_positions"], 16);
  const ModelShape bs = hf_shape(t / "out", 0);
  EXPECT_EQ(bs, want);
  std::vector<std::vector<float>> masters(units.size());
  load_checkpoint(t / "ck/step-00000002", bs, [&](std::size_t u, const float* m, const float*, const float*) {
    masters[u].assign(m, m + static_cast<std::size_t>(layer_units(bs)[u].params));
  });
  const auto back = load_all(t / "out", bs);
  for (std::size_t u = 0; u < back.size(); ++u) {
    EXPECT_EQ(back[u], masters[u]) << "unit " << u;
    EXPECT_NE(back[u], cut[u]) << "unit " << u << " did not train";
  }
}

// The checker's half: `make DIR SHARDED DTYPE` writes a tiny GPT-2 folder the way the Hugging Face
// hub holds one (model.safetensors without the transformer. prefix, with the attention mask buffers
// and the tied lm_head.weight; or shards with the prefix and an index) and DIR/expect.json with
// tokens, targets and the float64 per-token losses; `check DIR EXPORTED` reads a zinf export back
// (transformers' names and shapes, the same values) and prints the largest loss difference.
constexpr const char* kChecker = R"PY(
import json, os, sys
import numpy as np
from safetensors.numpy import save_file, load_file

L, H, C, V, T, B = 2, 4, 32, 256, 16, 2

def names():
    n = ["wte.weight", "wpe.weight"]
    for l in range(L):
        for k in ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
                  "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                  "mlp.c_proj.weight", "mlp.c_proj.bias"]:
            n.append("h.%d.%s" % (l, k))
    return n + ["ln_f.weight", "ln_f.bias"]

def shape(n):
    k = n.split(".", 2)[-1] if n.startswith("h.") else n
    return {"wte.weight": (V, C), "wpe.weight": (T, C), "attn.c_attn.weight": (C, 3 * C), "attn.c_attn.bias": (3 * C,),
            "attn.c_proj.weight": (C, C), "mlp.c_fc.weight": (C, 4 * C), "mlp.c_fc.bias": (4 * C,),
            "mlp.c_proj.weight": (4 * C, C)}.get(k, (C,))

def ln(x, w, b):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + 1e-5) * w + b

def losses(W, tok, tgt):
    W = {k: v.astype(np.float64) for k, v in W.items()}
    x = W["wte.weight"][tok] + W["wpe.weight"][:T]
    D = C // H
    mask = np.triu(np.ones((T, T), dtype=bool), 1)
    for l in range(L):
        p = lambda k: W["h.%d.%s" % (l, k)]
        qkv = ln(x, p("ln_1.weight"), p("ln_1.bias")) @ p("attn.c_attn.weight") + p("attn.c_attn.bias")
        q, k, v = [a.reshape(B, T, H, D).transpose(0, 2, 1, 3) for a in np.split(qkv, 3, axis=-1)]
        att = q @ k.transpose(0, 1, 3, 2) / np.sqrt(D)
        att = np.where(mask, -np.inf, att)
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        y = (att @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
        x = x + y @ p("attn.c_proj.weight") + p("attn.c_proj.bias")
        hh = ln(x, p("ln_2.weight"), p("ln_2.bias")) @ p("mlp.c_fc.weight") + p("mlp.c_fc.bias")
        hh = 0.5 * hh * (1 + np.tanh(np.sqrt(2 / np.pi) * (hh + 0.044715 * hh ** 3)))
        x = x + hh @ p("mlp.c_proj.weight") + p("mlp.c_proj.bias")
    logits = ln(x, W["ln_f.weight"], W["ln_f.bias"]) @ W["wte.weight"].T
    m = logits.max(-1, keepdims=True)
    lse = (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))[..., 0]
    return (lse - np.take_along_axis(logits, tgt[..., None], -1)[..., 0]).reshape(-1)

def config(dtype):
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": C, "n_layer": L, "n_head": H,
            "n_ctx": T, "n_positions": T, "n_inner": None, "vocab_size": V, "activation_function": "gelu_new",
            "layer_norm_epsilon": 1e-05, "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1,
            "scale_attn_weights": True, "bos_token_id": V - 1, "eos_token_id": V - 1, "torch_dtype": dtype}

def make(d, sharded, dtype):
    rng = np.random.default_rng(5 + sharded)
    np_dtype = {"float32": np.float32, "float16": np.float16}[dtype]
    W = {}
    for n in names():
        base = 1.0 if n.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")) else 0.0
        W[n] = (base + rng.normal(0, 0.3 if n.startswith(("wte", "wpe")) else 0.12, shape(n))).astype(np_dtype)
    os.makedirs(d, exist_ok=True)
    json.dump(config(dtype), open(os.path.join(d, "config.json"), "w"))
    if sharded:  # transformers' save_pretrained: the prefix, no buffers, no tied head, three shards
        out = {"transformer." + k: v for k, v in W.items()}
        keys = list(out)
        parts = [keys[:9], keys[9:20], keys[20:]]
        wmap = {}
        for i, part in enumerate(parts):
            fn = "model-%05d-of-%05d.safetensors" % (i + 1, len(parts))
            save_file({k: out[k] for k in part}, os.path.join(d, fn), metadata={"format": "pt"})
            wmap.update({k: fn for k in part})
        json.dump({"metadata": {"total_size": sum(v.nbytes for v in out.values())}, "weight_map": wmap},
                  open(os.path.join(d, "model.safetensors.index.json"), "w"))
    else:  # the hub's gpt2 upload: no prefix, the mask buffers, and the head stored as a copy of wte
        out = dict(W)
        for l in range(L):
            out["h.%d.attn.bias" % l] = np.tril(np.ones((T, T), dtype=np_dtype)).reshape(1, 1, T, T)
            out["h.%d.attn.masked_bias" % l] = np.array(-1e4, dtype=np_dtype)
        out["lm_head.weight"] = W["wte.weight"].copy()
        save_file(out, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    tok = rng.integers(0, V, (B, T))
    tgt = rng.integers(0, V, (B, T))
    json.dump({"tokens": tok.reshape(-1).tolist(), "targets": tgt.reshape(-1).tolist(),
               "losses": losses(W, tok, tgt).tolist()}, open(os.path.join(d, "expect.json"), "w"))

def read_folder(d):
    if os.path.exists(os.path.join(d, "model.safetensors")):
        return load_file(os.path.join(d, "model.safetensors"))
    idx = json.load(open(os.path.join(d, "model.safetensors.index.json")))
    W = {}
    for fn in sorted(set(idx["weight_map"].values())):
        part = load_file(os.path.join(d, fn))
        assert all(idx["weight_map"][k] == fn for k in part), "index and shard disagree in " + fn
        W.update(part)
    assert set(W) == set(idx["weight_map"]), "the index names other tensors than the shards hold"
    return W

def check(src, exported):
    c = json.load(open(os.path.join(exported, "config.json")))
    for k, v in [("model_type", "gpt2"), ("architectures", ["GPT2LMHeadModel"]), ("n_embd", C), ("n_layer", L),
                 ("n_head", H), ("n_positions", T), ("vocab_size", V)]:
        assert c.get(k) == v, "config.json %s: %r, expected %r" % (k, c.get(k), v)
    W = read_folder(exported)
    want = ["transformer." + n for n in names()]
    assert sorted(W) == sorted(want), "tensor names: %s" % sorted(set(W) ^ set(want))
    orig = {k[12:] if k.startswith("transformer.") else k: v for k, v in read_folder(src).items()}
    W = {k[12:]: v for k, v in W.items()}
    for n in names():
        assert W[n].shape == shape(n), "%s: shape %s" % (n, W[n].shape)
        assert W[n].dtype == orig[n].dtype and np.array_equal(W[n], orig[n]), n + ": values differ"
    e = json.load(open(os.path.join(src, "expect.json")))
    tok = np.array(e["tokens"]).reshape(B, T)
    tgt = np.array(e["targets"]).reshape(B, T)
    print("max_loss_diff %.3e" % np.abs(losses(W, tok, tgt) - np.array(e["losses"])).max())

if sys.argv[1] == "make":
    make(sys.argv[2], sys.argv[3] == "1", sys.argv[4])
else:
    check(sys.argv[2], sys.argv[3])
)PY";

// zinf's per-token losses of a GPT-2 model on the CPU device (fp32, reference kernels).
std::vector<float> zinf_losses(const ModelShape& s, std::vector<std::vector<float>>& units, const std::vector<int>& tok,
                               const std::vector<int>& tgt) {
  auto dev = make_cpu_device(64 << 20);
  auto ops = backends::backend_for(DeviceType::cpu).make_ops(*dev, Precision::fp32, 1, Kernels::reference);
  const int B = static_cast<int>(tok.size()) / s.seq_len;
  auto model = make_model(s, B, /*checkpointing=*/false, *dev, *ops);
  std::vector<std::vector<float>> grads;
  std::vector<const float*> w;
  std::vector<float*> g;
  std::vector<std::size_t> n;
  for (auto& u : units) {
    grads.emplace_back(u.size(), 0.0f);
    w.push_back(u.data()), g.push_back(grads.back().data()), n.push_back(u.size());
  }
  ResidentUnits src(w, g, n);
  model->forward(src, tok.data(), tgt.data());
  dev->synchronize();
  return std::vector<float>(model->row_losses(), model->row_losses() + model->rows());
}

TEST(Gpt2HfFolders, NumpyWrittenFoldersGiveNumpysLossesAndExportReadsBackInNumpy) {
  const std::string py = test::checker_python("safetensors.numpy");
  if (py.empty()) GTEST_SKIP() << test::checker_missing("safetensors");
  TempDir t("gpt2-hf-test");
  const std::string script = t / "gpt2_check.py";
  std::ofstream(script) << kChecker;
  for (bool sharded : {false, true}) {
    const std::string dtype = sharded ? "float16" : "float32";
    SCOPED_TRACE(sharded ? "sharded fp16, transformer. prefix" : "one fp32 file, hub names, buffers, lm_head");
    const std::string dir = t / (sharded ? "sharded" : "single"), out = dir + "-out";
    const auto made = test::run_python(py, "", {script, "make", dir, sharded ? "1" : "0", dtype});
    ASSERT_EQ(made.status, 0) << made.output;
    const ModelShape s = hf_shape(dir, 0);
    ASSERT_EQ(s, tiny());
    auto units = load_all(dir, s);
    HfModelReader r(dir);
    EXPECT_EQ(r.weights(), sharded ? "model.safetensors.index.json, 3 shard(s)" : "model.safetensors");
    const json e = json::parse(slurp(dir + "/expect.json"));
    const auto tok = e["tokens"].get<std::vector<int>>(), tgt = e["targets"].get<std::vector<int>>();
    const auto want = e["losses"].get<std::vector<double>>();
    const auto got = zinf_losses(s, units, tok, tgt);
    ASSERT_EQ(got.size(), want.size());
    double worst = 0, mean = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      worst = std::max(worst, std::abs(got[i] - want[i]));
      mean += want[i] / static_cast<double>(want.size());
    }
    std::printf("per-token loss against numpy's float64 forward: mean %.4f, worst |diff| %.3g\n", mean, worst);
    EXPECT_GT(mean, 1.0);  // a loss far from zero, so the comparison means something
    EXPECT_LT(worst, 2e-5) << "per-token loss against numpy's float64 forward";
    // Export (sharded) in the folder's dtype: numpy reads the same values under transformers' names.
    write_hf_folder(out, s, units, sharded ? StDtype::f16 : StDtype::f32, 12000);
    const auto checked = test::run_python(py, "", {script, "check", dir, out});
    ASSERT_EQ(checked.status, 0) << checked.output;
    const auto at = checked.output.find("max_loss_diff ");
    ASSERT_NE(at, std::string::npos) << checked.output;
    EXPECT_EQ(std::stod(checked.output.substr(at + 14)), 0.0) << "same values, same float64 losses";
    // And zinf reads its export back to the same units.
    EXPECT_EQ(load_all(out, s), units);
  }
}

TEST(Gpt2HfFolders, WhatZinfCannotLoadIsOneErrorNamingTheFileAndKeyOrTensor) {
  TempDir t("gpt2-hf-test");
  const ModelShape s = tiny();
  auto units = random_units(s, StDtype::f32, 11, 0.1f);
  write_hf_folder(t / "m", s, units, StDtype::f32);
  const std::string cfg_file = t / "m/config.json";
  const json good = json::parse(slurp(cfg_file));
  auto patch = [&](const std::function<void(json&)>& f) {
    json c = good;
    f(c);
    std::ofstream(cfg_file) << c.dump();
  };
  auto config_error = [&](const std::string& extra = "") {
    try {
      parse_config(R"({"train_batch_size": 2, "model": {"init_from": ")" + (t / "m") + "\"" + extra + "}}");
    } catch (const ConfigError& e) {
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(config_error(), "accepted");
  EXPECT_NE(config_error(R"(, "preset": "gpt2-124m")").find("model.preset: 'gpt2-124m' does not match"),
            std::string::npos);
  EXPECT_NE(config_error(R"(, "seq_len": 17)").find(cfg_file + ": n_positions is 16, below model.seq_len 17"),
            std::string::npos)
      << config_error(R"(, "seq_len": 17)");
  const std::vector<std::pair<std::function<void(json&)>, std::string>> bad = {
      {[](json& c) { c["n_inner"] = 100; }, "n_inner: 100 is not 4 * n_embd (128)"},
      {[](json& c) { c["activation_function"] = "relu"; }, "activation_function: \"relu\" is not gelu_new"},
      {[](json& c) { c["layer_norm_epsilon"] = 1e-6; }, "layer_norm_epsilon: 1e-06 is not 1e-5"},
      {[](json& c) { c["scale_attn_by_inverse_layer_idx"] = true; }, "scale_attn_by_inverse_layer_idx: true is not"},
      {[](json& c) { c["reorder_and_upcast_attn"] = true; }, "reorder_and_upcast_attn: true is not supported"},
      {[](json& c) { c["scale_attn_weights"] = false; }, "scale_attn_weights: false is not supported"},
      {[](json& c) { c["tie_word_embeddings"] = false; }, "tie_word_embeddings: false is not supported"},
      {[](json& c) { c.erase("n_embd"); }, "n_embd: missing"},
      {[](json& c) { c.erase("n_positions"), c.erase("n_ctx"); }, "n_positions: missing"},
      {[](json& c) { c["n_head"] = 5; }, "n_embd: not a multiple of n_head"},
  };
  for (const auto& [f, want] : bad) {
    patch(f);
    const std::string e = config_error();
    EXPECT_NE(e.find(cfg_file + ": " + want), std::string::npos) << e;
  }
  // The hub's gpt2 config.json is the gpt2-124m preset (only config.json is read at parse time).
  fs::create_directories(t / "hub");
  std::ofstream(t / "hub/config.json") << json{{"model_type", "gpt2"}, {"n_embd", 768},       {"n_layer", 12},
                                               {"n_head", 12},         {"vocab_size", 50257}, {"n_ctx", 1024},
                                               {"n_positions", 1024},  {"n_inner", nullptr}}
                                              .dump();
  const Config hub = parse_config(R"({"train_batch_size": 2, "model": {"preset": "gpt2-124m", "init_from": ")" +
                                  (t / "hub") + R"("}})");
  EXPECT_EQ(model_shape(hub.model), find_model_preset("gpt2-124m").shape);
  // n_ctx alone is n_positions.
  patch([](json& c) { c.erase("n_positions"); });
  EXPECT_EQ(hf_shape(t / "m", 0), s);
  // Tensors: the folder and the tensor named.
  auto tensor_error = [&](const ModelShape& shape) {
    try {
      load_all(t / "m", shape);
    } catch (const ConfigError& e) {
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  patch([](json& c) { c["n_layer"] = 3; });
  EXPECT_NE(tensor_error(hf_shape(t / "m", 0)).find(t / "m" + ": 12 tensor(s) the model needs are missing: h.2."),
            std::string::npos)
      << tensor_error(hf_shape(t / "m", 0));
  patch([](json& c) { c["vocab_size"] = 257; });
  EXPECT_NE(tensor_error(hf_shape(t / "m", 0))
                .find(t / "m" + ": tensor wte.weight has shape [256, 32], the model needs [257, 32]"),
            std::string::npos)
      << tensor_error(hf_shape(t / "m", 0));
  patch([](json&) {});
  // A stored head must be wte: one that differs is refused, naming the file and the tensor.
  auto layout = gpt2_hf_tensors(s, s.seq_len, "transformer.");
  auto with_head = units;
  with_head.push_back(units[0]);
  layout.push_back({"lm_head.weight", {256, 32}, with_head.size() - 1, 0, false});
  write_model_safetensors(t / "m/model.safetensors", layout, with_head, StDtype::f32);
  EXPECT_EQ(load_all(t / "m", s), units);  // equal to wte: accepted
  with_head.back()[5 * 32 + 3] += 1.0f;
  write_model_safetensors(t / "m/model.safetensors", layout, with_head, StDtype::f32);
  EXPECT_NE(tensor_error(s).find(t / "m/model.safetensors: tensor lm_head.weight differs from wte.weight (at row 5)"),
            std::string::npos)
      << tensor_error(s);
  // The same tensor under both names.
  layout.back() = {"wte.weight", {256, 32}, 0, 0, false};
  write_model_safetensors(t / "m/model.safetensors", layout, units, StDtype::f32);
  EXPECT_NE(tensor_error(s).find("tensor wte.weight is in the folder twice"), std::string::npos) << tensor_error(s);
}

}  // namespace
}  // namespace zinf
