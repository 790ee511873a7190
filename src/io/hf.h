// hf.h — Hugging Face model folders: config.json plus model.safetensors, or shards
// model-0000K-of-0000N.safetensors with model.safetensors.index.json; fp32, fp16 and bf16 tensors.
// Two families. The Llama family (Llama 2/3, Mistral, Qwen2, TinyLlama, SmolLM): names like
// model.layers.N.self_attn.q_proj.weight as [out, in] (nn.Linear), lm_head.weight unless tied; the
// units hold matrices as [in, out], so loading and writing transpose. GPT-2 (model_type gpt2): names
// like h.N.attn.c_attn.weight, with or without GPT2LMHeadModel's "transformer." prefix, matrices as
// [in, out] (Conv1D) like the units, the LM head tied to wte.
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
// of 2048 and max_position_embeddings; GPT-2: n_positions, or n_ctx, its older name). Anything zinf
// cannot honour is a ConfigError naming the file and the key. The llama family: an unknown
// model_type, hidden_act other than silu, MLP biases, a rope_scaling type other than llama3, a
// head_dim other than hidden_size / num_attention_heads, a sequence longer than
// max_position_embeddings, Qwen2 layer_types with a full_attention layer after a sliding one.
// GPT-2: n_inner other than 4 * n_embd, activation_function other than gelu_new,
// layer_norm_epsilon other than 1e-5, scale_attn_weights false, scale_attn_by_inverse_layer_idx,
// reorder_and_upcast_attn, add_cross_attention, an untied head, a sequence longer than n_positions.
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
// The tensors of a GPT-2 model in Hugging Face's names (prefix "" or GPT2LMHeadModel's
// "transformer."), with wpe.weight of `positions` rows. Conv1D holds matrices as [in, out], as the
// units do: nothing is transposed. No lm_head.weight: it is wte.
std::vector<ModelTensor> gpt2_hf_tensors(const ModelShape& s, std::int64_t positions, const std::string& prefix = "");

// A folder opened for loading: each file's header now, each tensor's bytes when its unit is loaded.
// Like Hugging Face's loaders it reads model.safetensors when present, else the shards the index
// names; weights() says which. A NaN or infinite weight is a ConfigError naming the file and tensor.
// GPT-2: the attn.bias / attn.masked_bias mask buffers are skipped; an lm_head.weight must equal
// wte.weight (a ConfigError otherwise); a wpe.weight longer than seq_len gives its first seq_len rows.
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
  // GPT-2: wpe.weight's rows in the folder when it has at least seq_len (the first seq_len are
  // loaded), else seq_len.
  std::int64_t wpe_rows(const ModelShape& s) const;
  std::vector<ModelTensor> layout(const ModelShape& s) const;  // in the names index_ holds
  std::string file_of(const Where& w) const;                   // the folder/file a tensor is in
  std::string dir_, weights_;
  std::vector<StReader> files_;
  std::unordered_map<std::string, Where> index_;
};

// Writes a folder Hugging Face loaders open: config.json (GPT-2: n_positions = seq_len, the
// positions the units hold; its tensors named as GPT2LMHeadModel saves them, lm_head left out as
// tied), and the tensors in `dtype`, in shards of at
// most `shard_bytes` (one model.safetensors when it fits, else model-0000K-of-0000N.safetensors and
// model.safetensors.index.json). All or nothing: the folder is built beside `dir` and swapped in
// whole when complete (see OutputFolder); an existing folder's config.json, *.safetensors and
// *.safetensors.index.json are replaced (no shard or index of an earlier export survives) and its
// other files (tokenizer, README) are kept. On any failure `dir` is left as it was.
void write_hf_folder(const std::string& dir, const ModelShape& s, const std::vector<std::vector<float>>& units,
                     StDtype dtype, std::uint64_t shard_bytes = std::uint64_t{5} << 30);

}  // namespace zinf
