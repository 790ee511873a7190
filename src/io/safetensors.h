// io/safetensors.h — the safetensors format (8-byte little-endian header length, a JSON header
// of {name: {dtype, shape, data_offsets}} plus optional __metadata__, then the tensor bytes), and
// GPT-2's tensor names, so a trained model opens in the usual tools and a GPT-2 checkpoint can be
// fine-tuned.
//
// The parser trusts nothing: header length within the file, valid JSON, known dtypes, shapes whose
// element count matches data_offsets, offsets in range, and tensors that neither overlap nor leave
// holes in the data buffer. Every problem is one zinf::ConfigError (bad input, exit code 2) naming the
// file and the tensor; a failing read is a zinf::IoError.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "io/files.h"
#include "model/shape.h"

namespace zinf {

enum class StDtype { f32, f16, bf16 };

struct StTensor {
  std::string name;
  StDtype dtype = StDtype::f32;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;  // byte offsets into the data buffer
};

struct StFile {
  std::vector<StTensor> tensors;
  std::string bytes;             // the whole file
  std::uint64_t data_start = 0;  // 8 + header length
  const StTensor* find(const std::string& name) const;
};

// Parses and validates `bytes` (the whole file); `source` names it in errors.
StFile parse_safetensors(std::string bytes, const std::string& source);
// Validates a header (the JSON after the 8-byte length) against a data buffer of `data_len` bytes.
StFile parse_safetensors_header(const std::string& header_json, std::uint64_t data_len, const std::string& source);
// Reads a whole file; `what` names its role in errors (see InputFile: only a regular file is read).
StFile read_safetensors(const std::string& path, const std::string& what = "safetensors file");
// A ConfigError naming the file and the tensor when any of its n values is NaN or infinite.
void check_finite_tensor(const float* p, std::size_t n, const std::string& source, const std::string& tensor);

// One named tensor of a model file inside a layer unit. `transposed`: the file holds the matrix as
// [out, in] (Hugging Face's nn.Linear; `shape` is the file's) while the unit holds it as [in, out].
struct ModelTensor {
  std::string name;
  std::vector<std::int64_t> shape;
  std::size_t unit = 0;
  std::size_t offset = 0;  // elements into the unit's flat buffer
  bool transposed = false;
};
using Gpt2Tensor = ModelTensor;
// HF GPT-2 names: wte.weight, h.0.attn.c_attn.weight, … (Conv1D: [in, out], as the units hold them).
std::vector<ModelTensor> gpt2_tensors(const ModelShape& s);
// Writes `layout`'s tensors of the unit masters (fp32, unit order) as one safetensors file in
// `dtype`, atomically (temporary file, fsync, rename).
void write_model_safetensors(const std::string& path, const std::vector<ModelTensor>& layout,
                             const std::vector<std::vector<float>>& units, StDtype dtype);
// A safetensors file read lazily: the header at open, each tensor's bytes when asked for, so a model
// larger than memory loads tensor by tensor. The header is validated as parse_safetensors does; the
// file stays open while the reader (or a copy) lives.
class StReader {
 public:
  explicit StReader(const std::string& path, const std::string& what = "safetensors file");
  const StFile& header() const { return header_; }
  const std::string& path() const { return path_; }
  // Reads tensor t as fp32 into dst; with `transposed`, the file's [rows, cols] lands as [cols, rows].
  void read(const StTensor& t, float* dst, bool transposed) const;

 private:
  // Reads exactly n bytes at offset `at`; `what` names them in the error.
  void pread_all(void* dst, std::size_t n, std::uint64_t at, const std::string& what) const;
  std::string path_;
  std::shared_ptr<const InputFile> file_;
  StFile header_;  // bytes stay empty
};

// Writes unit masters (fp32, unit order) as a GPT-2 safetensors file in `dtype`, atomically.
void write_gpt2_safetensors(const std::string& path, const ModelShape& s, const std::vector<std::vector<float>>& units,
                            StDtype dtype);
// Fills unit u's fp32 parameters from a GPT-2 safetensors file (names may carry a "transformer."
// prefix); throws naming the file and the missing or mismatched tensor.
void load_gpt2_unit(const StFile& f, const std::string& source, const ModelShape& s, std::size_t u, float* dst);
// Checks that a model file (or folder) `source` holds exactly `layout`'s tensors: shape_of(name) is the
// shape of a tensor it holds (null when absent), `names` every tensor it holds (in layout names),
// ignorable(name) passes a tensor the model has no place for but loaders accept (buffers, a tied head).
// Throws ConfigError naming the tensors: a shape mismatch (with shape_hint), else tensors without a
// place, else missing ones (with hint).
void check_tensor_set(const std::string& source, const std::vector<ModelTensor>& layout,
                      const std::function<const std::vector<std::int64_t>*(const std::string&)>& shape_of,
                      const std::vector<std::string>& names, const std::function<bool(const std::string&)>& ignorable,
                      const std::string& hint, const std::string& shape_hint);

// Checks, before anything is loaded, that the file holds exactly the model's tensors: every one
// present with its shape, and none the model has no place for (the causal-mask buffers and a tied
// lm_head.weight that Hugging Face files carry are accepted). Throws ConfigError naming the file and
// the tensors, with a hint when the file looks like another shape (more or fewer layers).
void check_gpt2_tensor_set(const StFile& f, const std::string& source, const ModelShape& s);

StDtype parse_st_dtype(const std::string& name);  // "fp32"|"fp16"|"bf16" (or F32/F16/BF16); throws ConfigError

}  // namespace zinf
