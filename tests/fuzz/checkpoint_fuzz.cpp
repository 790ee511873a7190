// checkpoint_fuzz.cpp — a checkpoint's manifest.json on arbitrary bytes. A real checkpoint of a
// tiny GPT-2 is saved once (in memory, deterministic states); each input replaces its manifest, and
// every reader of checkpoints runs on it: checkpoint_shape (which must describe a model that can be built),
// verify_checkpoint, load_checkpoint and choose_checkpoint (the resume path, which must pass over a corrupt checkpoint
// with a reason, never stop on one). The seed corpus holds format-version-1 manifests (no checksum of their own), which
// reach every reader; a mutated checksummed manifest mostly stops at its checksum. A checkpoint they accept must hand
// back the states that were saved. ZINF_FUZZ_WRITE_SEED=<file> copies the real manifest there (the seed corpus's valid
// input).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "app/config/config.h"
#include "app/train/checkpoint.h"
#include "fuzz_common.h"
#include "model/shape.h"

namespace {

const zinf::ModelShape kShape{1, 2, 8, 16, 4};

float state_value(std::size_t u, int k, std::size_t i) {
  return 0.001f * static_cast<float>(i) + static_cast<float>(u) + 0.5f * static_cast<float>(k);
}

// The checkpoint root and the one checkpoint in it, written once.
struct Saved {
  std::string dir, path;
};
const Saved& saved() {
  static const Saved s = [] {
    Saved r;
    r.dir = zinf::fuzz::scratch_dir() + "/checkpoints";
    const zinf::Config c = zinf::parse_config(
        R"({"train_batch_size": 2, "train_micro_batch_size_per_gpu": 2,
            "model": {"n_layer": 1, "n_head": 2, "d_model": 8, "vocab_size": 16, "seq_len": 4}})");
    zinf::CheckpointState st;
    st.step = 7, st.opt_steps = 6, st.rows_drawn = 14, st.skipped = 1;  // (fp32: the loss scale stays 1)
    zinf::CheckpointDir dir(r.dir, 1, kShape, nullptr);
    r.path = dir.save(c, st, [](std::size_t u, float* master, float* m, float* v) {
      const auto units = zinf::layer_units(kShape);
      for (std::size_t i = 0; i < static_cast<std::size_t>(units[u].params); ++i)
        master[i] = state_value(u, 0, i), m[i] = state_value(u, 1, i), v[i] = state_value(u, 2, i);
    });
    if (const char* seed = std::getenv("ZINF_FUZZ_WRITE_SEED"))
      std::filesystem::copy_file(r.path + "/manifest.json", seed, std::filesystem::copy_options::overwrite_existing);
    return r;
  }();
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const Saved& ck = saved();
  zinf::fuzz::write_file(ck.path + "/manifest.json", data, size);
  zinf::ModelShape shape;
  if (zinf::fuzz::expect_clean("checkpoint_shape", [&] { shape = zinf::checkpoint_shape(ck.path); })) {
    // `zinf export` builds the model checkpoint_shape describes before it loads anything.
    if (shape.n_layer < 1 || shape.n_head < 1 || shape.d_model < 1 || shape.vocab_size < 1 || shape.seq_len < 1 ||
        shape.kv_heads() < 1 || shape.d_model % shape.n_head != 0 || shape.n_head % shape.kv_heads() != 0)
      zinf::fuzz::violated("checkpoint_shape returned a shape no model has");
    if (shape.n_layer <= 64 && std::int64_t{shape.d_model} * shape.vocab_size < (1 << 24))
      (void)zinf::layer_units(shape);
  }
  const bool valid = zinf::fuzz::expect_clean("verify_checkpoint", [&] { zinf::verify_checkpoint(ck.path, kShape); });
  bool same = true;
  const bool loaded = zinf::fuzz::expect_clean("load_checkpoint", [&] {
    (void)zinf::load_checkpoint(ck.path, kShape,
                                [&](std::size_t u, const float* master, const float* m, const float* v) {
                                  const auto units = zinf::layer_units(kShape);
                                  for (std::size_t i = 0; i < static_cast<std::size_t>(units[u].params); ++i)
                                    same = same && master[i] == state_value(u, 0, i) && m[i] == state_value(u, 1, i) &&
                                           v[i] == state_value(u, 2, i);
                                });
  });
  if (loaded && !same) zinf::fuzz::violated("load_checkpoint accepted the checkpoint but handed back other states");
  if (loaded && !valid) zinf::fuzz::violated("load_checkpoint accepted what verify_checkpoint rejects");
  zinf::ResumeChoice choice;
  const bool chose = zinf::fuzz::expect_clean("choose_checkpoint",
                                              [&] { choice = zinf::choose_checkpoint(ck.dir, "latest", kShape); });
  // A corrupt manifest is passed over (counted in `corrupt`), never a stop; an incompatible one (a
  // newer format) is a refusal from both readers.
  if (chose && (choice.path.empty() == valid || choice.corrupt.size() != (valid ? 0u : 1u)))
    zinf::fuzz::violated("choose_checkpoint disagrees with verify_checkpoint");
  return 0;
}
