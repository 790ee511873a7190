// hf_index_fuzz.cpp — a sharded Hugging Face folder's model.safetensors.index.json on arbitrary
// bytes. The folder (in memory) holds a tiny untied Llama written by write_hf_folder in three shards
// and its index; each input replaces the index, and HfModelReader opens the folder, checks it
// against the model and, when that passes, loads every unit. Whatever the index says, an opened
// folder must only ever hand out tensors that lie inside their files.
// ZINF_FUZZ_WRITE_SEED=<file> copies the folder's real index there (the seed corpus's valid input).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "io/hf.h"
#include "model/shape.h"

namespace {

zinf::ModelShape tiny() {
  zinf::ModelShape s{2, 2, 8, 16, 8};
  s.family = zinf::ModelFamily::llama;
  s.n_kv_head = 1, s.d_ff = 12, s.tie_embeddings = false, s.max_positions = 16;
  return s;
}

// The folder, written once; returns its path.
const std::string& folder() {
  static const std::string dir = [] {
    const std::string d = zinf::fuzz::scratch_dir() + "/hf-sharded";
    const zinf::ModelShape s = tiny();
    std::vector<std::vector<float>> units;
    for (const auto& u : zinf::layer_units(s)) {
      units.emplace_back(static_cast<std::size_t>(u.params));
      for (std::size_t i = 0; i < units.back().size(); ++i) units.back()[i] = 0.01f * static_cast<float>(i % 97) - 0.4f;
    }
    zinf::write_hf_folder(d, s, units, zinf::StDtype::bf16, 600);  // small shards: several files
    if (const char* seed = std::getenv("ZINF_FUZZ_WRITE_SEED"))
      std::filesystem::copy_file(d + "/model.safetensors.index.json", seed,
                                 std::filesystem::copy_options::overwrite_existing);
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string& dir = folder();
  static const zinf::ModelShape s = tiny();
  static const auto units = zinf::layer_units(s);
  zinf::fuzz::write_file(dir + "/model.safetensors.index.json", data, size);
  std::vector<zinf::HfModelReader> reader;
  if (!zinf::fuzz::expect_clean("HfModelReader", [&] { reader.emplace_back(dir); })) return 0;
  if (!zinf::fuzz::expect_clean("HfModelReader::check", [&] { reader.front().check(s); })) return 0;
  std::vector<float> buf;
  for (std::size_t u = 0; u < units.size(); ++u) {
    buf.assign(static_cast<std::size_t>(units[u].params), 0.0f);
    zinf::fuzz::expect_clean("HfModelReader::load_unit", [&] { reader.front().load_unit(s, u, buf.data()); });
  }
  return 0;
}
