// hf.h — Hugging Face model folders of the Llama family (Llama 2/3, Mistral, Qwen2, TinyLlama,
// SmolLM): config.json plus model.safetensors, or shards model-0000K-of-0000N.safetensors with
// model.safetensors.index.json. Tensor names and layouts are Hugging Face's
// (model.layers.N.self_attn.q_proj.weight as [out, in], lm_head.weight unless tied); the units hold
// matrices as [in, out], so loading and writing transpose. fp32, fp16 and bf16 tensors.
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "io/safetensors.h"
#include "model/shape.h"

namespace zinf {

// A directory holding config.json.
bool is_hf_folder(const std::string& path);

// The model shape config.json describes, for training sequences of `seq_len` tokens (0: the smaller
// of 2048 and max_position_embeddings). Anything zinf cannot honour is a ConfigError naming the
// file and the key (an unknown model_type, hidden_act other than silu, MLP biases, a rope_scaling
// type other than llama3, a head_dim other than hidden_size / num_attention_heads, a sequence
// longer than max_position_embeddings or Mistral's sliding_window).
// config.json that is not a JSON object, and numbers that cannot be (a non-positive rms_norm_eps,
// rope_theta or rope_scaling factor) are refused the same way.
ModelShape hf_shape(const std::string& dir, int seq_len);
// The same from config.json's text; `source` names it in errors.
ModelShape hf_shape_from_json(std::string_view text, const std::string& source, int seq_len);
// The shard files model.safetensors.index.json's weight_map names (sorted, each once); each must be a
// plain file name in the folder. `source` names the index in errors.
std::vector<std::string> hf_index_files(std::string_view text, const std::string& source);

// The tensors of a llama-family model in Hugging Face's names, in file order.
std::vector<ModelTensor> llama_hf_tensors(const ModelShape& s);

// A folder opened for loading: each file's header now, each tensor's bytes when its unit is loaded.
// Like Hugging Face's loaders it reads model.safetensors when present, else the shards the index
// names; weights() says which. A NaN or infinite weight is a ConfigError naming the file and tensor.
class HfModelReader {
 public:
  explicit HfModelReader(const std::string& dir);
  // What was read: "model.safetensors", or the index and its shard count.
  const std::string& weights() const { return weights_; }
  // Every tensor the model needs present with its shape, and none it has no place for; a
  // ConfigError naming the folder and the tensors otherwise.
  void check(const ModelShape& s) const;
  // Fills unit u's fp32 parameters, tensor by tensor.
  void load_unit(const ModelShape& s, std::size_t u, float* dst) const;

 private:
  struct Where {
    std::size_t file;
    const StTensor* tensor;
  };
  const Where* find(const std::string& name) const;
  std::string dir_, weights_;
  std::vector<StReader> files_;
  std::unordered_map<std::string, Where> index_;
};

// Writes a folder Hugging Face loaders open: config.json, and the tensors in `dtype`, in shards of at
// most `shard_bytes` (one model.safetensors when it fits, else model-0000K-of-0000N.safetensors and
// model.safetensors.index.json). All or nothing: the folder is built beside `dir` and swapped in
// whole when complete (see OutputFolder); an existing folder's config.json, *.safetensors and
// *.safetensors.index.json are replaced (no shard or index of an earlier export survives) and its
// other files (tokenizer, README) are kept. On any failure `dir` is left as it was.
void write_hf_folder(const std::string& dir, const ModelShape& s, const std::vector<std::vector<float>>& units,
                     StDtype dtype, std::uint64_t shard_bytes = std::uint64_t{5} << 30);

}  // namespace zinf
