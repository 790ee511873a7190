// hf_config_fuzz.cpp — a Hugging Face folder's config.json on arbitrary bytes: hf_shape reads it
// directly (with and without a sequence length), and a run config naming the folder in
// model.init_from reads it through parse_config, as `zinf train` does. A shape it accepts must be
// one zinf can build: positive sizes, heads dividing the width, the sequence within the positions.
#include <cstddef>
#include <cstdint>
#include <string>

#include "app/config/config.h"
#include "fuzz_common.h"
#include "io/hf.h"
#include "model/shape.h"

namespace {

void check_shape(const zinf::ModelShape& s, int seq_len) {
  const bool llama = s.family == zinf::ModelFamily::llama;  // GPT-2 has no d_ff, KV heads or rotary positions
  if (s.n_layer <= 0 || s.n_head <= 0 || s.d_model <= 0 || s.vocab_size <= 0 || s.seq_len <= 0 ||
      (llama && (s.d_ff <= 0 || s.kv_heads() <= 0)))
    zinf::fuzz::violated("hf_shape accepted a non-positive size");
  if (s.d_model % s.n_head != 0 || (llama && (s.n_head % s.kv_heads() != 0 || s.head_dim() % 2 != 0)))
    zinf::fuzz::violated("hf_shape accepted heads that do not divide the width");
  if (seq_len > 0 && s.seq_len != seq_len) zinf::fuzz::violated("hf_shape did not keep the sequence length asked for");
  if (s.max_positions > 0 && s.seq_len > s.max_positions)
    zinf::fuzz::violated("hf_shape accepted a sequence beyond the positions");
  // The tensor list of a small model: its arithmetic must hold.
  if (s.n_layer <= 64 && llama) (void)zinf::llama_hf_tensors(s);
  if (s.n_layer <= 64 && !llama) (void)zinf::gpt2_hf_tensors(s, s.seq_len);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string dir = zinf::fuzz::scratch_dir() + "/hf";
  static const std::string run_config = [] {
    std::filesystem::create_directories(dir);
    return R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 8, "model": {"init_from": ")" + dir + R"("}})";
  }();
  zinf::fuzz::write_file(dir + "/config.json", data, size);
  for (int seq_len : {0, 48}) {
    zinf::ModelShape s;
    if (zinf::fuzz::expect_clean("hf_shape", [&] { s = zinf::hf_shape(dir, seq_len); })) check_shape(s, seq_len);
  }
  zinf::fuzz::expect_clean("parse_config with model.init_from", [&] { (void)zinf::parse_config(run_config); });
  return 0;
}
