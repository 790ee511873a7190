// safetensors.cpp — a strict safetensors reader and writer, and GPT-2's tensor layout (io/safetensors.h).
#include "io/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "io/files.h"
#include "zinf/cpu_adam/convert.h"
#include "zinf/error.h"

namespace zinf {
namespace {

using json = nlohmann::json;

std::size_t dtype_size(StDtype d) { return d == StDtype::f32 ? 4 : 2; }
const char* dtype_name(StDtype d) { return d == StDtype::f32 ? "F32" : d == StDtype::f16 ? "F16" : "BF16"; }

// A malformed file is bad input (exit code 2), not a failure of the run.
[[noreturn]] void bad(const std::string& source, const std::string& why) {
  throw ConfigError(source + ": invalid safetensors file: " + why);
}

}  // namespace

StDtype parse_st_dtype(const std::string& n) {
  if (n == "fp32" || n == "F32") return StDtype::f32;
  if (n == "fp16" || n == "F16") return StDtype::f16;
  if (n == "bf16" || n == "BF16") return StDtype::bf16;
  throw ConfigError("dtype '" + n + "' is not one of fp32, fp16, bf16");
}

const StTensor* StFile::find(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

namespace {
std::uint64_t header_length(const char* p8) {
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(p8[i]);
  return n;
}
}  // namespace

StFile parse_safetensors(std::string bytes, const std::string& source) {
  if (bytes.size() < 8) bad(source, "shorter than the 8-byte header length");
  const std::uint64_t n = header_length(bytes.data());
  if (n > bytes.size() - 8)
    bad(source,
        "header length " + std::to_string(n) + " exceeds the file (" + std::to_string(bytes.size()) + " bytes)");
  if (n > (100u << 20)) bad(source, "header length " + std::to_string(n) + " is unreasonably large");
  StFile f = parse_safetensors_header(bytes.substr(8, n), bytes.size() - 8 - n, source);
  f.bytes = std::move(bytes);
  return f;
}

StFile parse_safetensors_header(const std::string& header_json, std::uint64_t data_len, const std::string& source) {
  StFile f;
  json h;
  try {
    h = json::parse(header_json);
  } catch (const json::exception& e) {
    bad(source, std::string("header is not valid JSON (") + e.what() + ")");
  }
  if (!h.is_object()) bad(source, "header is not a JSON object");
  f.data_start = 8 + header_json.size();
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) bad(source, "__metadata__ is not an object");
      continue;
    }
    const json& t = it.value();
    const std::string& name = it.key();
    if (!t.is_object() || !t.contains("dtype") || !t.contains("shape") || !t.contains("data_offsets"))
      bad(source, "tensor " + name + " needs dtype, shape and data_offsets");
    StTensor x;
    x.name = name;
    if (!t["dtype"].is_string()) bad(source, "tensor " + name + ": dtype is not a string");
    const std::string dt = t["dtype"].get<std::string>();
    if (dt == "F32")
      x.dtype = StDtype::f32;
    else if (dt == "F16")
      x.dtype = StDtype::f16;
    else if (dt == "BF16")
      x.dtype = StDtype::bf16;
    else
      bad(source, "tensor " + name + ": unsupported dtype " + dt + " (zinf reads F32, F16, BF16)");
    if (!t["shape"].is_array()) bad(source, "tensor " + name + ": shape is not an array");
    std::uint64_t count = 1;
    for (const auto& d : t["shape"]) {
      if (!d.is_number_unsigned()) bad(source, "tensor " + name + ": shape holds a non-integer or negative dimension");
      const std::uint64_t v = d.get<std::uint64_t>();
      // Bounded so that count times the element size (up to 4) cannot wrap around 2^64 either.
      if (v != 0 && count > (std::uint64_t{1} << 60) / v) bad(source, "tensor " + name + ": shape overflows");
      count *= v;
      x.shape.push_back(static_cast<std::int64_t>(v));
    }
    const json& o = t["data_offsets"];
    if (!o.is_array() || o.size() != 2 || !o[0].is_number_unsigned() || !o[1].is_number_unsigned())
      bad(source, "tensor " + name + ": data_offsets must be [begin, end]");
    x.begin = o[0].get<std::uint64_t>();
    x.end = o[1].get<std::uint64_t>();
    if (x.begin > x.end || x.end > data_len)
      bad(source, "tensor " + name + ": data_offsets [" + std::to_string(x.begin) + ", " + std::to_string(x.end) +
                      "] are outside the data (" + std::to_string(data_len) + " bytes)");
    if (x.end - x.begin != count * dtype_size(x.dtype))
      bad(source, "tensor " + name + ": shape needs " + std::to_string(count * dtype_size(x.dtype)) +
                      " bytes, data_offsets give " + std::to_string(x.end - x.begin));
    f.tensors.push_back(std::move(x));
  }
  // Tensors must tile the data buffer: no overlaps, no holes.
  std::vector<const StTensor*> order;
  for (const auto& t : f.tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const StTensor* a, const StTensor* b) { return a->begin < b->begin; });
  std::uint64_t pos = 0;
  for (const StTensor* t : order) {
    if (t->begin < pos) bad(source, "tensor " + t->name + " overlaps the tensor before it");
    if (t->begin > pos) bad(source, "a hole of " + std::to_string(t->begin - pos) + " bytes before tensor " + t->name);
    pos = t->end;
  }
  if (pos != data_len) bad(source, std::to_string(data_len - pos) + " bytes after the last tensor");
  return f;
}

StFile read_safetensors(const std::string& path, const std::string& what) {
  return parse_safetensors(read_input_file(path, what), path);
}

void check_finite_tensor(const float* p, std::size_t n, const std::string& source, const std::string& tensor) {
  for (std::size_t i = 0; i < n; ++i)
    if (!std::isfinite(p[i]))
      throw ConfigError(source + ": tensor " + tensor + " holds " + (std::isnan(p[i]) ? "NaN" : "Inf") +
                            " at element " + std::to_string(i) + "; zinf starts only from finite weights",
                        "the file is corrupt or comes from a run that diverged; export an earlier checkpoint");
}

std::vector<Gpt2Tensor> gpt2_tensors(const ModelShape& s) {
  const std::int64_t C = s.d_model, V = s.vocab_size, T = s.seq_len;
  std::vector<Gpt2Tensor> v;
  v.push_back({"wte.weight", {V, C}, 0, 0});
  v.push_back({"wpe.weight", {T, C}, 0, static_cast<std::size_t>(V * C)});
  for (int l = 0; l < s.n_layer; ++l) {
    const std::string p = "h." + std::to_string(l) + ".";
    const std::size_t u = static_cast<std::size_t>(l) + 1;
    std::size_t off = 0;
    auto add = [&](const std::string& n, std::vector<std::int64_t> shape) {
      std::int64_t count = 1;
      for (auto d : shape) count *= d;
      v.push_back({p + n, shape, u, off});
      off += static_cast<std::size_t>(count);
    };
    add("ln_1.weight", {C});
    add("ln_1.bias", {C});
    add("attn.c_attn.weight", {C, 3 * C});
    add("attn.c_attn.bias", {3 * C});
    add("attn.c_proj.weight", {C, C});
    add("attn.c_proj.bias", {C});
    add("ln_2.weight", {C});
    add("ln_2.bias", {C});
    add("mlp.c_fc.weight", {C, 4 * C});
    add("mlp.c_fc.bias", {4 * C});
    add("mlp.c_proj.weight", {4 * C, C});
    add("mlp.c_proj.bias", {C});
  }
  const std::size_t last = static_cast<std::size_t>(s.n_layer) + 1;
  v.push_back({"ln_f.weight", {C}, last, 0});
  v.push_back({"ln_f.bias", {C}, last, static_cast<std::size_t>(C)});
  return v;
}

void write_model_safetensors(const std::string& path, const std::vector<ModelTensor>& layout,
                             const std::vector<std::vector<float>>& units, StDtype dtype) {
  json h = json::object();
  h["__metadata__"] = {{"format", "pt"}, {"producer", "zinf"}};
  std::uint64_t pos = 0;
  for (const auto& t : layout) {
    std::uint64_t count = 1;
    for (auto d : t.shape) count *= static_cast<std::uint64_t>(d);
    h[t.name] = {
        {"dtype", dtype_name(dtype)}, {"shape", t.shape}, {"data_offsets", {pos, pos + count * dtype_size(dtype)}}};
    pos += count * dtype_size(dtype);
  }
  std::string header = h.dump();
  while ((8 + header.size()) % 8 != 0) header.push_back(' ');  // the data starts 8-byte aligned
  OutputFile out(path, "safetensors file");
  std::uint64_t n = header.size();
  char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  out.write(len, 8);
  out.write(header.data(), header.size());
  std::vector<std::uint16_t> half;
  std::vector<float> turned;
  for (const auto& t : layout) {
    std::size_t count = 1;
    for (auto d : t.shape) count *= static_cast<std::size_t>(d);
    const float* src = units[t.unit].data() + t.offset;
    if (t.transposed) {  // the unit's [in, out] as the file's [out, in]
      const std::size_t rows = static_cast<std::size_t>(t.shape[0]), cols = static_cast<std::size_t>(t.shape[1]);
      turned.resize(count);
      for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t c = 0; c < cols; ++c) turned[r * cols + c] = src[c * rows + r];
      src = turned.data();
    }
    if (dtype == StDtype::f32) {
      out.write(src, count * 4);
    } else {
      half.resize(count);
      if (dtype == StDtype::f16)
        cpu_adam::fp32_to_fp16(src, half.data(), count);
      else
        cpu_adam::fp32_to_bf16(src, half.data(), count);
      out.write(half.data(), count * 2);
    }
  }
  out.commit();
}

void write_gpt2_safetensors(const std::string& path, const ModelShape& s, const std::vector<std::vector<float>>& units,
                            StDtype dtype) {
  write_model_safetensors(path, gpt2_tensors(s), units, dtype);
}

StReader::StReader(const std::string& path, const std::string& what)
    : path_(path), file_(std::make_shared<const InputFile>(path, what)) {
  const std::uint64_t size = file_->size();
  if (size < 8) bad(path, "shorter than the 8-byte header length");
  char len[8];
  pread_all(len, 8, 0, "the header length");
  const std::uint64_t n = header_length(len);
  if (n > size - 8)
    bad(path, "header length " + std::to_string(n) + " exceeds the file (" + std::to_string(size) + " bytes)");
  if (n > (100u << 20)) bad(path, "header length " + std::to_string(n) + " is unreasonably large");
  std::string header(n, '\0');
  pread_all(header.data(), n, 8, "the header");
  header_ = parse_safetensors_header(header, size - 8 - n, path);
}

void StReader::pread_all(void* dst, std::size_t n, std::uint64_t at, const std::string& what) const {
  const std::size_t got = file_->read_at(dst, n, at);
  if (got < n)
    throw IoError(path_ + ": reading " + what + " at offset " + std::to_string(at + got) + ": unexpected end of file",
                  EIO);
}

void StReader::read(const StTensor& t, float* dst, bool transposed) const {
  const std::size_t bytes = static_cast<std::size_t>(t.end - t.begin), count = bytes / dtype_size(t.dtype);
  const std::uint64_t at = header_.data_start + t.begin;
  std::vector<float> flat;
  float* out = dst;
  if (transposed) {
    flat.resize(count);
    out = flat.data();
  }
  if (t.dtype == StDtype::f32) {
    pread_all(out, bytes, at, "tensor " + t.name);
  } else {
    std::vector<std::uint16_t> half(count);
    pread_all(half.data(), bytes, at, "tensor " + t.name);
    if (t.dtype == StDtype::f16)
      cpu_adam::fp16_to_fp32(half.data(), out, count);
    else
      cpu_adam::bf16_to_fp32(half.data(), out, count);
  }
  if (transposed) {  // the file's [rows, cols] as the unit's [cols, rows]
    const std::size_t rows = static_cast<std::size_t>(t.shape[0]), cols = static_cast<std::size_t>(t.shape[1]);
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < cols; ++c) dst[c * rows + r] = flat[r * cols + c];
  }
}

namespace {
std::string shape_mismatch(const std::string& source, const std::string& name, const std::vector<std::int64_t>& got,
                           const std::vector<std::int64_t>& want) {
  std::ostringstream os;
  auto dims = [&](const std::vector<std::int64_t>& v) {
    os << "[";
    for (std::size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
    os << "]";
  };
  os << source << ": tensor " << name << " has shape ";
  dims(got);
  os << ", the model needs ";
  dims(want);
  return os.str();
}
}  // namespace

void load_gpt2_unit(const StFile& f, const std::string& source, const ModelShape& s, std::size_t u, float* dst) {
  for (const auto& t : gpt2_tensors(s)) {
    if (t.unit != u) continue;
    const StTensor* x = f.find(t.name);
    if (!x) x = f.find("transformer." + t.name);
    if (!x) throw ConfigError(source + ": tensor " + t.name + " is missing (model.init_from)");
    if (x->shape != t.shape) throw ConfigError(shape_mismatch(source, t.name, x->shape, t.shape));
    const char* p = f.bytes.data() + f.data_start + x->begin;
    const std::size_t count = static_cast<std::size_t>((x->end - x->begin) / dtype_size(x->dtype));
    float* out = dst + t.offset;
    if (x->dtype == StDtype::f32) {
      std::memcpy(out, p, count * 4);
    } else {
      std::vector<std::uint16_t> half(count);
      std::memcpy(half.data(), p, count * 2);
      if (x->dtype == StDtype::f16)
        cpu_adam::fp16_to_fp32(half.data(), out, count);
      else
        cpu_adam::bf16_to_fp32(half.data(), out, count);
    }
    check_finite_tensor(out, count, source, x->name);
  }
}

void check_tensor_set(const std::string& source, const std::vector<ModelTensor>& layout,
                      const std::function<const std::vector<std::int64_t>*(const std::string&)>& shape_of,
                      const std::vector<std::string>& names, const std::function<bool(const std::string&)>& ignorable,
                      const std::string& hint, const std::string& shape_hint) {
  std::set<std::string> expected;
  std::vector<std::string> missing, extra;
  for (const auto& t : layout) {
    expected.insert(t.name);
    const std::vector<std::int64_t>* got = shape_of(t.name);
    if (!got)
      missing.push_back(t.name);
    else if (*got != t.shape)
      throw ConfigError(shape_mismatch(source, t.name, *got, t.shape), shape_hint);
  }
  for (const auto& n : names)
    if (!expected.count(n) && !ignorable(n)) extra.push_back(n);
  auto list = [](const std::vector<std::string>& v) {
    std::string r;
    for (std::size_t i = 0; i < v.size() && i < 4; ++i) r += (i ? ", " : "") + v[i];
    if (v.size() > 4) r += " (and " + std::to_string(v.size() - 4) + " more)";
    return r;
  };
  if (!extra.empty())
    throw ConfigError(
        source + ": " + std::to_string(extra.size()) + " tensor(s) the model has no place for: " + list(extra), hint);
  if (!missing.empty())
    throw ConfigError(
        source + ": " + std::to_string(missing.size()) + " tensor(s) the model needs are missing: " + list(missing),
        hint);
}

void check_gpt2_tensor_set(const StFile& f, const std::string& source, const ModelShape& s) {
  auto strip = [](const std::string& n) { return n.rfind("transformer.", 0) == 0 ? n.substr(12) : n; };
  std::vector<std::string> names;
  int layers = 0;  // the file's block count, for the hint
  for (const auto& t : f.tensors) {
    names.push_back(strip(t.name));
    int l = -1;
    if (std::sscanf(names.back().c_str(), "h.%d.", &l) == 1) layers = std::max(layers, l + 1);
  }
  auto shape_of = [&](const std::string& name) -> const std::vector<std::int64_t>* {
    const StTensor* x = f.find(name);
    if (!x) x = f.find("transformer." + name);
    return x ? &x->shape : nullptr;
  };
  auto ignorable = [](const std::string& n) {  // buffers, and the LM head GPT-2 ties to wte
    auto ends = [&](const char* sfx) {
      return n.size() >= std::strlen(sfx) && n.compare(n.size() - std::strlen(sfx), std::string::npos, sfx) == 0;
    };
    return ends(".attn.bias") || ends(".attn.masked_bias") || n == "lm_head.weight";
  };
  const std::string hint = layers && layers != s.n_layer
                               ? "the file holds " + std::to_string(layers) + " blocks and the model has " +
                                     std::to_string(s.n_layer) + ": set model.n_layer to " + std::to_string(layers)
                               : "model.init_from must hold a GPT-2 model of the configured shape";
  check_tensor_set(source, gpt2_tensors(s), shape_of, names, ignorable, hint,
                   "model.init_from must hold a model of the configured shape (model.d_model, vocab_size, seq_len)");
}

}  // namespace zinf
