// checkpoint.cpp — atomic, verified checkpoints (checkpoint.h).
#include "app/train/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "io/files.h"
#include "zinf/error.h"

namespace zinf {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr char kFormat[] = "zinf-checkpoint";
// Version 2 added the manifest's own checksum and the precision; version 1 is still read.
constexpr int kVersion = 2;

std::atomic<int> g_fault_at{-1};
std::atomic<int> g_saves{0};

int fault_at() {
  int f = g_fault_at.load();
  if (f < 0) {
    const char* e = std::getenv("ZINF_TEST_CHECKPOINT_ENOSPC_AT");
    f = e ? std::atoi(e) : 0;
    g_fault_at = f;
  }
  return f;
}

[[noreturn]] void io_fail(const std::string& what, const std::string& path, int err) {
  throw IoError("checkpoint " + path + ": " + what + ": " + std::strerror(err), err,
                err == ENOSPC ? "free space under train.checkpoint_dir; the previous checkpoints are intact" : "");
}

// A file written with write(2) and fsync'ed before close, so a rename afterwards publishes whole data.
class SyncedFile {
 public:
  explicit SyncedFile(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) io_fail("create", path, errno);
  }
  ~SyncedFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  void write(const void* p, std::size_t n) {
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
      if (budget_ >= 0 && static_cast<std::int64_t>(n) > budget_) io_fail("write", path_, ENOSPC);  // test hook
      const ssize_t w = ::write(fd_, c, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        io_fail("write at offset " + std::to_string(written_), path_, errno);
      }
      c += w;
      n -= static_cast<std::size_t>(w);
      written_ += static_cast<std::uint64_t>(w);
      if (budget_ >= 0) budget_ -= w;
    }
  }
  void finish() {
    if (::fsync(fd_) != 0) io_fail("fsync", path_, errno);
    if (::close(fd_) != 0) {
      fd_ = -1;
      io_fail("close", path_, errno);
    }
    fd_ = -1;
  }
  void fail_after(std::int64_t bytes) { budget_ = bytes; }

 private:
  std::string path_;
  int fd_ = -1;
  std::uint64_t written_ = 0;
  std::int64_t budget_ = -1;
};

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) io_fail("open directory", dir, errno);
  const int rc = ::fsync(fd);
  const int e = errno;
  ::close(fd);
  if (rc != 0) io_fail("fsync directory", dir, e);
}

std::string hex(std::uint64_t h) {
  char b[17];
  std::snprintf(b, sizeof b, "%016" PRIx64, h);
  return b;
}

// A small procfs or text file, whole ("" when unreadable).
std::string read_small_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string step_name(std::int64_t step) {
  char b[32];
  std::snprintf(b, sizeof b, "step-%08" PRId64, step);
  return b;
}

// step-N directories under dir, newest first.
std::vector<std::pair<std::int64_t, std::string>> list_steps(const std::string& dir) {
  std::vector<std::pair<std::int64_t, std::string>> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    long long step = 0;
    char tail = 0;
    if (std::sscanf(n.c_str(), "step-%lld%c", &step, &tail) == 1 && e.is_directory())
      out.emplace_back(step, e.path().string());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

// "fp16", "bf16" or "fp32" as a Precision.
Precision precision_from(const std::string& s, const std::string& mf) {
  for (Precision p : {Precision::fp32, Precision::fp16, Precision::bf16})
    if (to_string(p) == s) return p;
  throw CorruptCheckpoint("checkpoint " + mf + ": unknown precision '" + s + "'");
}

// The manifest's "optimizer_states" word as a state format; absent (written before the key): fp32.
// A word this zinf does not know names states it cannot convert: the checkpoint is refused.
cpu_adam::StateFormat states_from(const json& j, const std::string& mf) {
  if (!j.contains("optimizer_states")) return cpu_adam::StateFormat::fp32;
  const std::string s = j["optimizer_states"].get<std::string>();
  for (auto f : {cpu_adam::StateFormat::fp32, cpu_adam::StateFormat::bf16, cpu_adam::StateFormat::q8})
    if (s == cpu_adam::state_format_name(f)) return f;
  throw IncompatibleCheckpoint("checkpoint " + mf + ": its Adam states were kept as '" + s +
                               "', which this zinf cannot convert (it knows fp32, bf16 and 8bit)");
}

// The manifest's checksum: XXH64 of its compact form without the checksum itself (nlohmann::json
// keeps object keys sorted and writes numbers in their shortest round-trip form, so the text read
// back hashes to what was written whatever whitespace the file has).
std::string manifest_checksum(const json& j_without_checksum) {
  const std::string text = j_without_checksum.dump();
  return hex(XXH64(text.data(), text.size(), 0));
}

constexpr char kChecksumKey[] = "manifest_xxh64";
constexpr char kLockFile[] = ".zinf-lock";

void check_values(const json& j, const std::string& path);

// The whole of a file of a checkpoint, refused (as corrupt) unless it is a regular file: a FIFO or a
// device there would block or never end, a directory would fail inside the library.
std::string read_checkpoint_file(const std::string& file, bool text) {
  try {
    return text ? read_input_text(file, "checkpoint") : read_input_file(file, "checkpoint");
  } catch (const Error& e) {
    throw CorruptCheckpoint(e.what());
  }
}

// Reads a manifest and checks its format, version, checksum and values (check_values). Sets
// *unchecked for a version-1 manifest (written before manifests carried a checksum).
json read_manifest(const std::string& path, bool* unchecked = nullptr) {
  const std::string mf = path + "/manifest.json";
  const std::string text = read_checkpoint_file(mf, /*text=*/true);
  json j;
  try {
    j = json::parse(text);  // (strict: anything after the document is an error)
  } catch (const json::exception& e) {
    throw CorruptCheckpoint("checkpoint " + mf + ": corrupt manifest (" + library_message(e) + ")");
  }
  try {
    if (!j.is_object() || !j.contains("format") || j["format"] != kFormat)
      throw CorruptCheckpoint("checkpoint " + mf + ": not a zinf checkpoint manifest");
    const json& v = j.contains("version") ? j["version"] : json();
    if (!v.is_number_integer() || v.get<std::int64_t>() < 1)
      throw CorruptCheckpoint("checkpoint " + mf + ": corrupt manifest (no valid format version)");
    const std::int64_t version = v.get<std::int64_t>();
    // A newer format is refused, never treated as damage: an older zinf must not move aside (or
    // prune) what a newer one wrote.
    if (version > kVersion)
      throw IncompatibleCheckpoint("checkpoint " + mf + ": written by a newer zinf (format version " +
                                       std::to_string(version) + "; this zinf reads versions 1 to " +
                                       std::to_string(kVersion) + ")",
                                   "resume it with the zinf version that wrote it");
    const auto it = j.find(kChecksumKey);
    if (version == 1) {
      // Checkpoints from before manifests were checksummed stay usable: their tensors are still
      // verified, only the step, data position and scaler state cannot be.
      if (it != j.end())
        throw CorruptCheckpoint("checkpoint " + mf + ": corrupt manifest (a version-1 manifest with a checksum)");
      if (unchecked) *unchecked = true;
      check_values(j, path);
      return j;
    }
    if (it == j.end() || !it->is_string())
      throw CorruptCheckpoint("checkpoint " + mf + ": corrupt manifest (its checksum is missing)");
    const std::string want = it->get<std::string>();
    j.erase(it);
    if (manifest_checksum(j) != want)
      throw CorruptCheckpoint("checkpoint " + mf + ": the manifest fails its checksum (edited or damaged)");
    if (unchecked) *unchecked = false;
    check_values(j, path);
    return j;
  } catch (const json::exception& e) {
    throw CorruptCheckpoint("checkpoint " + mf + ": corrupt manifest (" + library_message(e) + ")");
  }
}

// The model section of a manifest: GPT-2's five numbers, and the llama family's settings when present
// (checkpoints from before the llama family have none: they are GPT-2).
json shape_json(const ModelShape& s) {
  json m = {{"n_layer", s.n_layer},
            {"n_head", s.n_head},
            {"d_model", s.d_model},
            {"vocab_size", s.vocab_size},
            {"seq_len", s.seq_len}};
  if (s.family == ModelFamily::llama)
    m.update({{"family", "llama"},
              {"n_kv_head", s.n_kv_head},
              {"d_ff", s.d_ff},
              {"tie_embeddings", s.tie_embeddings},
              {"qkv_bias", s.qkv_bias},
              {"rope_theta", s.rope_theta},
              {"norm_eps", s.norm_eps},
              {"rope_factor", s.rope_factor},
              {"rope_low_freq_factor", s.rope_low_freq_factor},
              {"rope_high_freq_factor", s.rope_high_freq_factor},
              {"rope_original_max", s.rope_original_max},
              {"max_positions", s.max_positions}});
  // Written only where they differ from what a manifest without them means (Llama 3's scaling when
  // rope_factor != 1, no window, not from a folder), so earlier manifests read the same.
  if (s.family == ModelFamily::llama) {
    const std::string implied = s.rope_factor != 1 ? "llama3" : "default";
    RopeParams plain;
    plain.type = s.rope.type;
    if (s.rope.type != implied || s.rope != plain) {
      const RopeParams& r = s.rope;
      m["rope"] = {{"type", r.type},           {"attention_factor", r.attention_factor},
                   {"beta_fast", r.beta_fast}, {"beta_slow", r.beta_slow},
                   {"mscale", r.mscale},       {"mscale_all_dim", r.mscale_all_dim},
                   {"truncate", r.truncate},   {"short_factor", r.short_factor},
                   {"long_factor", r.long_factor}};
    }
    if (s.sliding_window > 0) m["sliding_window"] = s.sliding_window;
    if (s.window_from > 0) m["window_from"] = s.window_from;
    if (!(s.hf == HfOrigin{}))
      m["hf"] = {{"model_type", s.hf.model_type},
                 {"legacy_rope", s.hf.legacy_rope},
                 {"max_window_layers", s.hf.max_window_layers},
                 {"window", s.hf.window}};
  }
  return m;
}
// Throws json::exception on a missing key or a wrong type, Error (naming `mf`) on a size no config
// can give (the bounds are the run config's), so no caller builds a model from a corrupt manifest.
ModelShape shape_from_json(const json& m, const std::string& mf) {
  auto size = [&](const char* key, std::int64_t hi, std::int64_t lo = 1) {
    const json& v = m.at(key);
    if (!v.is_number_integer() || v.get<std::int64_t>() < lo || v.get<std::int64_t>() > hi)
      throw CorruptCheckpoint("checkpoint " + mf + ": model." + key + ": " + v.dump() + " is not a size between " +
                              std::to_string(lo) + " and " + std::to_string(hi));
    return static_cast<int>(v.get<std::int64_t>());
  };
  ModelShape s{size("n_layer", 4096), size("n_head", 4096), size("d_model", 1 << 20), size("vocab_size", 1 << 24),
               size("seq_len", 1 << 20)};
  if (m.value("family", std::string("gpt2")) == "llama") {
    s.family = ModelFamily::llama;
    s.n_kv_head = size("n_kv_head", 4096), s.d_ff = size("d_ff", 1 << 22);
    s.tie_embeddings = m.at("tie_embeddings").get<bool>(), s.qkv_bias = m.at("qkv_bias").get<bool>();
    s.rope_theta = m.at("rope_theta").get<double>(), s.norm_eps = m.at("norm_eps").get<double>();
    s.rope_factor = m.at("rope_factor").get<double>(),
    s.rope_low_freq_factor = m.at("rope_low_freq_factor").get<double>();
    s.rope_high_freq_factor = m.at("rope_high_freq_factor").get<double>(),
    s.rope_original_max = m.at("rope_original_max").get<double>();
    s.max_positions = m.contains("max_positions") ? size("max_positions", 1 << 30, 0) : 0;  // 0: seq_len
    s.rope.type = s.rope_factor != 1 ? "llama3" : "default";
    if (m.contains("rope")) {
      const json& r = m.at("rope");
      RopeParams& p = s.rope;
      p.type = r.at("type").get<std::string>();
      p.attention_factor = r.at("attention_factor").get<double>();
      p.beta_fast = r.at("beta_fast").get<double>(), p.beta_slow = r.at("beta_slow").get<double>();
      p.mscale = r.at("mscale").get<double>(), p.mscale_all_dim = r.at("mscale_all_dim").get<double>();
      p.truncate = r.at("truncate").get<bool>();
      p.short_factor = r.at("short_factor").get<std::vector<double>>();
      p.long_factor = r.at("long_factor").get<std::vector<double>>();
      const std::size_t half = static_cast<std::size_t>(s.d_model / s.n_head / 2);
      const std::set<std::string> types = {"default", "linear", "dynamic", "yarn", "longrope", "llama3"};
      if (!types.count(p.type) ||
          (p.type == "longrope" && (p.short_factor.size() != half || p.long_factor.size() != half)))
        throw CorruptCheckpoint("checkpoint " + mf + ": model.rope: " + r.dump() +
                                " is not a rotary scaling zinf computes for this shape");
    }
    if (m.contains("sliding_window")) s.sliding_window = size("sliding_window", std::numeric_limits<int>::max());
    if (m.contains("window_from")) s.window_from = size("window_from", s.n_layer, 0);
    if (m.contains("hf")) {
      const json& h = m.at("hf");
      s.hf.model_type = h.at("model_type").get<std::string>(), s.hf.legacy_rope = h.at("legacy_rope").get<bool>();
      s.hf.max_window_layers = h.at("max_window_layers").get<int>(), s.hf.window = h.at("window").get<int>();
    }
    // The real numbers: positive and finite (norm_eps below 1; the original context may be 0).
    const std::pair<const char*, double> reals[] = {{"rope_theta", s.rope_theta},
                                                    {"norm_eps", s.norm_eps},
                                                    {"rope_factor", s.rope_factor},
                                                    {"rope_low_freq_factor", s.rope_low_freq_factor},
                                                    {"rope_high_freq_factor", s.rope_high_freq_factor},
                                                    {"rope_original_max", s.rope_original_max}};
    for (const auto& [key, v] : reals) {
      const bool zero_ok = std::string(key) == "rope_original_max";
      if (!std::isfinite(v) || v < 0 || (v == 0 && !zero_ok) || (std::string(key) == "norm_eps" && v >= 1))
        throw CorruptCheckpoint("checkpoint " + mf + ": model." + key + ": " + m.at(key).dump() +
                                " is not a positive finite number" + (zero_ok ? " or 0" : ""));
    }
  }
  if (s.d_model % s.n_head != 0 || s.n_head % s.kv_heads() != 0)
    throw CorruptCheckpoint("checkpoint " + mf +
                            ": model: n_head does not divide d_model, or n_kv_head does not divide n_head");
  return s;
}

void check_shape(const json& j, const ModelShape& s, const std::string& path) {
  ModelShape got;
  try {
    got = shape_from_json(j.at("model"), path + "/manifest.json");
  } catch (const json::exception& e) {
    throw CorruptCheckpoint("checkpoint " + path + "/manifest.json: corrupt model section (" + library_message(e) +
                            ")");
  }
  const char* hint =
      "resume it with the config it was written with (its manifest.json holds that config), or train this model "
      "in another train.checkpoint_dir";
  if (got.family != s.family)
    throw IncompatibleCheckpoint("checkpoint " + path + ": the model family differs (checkpoint " +
                                     std::string(to_string(got.family)) + ", config " +
                                     std::string(to_string(s.family)) + ")",
                                 hint);
  // Where the model came from does not change the arithmetic, nor a window no shorter than the
  // sequence (which masks nothing): manifests written before they were kept resume alike. A window
  // that masks must be the same window on the same layers.
  ModelShape a = got, b = s;
  a.hf = b.hf = HfOrigin{};
  for (ModelShape* x : {&a, &b}) {
    bool masks = false;
    for (int l = 0; l < x->n_layer; ++l) masks = masks || x->layer_window(l) > 0;
    if (!masks) x->sliding_window = 0, x->window_from = 0;
  }
  if (!(a == b))
    throw IncompatibleCheckpoint("checkpoint " + path + ": model shape differs (checkpoint n_layer " +
                                     std::to_string(got.n_layer) + ", d_model " + std::to_string(got.d_model) +
                                     ", n_head " + std::to_string(got.n_head) + ", vocab " +
                                     std::to_string(got.vocab_size) + ", seq_len " + std::to_string(got.seq_len) +
                                     "; config n_layer " + std::to_string(s.n_layer) + ", d_model " +
                                     std::to_string(s.d_model) + ", n_head " + std::to_string(s.n_head) + ", vocab " +
                                     std::to_string(s.vocab_size) + ", seq_len " + std::to_string(s.seq_len) + ")",
                                 hint);
}

// Streams states.bin tensor by tensor, checking each checksum; hands each unit to `use` when given.
void read_states_file(const std::string& path, const json& j, const ModelShape& shape, const StatesWriter* use) {
  const std::string sf = path + "/states.bin";
  // A byte count or offset: an unsigned integer (a float would not convert to one safely).
  auto bytes_at = [&](const json& o, const char* key) {
    const json& v = o.at(key);
    if (!v.is_number_unsigned())
      throw CorruptCheckpoint("checkpoint " + path + "/manifest.json: " + key + ": " + v.dump() +
                              " is not a byte count");
    return v.get<std::uint64_t>();
  };
  try {
    std::unique_ptr<InputFile> f;  // a regular file, or the checkpoint is corrupt (never blocks on a FIFO)
    try {
      f = std::make_unique<InputFile>(sf, "checkpoint");
    } catch (const Error& e) {
      throw CorruptCheckpoint(e.what());
    }
    const std::uint64_t size = f->size();
    if (size != bytes_at(j, "states_bytes"))
      throw CorruptCheckpoint("checkpoint " + sf + ": " + std::to_string(size) + " bytes, the manifest says " +
                              std::to_string(bytes_at(j, "states_bytes")) + " (truncated?)");
    const auto units = layer_units(shape);
    const json& tensors = j.at("tensors");
    if (tensors.size() != units.size() * 3)
      throw CorruptCheckpoint("checkpoint " + path + "/manifest.json: wrong number of tensors");
    std::vector<float> buf[3];
    for (std::size_t u = 0; u < units.size(); ++u) {
      const std::size_t n = static_cast<std::size_t>(units[u].params);
      for (int k = 0; k < 3; ++k) {
        const json& t = tensors[u * 3 + static_cast<std::size_t>(k)];
        const std::string name = t.at("name").get<std::string>();
        if (bytes_at(t, "bytes") != n * 4)
          throw CorruptCheckpoint("checkpoint " + sf + ": tensor " + name + " has " +
                                  std::to_string(bytes_at(t, "bytes")) + " bytes, the model needs " +
                                  std::to_string(n * 4));
        buf[k].resize(n);
        const std::uint64_t at = bytes_at(t, "offset");
        if (at > size || size - at < n * 4)
          throw CorruptCheckpoint("checkpoint " + sf + ": tensor " + name + " is cut short");
        std::size_t got = 0;
        try {
          got = f->read_at(buf[k].data(), n * 4, at);
        } catch (const IoError&) {  // a failed read, as the file ending early: the checkpoint is not whole
        }
        if (got != n * 4) throw CorruptCheckpoint("checkpoint " + sf + ": tensor " + name + " is cut short");
        if (hex(XXH64(buf[k].data(), n * 4, 0)) != t.at("xxh64").get<std::string>())
          throw CorruptCheckpoint("checkpoint " + sf + ": tensor " + name + " fails its checksum (corrupt)");
      }
      if (use) (*use)(u, buf[0].data(), buf[1].data(), buf[2].data());
    }
  } catch (const json::exception& e) {
    throw CorruptCheckpoint("checkpoint " + path + "/manifest.json: corrupt tensor list (" + library_message(e) + ")");
  }
}

// What the manifest says, read from a manifest that passed read_manifest.
CheckpointInfo info_from(const std::string& path, const json& j, bool unchecked) {
  const std::string mf = path + "/manifest.json";
  CheckpointInfo in;
  in.path = path;
  in.unchecked_manifest = unchecked;
  try {
    const json& step = j.at("step");
    if (!step.is_number_integer() ||
        (step.is_number_unsigned() && step.get<std::uint64_t>() > std::uint64_t{1} << 62) ||
        step.get<std::int64_t>() < 0)  // (a float would not convert to an integer safely)
      throw CorruptCheckpoint("checkpoint " + mf + ": step: " + step.dump() + " is not a step number");
    in.step = step.get<std::int64_t>();
    in.shape = shape_from_json(j.at("model"), mf);
    if (j.contains("precision")) {
      in.precision = precision_from(j["precision"].get<std::string>(), mf);
    } else {  // version 1: from the resolved config it holds
      const json& c = j.at("config");
      const bool fp16 = c.contains("fp16") && c["fp16"].value("enabled", false);
      const bool bf16 = c.contains("bf16") && c["bf16"].value("enabled", false);
      in.precision = fp16 ? Precision::fp16 : bf16 ? Precision::bf16 : Precision::fp32;
    }
    in.optimizer_states = states_from(j, mf);
  } catch (const json::exception& e) {
    throw CorruptCheckpoint("checkpoint " + mf + ": corrupt manifest (" + library_message(e) + ")");
  }
  // The directory's name orders the checkpoints; the manifest's step is what a resume continues from.
  const std::string name = fs::path(path).filename().string();
  long long named = 0;
  char tail = 0;
  if (std::sscanf(name.c_str(), "step-%lld%c", &named, &tail) == 1 && named != in.step)
    throw CorruptCheckpoint("checkpoint " + mf + ": the manifest says step " + std::to_string(in.step) +
                            ", the directory's name step " + std::to_string(named));
  return in;
}

std::string canonical(const std::string& p) {
  std::error_code ec;
  const fs::path c = fs::weakly_canonical(p, ec);
  return ec ? p : c.string();
}

std::string pid_tag() { return std::to_string(::getpid()); }

// The training state a manifest records. Verifying a checkpoint reads it too, so that a checkpoint
// the resume path picks always loads.
CheckpointState state_from_json(const json& j, const std::string& path) {
  CheckpointState s;
  const std::string mf = path + "/manifest.json";
  // A counter: an integer (a float would not convert to one safely).
  auto counter = [&](const json& o, const char* key, std::int64_t lo, std::int64_t hi) {
    const json& v = o.at(key);
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(hi)) ||
        v.get<std::int64_t>() < lo || v.get<std::int64_t>() > hi)
      throw CorruptCheckpoint("checkpoint " + mf + ": " + key + ": " + v.dump() + " is not an integer between " +
                              std::to_string(lo) + " and " + std::to_string(hi));
    return v.get<std::int64_t>();
  };
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  try {
    s.step = counter(j, "step", 0, kMax);
    s.opt_steps = counter(j, "opt_steps", 0, kMax);
    s.rows_drawn = counter(j, "rows_drawn", 0, kMax);
    s.skipped = counter(j, "skipped", 0, kMax);
    const json& sc = j.at("scaler");
    s.loss_scale = sc.at("scale").get<double>();
    s.scaler_iter = counter(sc, "iter", 0, kMax);
    s.scaler_last_overflow = counter(sc, "last_overflow_iter", -1, kMax);
    s.scaler_hysteresis = static_cast<int>(counter(sc, "hysteresis", 0, std::numeric_limits<int>::max()));
  } catch (const json::exception& e) {
    throw CorruptCheckpoint("checkpoint " + mf + ": " + library_message(e));
  }
  return s;
}

// Every number of a manifest in its range and consistent with the others and with the model it
// describes, checked before anything is allocated or replayed from it: the checksum catches damage,
// this catches a manifest edited and sealed again (the checksum is no signature). The limits are
// those no run of zinf can exceed (docs/checkpoints.md, "What a manifest may hold").
void check_values(const json& j, const std::string& path) {
  const std::string mf = path + "/manifest.json";
  auto refuse = [&](const std::string& what) { return CorruptCheckpoint("checkpoint " + mf + ": " + what); };
  constexpr std::int64_t kMaxStep = std::int64_t{1} << 62;
  auto integer = [&](const json& o, const char* key, const std::string& name, std::int64_t lo, std::int64_t hi) {
    const json& v = o.at(key);
    bool ok = v.is_number_integer();
    if (ok && v.is_number_unsigned())  // (beyond an int64 it would wrap)
      ok = hi >= 0 && v.get<std::uint64_t>() <= static_cast<std::uint64_t>(hi) &&
           static_cast<std::int64_t>(v.get<std::uint64_t>()) >= lo;
    else if (ok)
      ok = v.get<std::int64_t>() >= lo && v.get<std::int64_t>() <= hi;
    if (!ok)
      throw refuse(name + ": " + v.dump() + " is not an integer between " + std::to_string(lo) + " and " +
                   std::to_string(hi));
    return v.get<std::int64_t>();
  };
  if (!j.at("config").is_object()) throw refuse("config: not an object");
  const json& config = j.at("config");
  const std::int64_t step = integer(j, "step", "step", 0, kMaxStep);
  const std::int64_t opt_steps = integer(j, "opt_steps", "opt_steps", 0, step);
  const std::int64_t skipped = integer(j, "skipped", "skipped", 0, step);
  if (opt_steps + skipped != step)
    throw refuse("opt_steps " + std::to_string(opt_steps) + " + skipped " + std::to_string(skipped) + " is not step " +
                 std::to_string(step) + " (every step is either applied or skipped)");
  // Each step draws train_batch_size rows; a resume replays every draw, so the bound is tight: at
  // least one row a step, at most 2^20 (or the run's own batch size, when larger) a step.
  std::int64_t per_step = std::int64_t{1} << 20;
  if (config.contains("train_batch_size") && config["train_batch_size"].is_number_integer())
    per_step = std::max(per_step, std::min<std::int64_t>(config["train_batch_size"].get<std::int64_t>(), kMaxStep));
  const std::int64_t most = step > std::numeric_limits<std::int64_t>::max() / per_step
                                ? std::numeric_limits<std::int64_t>::max()
                                : step * per_step;
  integer(j, "rows_drawn", "rows_drawn", step, most);
  // The loss scaler: fp16's scale within the range a config can give it (min_loss_scale 1e-30, an
  // initial 2^126 doubled once), 1 for bf16 and fp32 (which never scale); its iteration counts steps,
  // and the last overflow came before it.
  // The precision its config trains in; a manifest that names one must agree with it.
  auto enabled = [&](const char* k) { return config.contains(k) && config[k].value("enabled", false); };
  const Precision configured = enabled("fp16")   ? Precision::fp16
                               : enabled("bf16") ? Precision::bf16
                                                 : Precision::fp32;
  Precision precision = configured;
  if (j.contains("precision")) {
    precision = precision_from(j["precision"].get<std::string>(), mf);
    if (configured != precision)
      throw refuse("precision: \"" + std::string(to_string(precision)) + "\" but its config trains in " +
                   std::string(to_string(configured)));
  }
  // A state format this zinf does not know is a newer zinf's (refused as incompatible, never passed over).
  (void)states_from(j, mf);
  if (j.contains("optimizer_states") && config.contains("zero_optimization") &&
      config["zero_optimization"].is_object() && config["zero_optimization"].contains("optimizer_states") &&
      config["zero_optimization"]["optimizer_states"] != j["optimizer_states"])
    throw refuse("optimizer_states: " + j["optimizer_states"].dump() + " but its config keeps them as " +
                 config["zero_optimization"]["optimizer_states"].dump());
  const json& sc = j.at("scaler");
  if (!sc.is_object()) throw refuse("scaler: not an object");
  const json& scale = sc.at("scale");
  const double lo = precision == Precision::fp16 ? 1e-30 : 1.0;
  const double hi = precision == Precision::fp16 ? std::ldexp(1.0, 127) : 1.0;
  if (!scale.is_number() || !std::isfinite(scale.get<double>()) || scale.get<double>() < lo || scale.get<double>() > hi)
    throw refuse("scaler.scale: " + scale.dump() + " is not a loss scale of " + std::string(to_string(precision)) +
                 (precision == Precision::fp16 ? " (1e-30 to 2^127)" : " (which is 1)"));
  const std::int64_t iter = integer(sc, "iter", "scaler.iter", 0, step);
  integer(sc, "last_overflow_iter", "scaler.last_overflow_iter", -1, iter - 1);
  integer(sc, "hysteresis", "scaler.hysteresis", 0, std::numeric_limits<int>::max());
  // states.bin: three fp32 tensors a layer unit (master, Adam m, Adam v), back to back, as the model
  // the manifest describes has them.
  const ModelShape shape = shape_from_json(j.at("model"), mf);
  const auto units = layer_units(shape);
  const json& tensors = j.at("tensors");
  if (!tensors.is_array() || tensors.size() != units.size() * 3)
    throw refuse("tensors: not the " + std::to_string(units.size() * 3) + " tensors of its model");
  const char* kinds[3] = {"master", "adam.m", "adam.v"};
  std::uint64_t off = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const json& t = tensors[i];
    const std::string want = units[i / 3].name + "/" + kinds[i % 3];
    const std::uint64_t bytes = static_cast<std::uint64_t>(units[i / 3].params) * 4;
    if (!t.is_object() || t.at("name") != want)
      throw refuse("tensor " + std::to_string(i) + ": " + (t.is_object() ? t.at("name").dump() : t.dump()) +
                   " where its model has " + want);
    if (t.at("offset") != off || t.at("bytes") != bytes)
      throw refuse("tensor " + want + ": offset " + t.at("offset").dump() + ", " + t.at("bytes").dump() +
                   " bytes where its model has offset " + std::to_string(off) + ", " + std::to_string(bytes) +
                   " bytes");
    const json& h = t.at("xxh64");
    if (!h.is_string() || h.get<std::string>().size() != 16 ||
        h.get<std::string>().find_first_not_of("0123456789abcdef") != std::string::npos)
      throw refuse("tensor " + want + ": xxh64 " + h.dump() + " is not a checksum");
    off += bytes;
  }
  if (j.at("states_bytes") != off)
    throw refuse("states_bytes: " + j.at("states_bytes").dump() + " where its model's tensors take " +
                 std::to_string(off));
}

}  // namespace

void set_checkpoint_fault(int nth_save) {
  g_fault_at = nth_save;
  g_saves = 0;
}

std::vector<std::pair<std::int64_t, std::string>> list_checkpoints(const std::string& dir) { return list_steps(dir); }

CheckpointInfo read_checkpoint_info(const std::string& path) {
  bool unchecked = false;
  const json j = read_manifest(path, &unchecked);
  return info_from(path, j, unchecked);
}

std::string move_corrupt_aside(const std::string& path) {
  std::string to = path + ".corrupt";
  for (int i = 2; fs::exists(to); ++i) to = path + ".corrupt-" + std::to_string(i);
  if (::rename(path.c_str(), to.c_str()) != 0) io_fail("rename to " + to, path, errno);
  return to;
}

CheckpointDir::CheckpointDir(std::string dir, int keep_last, const ModelShape& shape, Log log)
    : dir_(std::move(dir)), keep_last_(std::max(keep_last, 1)), shape_(shape), log_(std::move(log)) {}

void CheckpointDir::mark_verified(const std::string& path) { verified_.insert(canonical(path)); }

void CheckpointDir::replace_on_first_save(const std::vector<std::string>& paths) {
  replace_.clear();
  for (const auto& p : paths) replace_.push_back(canonical(p));
}

namespace {

// The manifest's fields before the tensors: the run's state and what it was trained as.
json manifest_head(const Config& c, const CheckpointState& s, const ModelShape& shape) {
  json j;
  j["format"] = kFormat;
  j["version"] = kVersion;
  j["step"] = s.step;
  j["opt_steps"] = s.opt_steps;
  j["rows_drawn"] = s.rows_drawn;
  j["skipped"] = s.skipped;
  j["scaler"] = {{"scale", s.loss_scale},
                 {"iter", s.scaler_iter},
                 {"last_overflow_iter", s.scaler_last_overflow},
                 {"hysteresis", s.scaler_hysteresis}};
  j["model"] = shape_json(shape);
  j["precision"] = std::string(to_string(c.precision()));
  // How the run kept m and v; the tensors themselves are fp32 (decoded exactly) in every mode.
  j["optimizer_states"] = cpu_adam::state_format_name(c.zero.optimizer_states);
  j["config"] = json::parse(c.resolved_json);
  j["tensors"] = json::array();
  return j;
}

// Every unit's master, Adam m and Adam v, as `read` hands them over, into folder/states.bin, each
// listed in j["tensors"] with its offset and checksum. `nth`: this process's save count (the fault hook).
void write_states(const std::string& folder, const ModelShape& shape, const StatesReader& read, int nth, json& j) {
  SyncedFile states(folder + "/states.bin");
  const auto units = layer_units(shape);
  std::uint64_t total = 0;
  for (const auto& u : units) total += static_cast<std::uint64_t>(u.params) * 12;
  if (fault_at() == nth) states.fail_after(static_cast<std::int64_t>(total / 2));
  std::uint64_t off = 0;
  std::vector<float> buf[3];
  const char* kinds[3] = {"master", "adam.m", "adam.v"};
  for (std::size_t u = 0; u < units.size(); ++u) {
    const std::size_t n = static_cast<std::size_t>(units[u].params);
    for (auto& b : buf) b.resize(n);
    read(u, buf[0].data(), buf[1].data(), buf[2].data());
    for (int k = 0; k < 3; ++k) {
      states.write(buf[k].data(), n * 4);
      j["tensors"].push_back({{"name", units[u].name + "/" + kinds[k]},
                              {"offset", off},
                              {"bytes", n * 4},
                              {"xxh64", hex(XXH64(buf[k].data(), n * 4, 0))}});
      off += n * 4;
    }
  }
  states.finish();
  j["states_bytes"] = off;
}

// The manifest, sealed with its checksum, into folder/manifest.json.
void write_manifest(const std::string& folder, json& j) {
  j[kChecksumKey] = manifest_checksum(j);
  SyncedFile manifest(folder + "/manifest.json");
  const std::string text = j.dump(1);
  manifest.write(text.data(), text.size());
  manifest.finish();
}

// The checkpoints to rename aside (checkpoint, its temporary name) before `final_path` is published:
// those the run replaces (`replace`), and a checkpoint of the same step already there — an earlier
// run's (in `replace`), one this run can vouch for (in `verified`, or sound: a rerun after resume), or
// one that turns out corrupt (moved aside here, for good).
std::vector<std::pair<std::string, std::string>> checkpoints_to_move_aside(const std::vector<std::string>& replace,
                                                                           const std::set<std::string>& verified,
                                                                           const std::string& final_path,
                                                                           const ModelShape& shape,
                                                                           const CheckpointDir::Log& log) {
  std::vector<std::pair<std::string, std::string>> aside;
  for (const auto& p : replace)
    if (fs::exists(p)) aside.emplace_back(p, p + ".old-" + pid_tag());
  if (fs::exists(final_path) && std::find(replace.begin(), replace.end(), canonical(final_path)) == replace.end()) {
    bool sound = verified.count(canonical(final_path)) > 0;
    if (!sound) try {
        verify_checkpoint(final_path, shape);
        sound = true;
      } catch (const CorruptCheckpoint& e) {
        const std::string to = move_corrupt_aside(final_path);
        if (log) log("checkpoint: " + std::string(e.what()) + " — moved aside to " + to);
      } catch (const IncompatibleCheckpoint&) {
        sound = true;  // a step this run has reached: its own checkpoint takes the name
      }
    if (sound) aside.emplace_back(final_path, final_path + ".old-" + pid_tag());
  }
  return aside;
}

}  // namespace

std::string CheckpointDir::save(const Config& c, const CheckpointState& s, const StatesReader& read) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) io_fail("create directory", dir_, ec.value());
  const int nth = ++g_saves;
  const std::string final_path = dir_ + "/" + step_name(s.step);
  const std::string tmp = final_path + ".tmp-" + pid_tag();
  fs::remove_all(tmp, ec);
  if (::mkdir(tmp.c_str(), 0755) != 0) io_fail("create directory", tmp, errno);
  std::vector<std::pair<std::string, std::string>> aside;  // (checkpoint, its temporary name) until published
  try {
    json j = manifest_head(c, s, shape_);
    write_states(tmp, shape_, read, nth, j);
    write_manifest(tmp, j);
    fsync_dir(tmp);
    // Checkpoints this run replaces go only once their successor has been read back whole.
    if (!replace_.empty()) verify_checkpoint(tmp, shape_);
    aside = checkpoints_to_move_aside(replace_, verified_, final_path, shape_, log_);
    for (std::size_t i = 0; i < aside.size(); ++i)
      if (::rename(aside[i].first.c_str(), aside[i].second.c_str()) != 0) {
        const int e = errno;
        const auto failed = aside[i];
        aside.resize(i);  // those before it are renamed back below
        io_fail("rename to " + failed.second, failed.first, e);
      }
    if (::rename(tmp.c_str(), final_path.c_str()) != 0) io_fail("rename to " + final_path, tmp, errno);
    fsync_dir(dir_);
  } catch (...) {
    fs::remove_all(tmp, ec);                                          // never leave a torn checkpoint behind
    for (const auto& [p, t] : aside) ::rename(t.c_str(), p.c_str());  // nor lose the ones it was to replace
    throw;
  }
  for (const auto& [p, t] : aside) {
    fs::remove_all(t, ec);
    verified_.erase(canonical(p));
  }
  if (!replace_.empty() && log_)
    log_("checkpoint: " + std::to_string(replace_.size()) +
         " earlier checkpoint(s) replaced (train.overwrite_checkpoints)");
  replace_.clear();
  verified_.insert(canonical(final_path));
  prune();
  recover_interrupted_saves(dir_, log_);
  return final_path;
}

namespace {

constexpr const char* kCheckpointFiles[] = {"manifest.json", "states.bin"};

// Why the folder `dir` left behind by a save or a prune is not provably zinf's, or "" when it is: a
// real folder (a symbolic link is never followed) holding nothing but the regular files a checkpoint
// has (a save killed right after its mkdir leaves it empty).
std::string not_a_leftover(const std::string& dir) {
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) return std::strerror(errno);
  if (S_ISLNK(st.st_mode)) return "a symbolic link, not followed";
  if (!S_ISDIR(st.st_mode)) return "not a folder";
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  DIR* d = fd < 0 ? nullptr : ::fdopendir(fd);
  if (!d) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    return "cannot be read (" + why + ")";
  }
  std::string why;
  while (const dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n == "." || n == "..") continue;
    if (std::find(std::begin(kCheckpointFiles), std::end(kCheckpointFiles), n) == std::end(kCheckpointFiles)) {
      why = "holds " + n + ", which zinf does not write there";
      break;
    }
    struct stat f {};
    if (::fstatat(fd, n.c_str(), &f, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(f.st_mode)) {
      why = "its " + n + " is not a regular file";
      break;
    }
  }
  ::closedir(d);
  return why;
}

// Removes a folder not_a_leftover() passed: its checkpoint files (by name, inside the folder opened
// without following a link), then the folder itself, which fails should anything else be there now.
bool remove_leftover(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return false;
  for (const char* n : kCheckpointFiles) ::unlinkat(fd, n, 0);
  ::close(fd);
  return ::rmdir(dir.c_str()) == 0;
}

}  // namespace

void recover_interrupted_saves(const std::string& dir, const std::function<void(const std::string&)>& log) {
  // A save writes step-M.tmp-PID, renames the checkpoints it replaces to step-N.old-PID, renames the
  // temporary to step-M (the publication) and only then removes the .old-PID ones. So for a process
  // PID that is gone: a .tmp-PID still there means it died before publishing, and its .old-PID
  // checkpoints are the directory's real state (renamed back); without one it had published, and
  // its .old-PID checkpoints were already superseded (removed). keep_last renames a checkpoint to
  // step-N.pruned-PID before deleting it: such a folder is removed. A live PID's files are its own;
  // a folder that is not provably a checkpoint's (a symbolic link, other files) is left alone, with a line.
  struct Leftover {
    std::string path;
    std::string base;  // step-N
    std::string kind;  // "tmp", "old" or "pruned"
    long pid;
  };
  std::vector<Leftover> found;
  std::set<long> pids_with_tmp;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    long long step = 0;
    int consumed = 0;
    if (n.rfind("step-", 0) != 0 || std::sscanf(n.c_str(), "step-%lld%n", &step, &consumed) != 1) continue;
    const std::string rest = n.substr(static_cast<std::size_t>(consumed));
    for (const char* kind : {"tmp", "old", "pruned"}) {
      const std::string tag = std::string(".") + kind + "-";
      if (rest.rfind(tag, 0) != 0) continue;
      const std::string digits = rest.substr(tag.size());
      if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
      const long pid = std::stol(digits);
      if (pid == ::getpid() || ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM) continue;  // a live run's
      found.push_back({e.path().string(), n.substr(0, static_cast<std::size_t>(consumed)), kind, pid});
      if (std::string(kind) == "tmp") pids_with_tmp.insert(pid);
    }
  }
  bool changed = false;
  for (const auto& f : found) {
    if (const std::string why = not_a_leftover(f.path); !why.empty()) {
      if (log) log("checkpoint: " + f.path + " left alone (" + why + ")");
      continue;
    }
    const fs::path back = fs::path(dir) / f.base;
    struct stat st {};
    if (f.kind == "old" && pids_with_tmp.count(f.pid)) {
      if (::lstat(back.c_str(), &st) != 0 && ::rename(f.path.c_str(), back.c_str()) == 0) {
        changed = true;
        if (log)
          log("checkpoint: " + back.string() +
              " restored (a run that was replacing it stopped before its checkpoint was published)");
      }
      continue;
    }
    changed = remove_leftover(f.path) || changed;
  }
  if (changed) fsync_dir(dir);
}

void CheckpointDir::prune() {
  int kept = 0;
  std::error_code ec;
  for (const auto& [step, path] : list_steps(dir_)) {
    const std::string key = canonical(path);
    if (foreign_.count(key)) continue;
    if (!verified_.count(key)) {
      try {
        verify_checkpoint(path, shape_);
        verified_.insert(key);
      } catch (const CorruptCheckpoint& e) {
        const std::string to = move_corrupt_aside(path);
        if (log_)
          log_("checkpoint: " + std::string(e.what()) + " — moved aside to " + to + ", not counted by keep_last");
        continue;
      } catch (const IncompatibleCheckpoint& e) {
        foreign_.insert(key);
        if (log_) log_("checkpoint: " + std::string(e.what()) + " — left alone, not counted by keep_last");
        continue;
      }
    }
    if (++kept > keep_last_) {
      // Out of the way under a marked name first (one atomic rename, made durable), then deleted: a
      // kill leaves the whole checkpoint or a step-N.pruned-PID folder the next run removes, never a
      // half-deleted step-N.
      const std::string marked = path + ".pruned-" + pid_tag();
      if (::rename(path.c_str(), marked.c_str()) != 0) {  // kept (and counted again by the next save)
        if (log_) log_("checkpoint: keep_last cannot remove " + path + " (" + std::strerror(errno) + ")");
        continue;
      }
      fsync_dir(dir_);
      if (std::getenv("ZINF_TEST_KILL_IN_PRUNE")) ::raise(SIGKILL);  // test hook: killed between the two
      fs::remove_all(marked, ec);
      verified_.erase(key);
    }
  }
}

ModelShape checkpoint_shape(const std::string& path) { return read_checkpoint_info(path).shape; }

void verify_checkpoint(const std::string& path, const ModelShape& shape) {
  bool unchecked = false;
  const json j = read_manifest(path, &unchecked);
  info_from(path, j, unchecked);
  check_shape(j, shape, path);
  (void)state_from_json(j, path);
  read_states_file(path, j, shape, nullptr);
}

CheckpointState load_checkpoint(const std::string& path, const ModelShape& shape, const StatesWriter& write,
                                bool verify_first) {
  bool unchecked = false;
  const json j = read_manifest(path, &unchecked);
  const CheckpointInfo info = info_from(path, j, unchecked);
  check_shape(j, shape, path);
  if (verify_first) read_states_file(path, j, shape, nullptr);  // every checksum before anything is overwritten
  read_states_file(path, j, shape, &write);
  CheckpointState s = state_from_json(j, path);
  s.step = info.step;
  s.precision = info.precision;
  s.optimizer_states = info.optimizer_states;
  return s;
}

std::vector<std::vector<float>> load_checkpoint_weights(const std::string& path, const ModelShape& shape) {
  // Nothing is allocated for a checkpoint whose states.bin could not hold the model: the manifest's
  // states_bytes matches its model (read_manifest) and must match the file.
  bool unchecked = false;
  const json j = read_manifest(path, &unchecked);
  check_shape(j, shape, path);
  const std::string sf = path + "/states.bin";
  std::uint64_t size = 0;
  try {
    size = InputFile(sf, "checkpoint").size();
  } catch (const Error& e) {
    throw CorruptCheckpoint(e.what());
  }
  if (j.at("states_bytes") != size)
    throw CorruptCheckpoint("checkpoint " + sf + ": " + std::to_string(size) + " bytes, the manifest says " +
                            j.at("states_bytes").dump() + " (truncated?)");
  std::vector<std::vector<float>> units;
  for (const auto& u : layer_units(shape)) units.emplace_back(static_cast<std::size_t>(u.params));
  load_checkpoint(path, shape, [&](std::size_t u, const float* master, const float*, const float*) {
    std::copy(master, master + units[u].size(), units[u].begin());
  });
  return units;
}

ResumeChoice choose_checkpoint(const std::string& dir, const std::string& which, const ModelShape& shape) {
  ResumeChoice r;
  auto take = [&](const std::string& path) {
    const CheckpointInfo info = read_checkpoint_info(path);
    verify_checkpoint(path, shape);
    r.path = path;
    r.step = info.step;
    if (info.unchecked_manifest)
      r.notes.push_back("checkpoint " + path +
                        " was written before manifests carried a checksum: its tensors are verified, "
                        "its step, data position and loss-scaler state are taken as they are");
  };
  if (which != "latest") {
    std::error_code ec;
    if (!fs::is_directory(which, ec))
      throw ConfigError("checkpoint " + which + ": no such directory",
                        "name a step-N directory under train.checkpoint_dir, or `latest` for the newest valid one");
    if (!fs::exists(fs::path(which) / "manifest.json", ec) && !list_steps(which).empty())
      throw ConfigError("checkpoint " + which + ": a directory of checkpoints, not one checkpoint",
                        "name one of its step-N directories, or set train.checkpoint_dir to it and ask for `latest`");
    take(which);
    return r;
  }
  for (const auto& [step, path] : list_steps(dir)) {
    try {
      take(path);
      return r;
    } catch (const CorruptCheckpoint& e) {  // damage: an older one may be whole
      r.corrupt.push_back(path);
      r.notes.push_back(std::string(e.what()) + " — passed over as corrupt, falling back to an earlier checkpoint");
    }
    // IncompatibleCheckpoint propagates: the newest sound checkpoint is the run's latest state, and
    // this config cannot continue it; an older one would silently lose the newer training.
  }
  return r;
}

// ---- the folder's lock ------------------------------------------------------------------------------

namespace {

// A process's command line, its arguments separated by spaces ("" when it cannot be read).
std::string command_of(long pid) {
  std::string c = read_small_file("/proc/" + std::to_string(pid) + "/cmdline");
  std::replace(c.begin(), c.end(), '\0', ' ');
  while (!c.empty() && c.back() == ' ') c.pop_back();
  return c.size() > 1000 ? c.substr(0, 1000) + "…" : c;
}

// Who holds the lock on the file open as `fd`: "process PID (COMMAND)" for each other process the
// kernel lists in /proc/locks as holding a flock on that file; failing that, what the holder wrote
// into the file (announce()); failing that, a description without them.
std::string holder_of(int fd) {
  struct stat st {};
  std::string who;
  if (::fstat(fd, &st) == 0) {
    std::ifstream locks("/proc/locks");
    std::set<long> pids;
    for (std::string line; std::getline(locks, line);) {
      if (line.find("->") != std::string::npos) continue;  // a waiter, not a holder
      std::istringstream in(line);
      std::string id, kind, advisory, mode, where;
      long pid = 0;
      in >> id >> kind >> advisory >> mode >> pid >> where;
      const auto colon = where.rfind(':');
      if (kind != "FLOCK" || colon == std::string::npos || pid <= 0 || pid == ::getpid()) continue;
      if (std::strtoull(where.c_str() + colon + 1, nullptr, 10) == static_cast<unsigned long long>(st.st_ino))
        pids.insert(pid);
    }
    for (const long pid : pids) {
      const std::string command = command_of(pid);
      who += (who.empty() ? "" : ", ") + ("process " + std::to_string(pid)) +
             (command.empty() ? "" : " (" + command + ")");
    }
  }
  if (!who.empty()) return who;
  char buf[2048];
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  const std::string text(buf, n > 0 ? static_cast<std::size_t>(n) : 0);
  long pid = 0;
  if (std::sscanf(text.c_str(), "pid %ld", &pid) != 1 || pid <= 0) return "a process that has not written its PID yet";
  const auto cmd = text.find("\ncommand ");
  std::string command = cmd == std::string::npos ? "" : text.substr(cmd + 9);
  if (const auto end = command.find('\n'); end != std::string::npos) command.resize(end);
  return "process " + std::to_string(pid) + (command.empty() ? "" : " (" + command + ")");
}

}  // namespace

CheckpointLock::CheckpointLock(const std::string& dir, Mode mode, const std::string& what) {
  const std::string file = (fs::path(dir) / kLockFile).string();
  const bool write = mode == Mode::write;
  // Never follows a link, never blocks on a FIFO planted under the name.
  const int flags = O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | (write ? O_RDWR | O_CREAT : O_RDONLY);
  fd_ = ::open(file.c_str(), flags, 0644);
  if (fd_ < 0) {
    const int e = errno;
    if (!write && (e == ENOENT || e == EACCES)) return;  // no writer of this zinf has been there; nothing to share
    throw ConfigError(what + " " + dir + ": cannot open its lock file " + file + " (" +
                          (e == ELOOP ? std::string("a symbolic link") : std::strerror(e)) + ")",
                      "remove " + file + " if it is not zinf's; zinf recreates it");
  }
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    throw ConfigError(what + " " + dir + ": its lock file " + file + " is not a regular file",
                      "remove it; zinf recreates it");
  }
  if (::flock(fd_, (write ? LOCK_EX : LOCK_SH) | LOCK_NB) == 0) {
    write_ = write;
    return;
  }
  const int e = errno;
  // A writer holds it exclusively, or readers share it (then a shared lock is granted).
  const bool readers = e == EWOULDBLOCK && write && ::flock(fd_, LOCK_SH | LOCK_NB) == 0;
  const std::string holder = e == EWOULDBLOCK ? holder_of(fd_) : "";
  ::close(fd_);
  fd_ = -1;
  if (e != EWOULDBLOCK) throw ConfigError(what + " " + dir + ": cannot lock " + file + " (" + std::strerror(e) + ")");
  if (readers)
    throw ConfigError(what + " " + dir + ": being read by another zinf (eval, export or generate: " + holder +
                          "); a run writing checkpoints there could remove what it reads",
                      "start the run when it has finished, or choose another train.checkpoint_dir");
  if (write)
    throw ConfigError(what + " " + dir + ": in use by another run, " + holder +
                          "; two runs in one folder overwrite and prune each other's checkpoints",
                      "wait for it to end, or give this run another train.checkpoint_dir");
  throw ConfigError(what + " " + dir + ": a run is writing checkpoints there, " + holder +
                        ", and its keep_last may remove a checkpoint while it is read",
                    "read it when that run has ended, or copy the checkpoint out of the folder first");
}

void CheckpointLock::announce() {
  if (fd_ < 0 || !write_) return;
  const std::string text = "pid " + std::to_string(::getpid()) + "\ncommand " + command_of(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) != 0 || write_all(fd_, text.data(), text.size()) != 0) {
    // The lock holds without the text: a refusal names the holder from /proc/locks.
  }
}

CheckpointLock::~CheckpointLock() {
  if (fd_ >= 0) ::close(fd_);  // the kernel releases the lock with the last descriptor
}

std::string checkpoint_folder(const std::string& checkpoint) {
  fs::path p = fs::path(checkpoint).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // "ck/step-00000004/" names step-00000004
  const std::string parent = p.parent_path().string();
  return parent.empty() ? "." : parent;
}

}  // namespace zinf
