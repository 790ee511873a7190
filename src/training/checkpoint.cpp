// checkpoint.cpp — atomic, verified checkpoints (zinf/checkpoint.h).
#include "zinf/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "zinf/error.h"

namespace zinf {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr char kFormat[] = "zinf-checkpoint";
constexpr int kVersion = 1;

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
    if (std::sscanf(n.c_str(), "step-%lld%c", &step, &tail) == 1 && e.is_directory()) out.emplace_back(step, e.path().string());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

// nlohmann's message without its "[json.exception.type_error.302] " tag: what is wrong, for one
// error line naming the manifest.
std::string json_why(const json::exception& e) {
  const std::string m = e.what();
  const auto p = m.find("] ");
  return p == std::string::npos ? m : m.substr(p + 2);
}

json read_manifest(const std::string& path) {
  const std::string mf = path + "/manifest.json";
  std::ifstream f(mf);
  if (!f) throw Error("checkpoint " + mf + ": missing or unreadable");
  try {
    json j = json::parse(f);
    if (!j.is_object() || j.value("format", "") != kFormat) throw Error("checkpoint " + mf + ": not a zinf checkpoint manifest");
    if (!j.contains("version") || j["version"] != kVersion)
      throw Error("checkpoint " + mf + ": unsupported version " + (j.contains("version") ? j["version"].dump() : "(none)"));
    return j;
  } catch (const json::exception& e) {
    throw Error("checkpoint " + mf + ": corrupt manifest (" + json_why(e) + ")");
  }
}

// The model section of a manifest: GPT-2's five numbers, and the llama family's settings when present
// (checkpoints from before the llama family have none: they are GPT-2).
json shape_json(const ModelShape& s) {
  json m = {{"n_layer", s.n_layer}, {"n_head", s.n_head}, {"d_model", s.d_model}, {"vocab_size", s.vocab_size}, {"seq_len", s.seq_len}};
  if (s.family == ModelFamily::llama)
    m.update({{"family", "llama"}, {"n_kv_head", s.n_kv_head}, {"d_ff", s.d_ff}, {"tie_embeddings", s.tie_embeddings},
              {"qkv_bias", s.qkv_bias}, {"rope_theta", s.rope_theta}, {"norm_eps", s.norm_eps}, {"rope_factor", s.rope_factor},
              {"rope_low_freq_factor", s.rope_low_freq_factor}, {"rope_high_freq_factor", s.rope_high_freq_factor},
              {"rope_original_max", s.rope_original_max}, {"max_positions", s.max_positions}});
  return m;
}
// Throws json::exception on a missing key or a wrong type, Error (naming `mf`) on a size no config
// can give (the bounds are the run config's), so no caller builds a model from a corrupt manifest.
ModelShape shape_from_json(const json& m, const std::string& mf) {
  auto size = [&](const char* key, std::int64_t hi, std::int64_t lo = 1) {
    const json& v = m.at(key);
    if (!v.is_number_integer() || v.get<std::int64_t>() < lo || v.get<std::int64_t>() > hi)
      throw Error("checkpoint " + mf + ": model." + key + ": " + v.dump() + " is not a size between " + std::to_string(lo) + " and " +
                  std::to_string(hi));
    return static_cast<int>(v.get<std::int64_t>());
  };
  ModelShape s{size("n_layer", 4096), size("n_head", 4096), size("d_model", 1 << 20), size("vocab_size", 1 << 24),
               size("seq_len", 1 << 20)};
  if (m.value("family", std::string("gpt2")) == "llama") {
    s.family = ModelFamily::llama;
    s.n_kv_head = size("n_kv_head", 4096), s.d_ff = size("d_ff", 1 << 22);
    s.tie_embeddings = m.at("tie_embeddings").get<bool>(), s.qkv_bias = m.at("qkv_bias").get<bool>();
    s.rope_theta = m.at("rope_theta").get<double>(), s.norm_eps = m.at("norm_eps").get<double>();
    s.rope_factor = m.at("rope_factor").get<double>(), s.rope_low_freq_factor = m.at("rope_low_freq_factor").get<double>();
    s.rope_high_freq_factor = m.at("rope_high_freq_factor").get<double>(), s.rope_original_max = m.at("rope_original_max").get<double>();
    s.max_positions = m.contains("max_positions") ? size("max_positions", 1 << 30, 0) : 0;  // 0: seq_len
  }
  if (s.d_model % s.n_head != 0 || s.n_head % s.kv_heads() != 0)
    throw Error("checkpoint " + mf + ": model: n_head does not divide d_model, or n_kv_head does not divide n_head");
  return s;
}

void check_shape(const json& j, const ModelShape& s, const std::string& path) {
  ModelShape got;
  try {
    got = shape_from_json(j.at("model"), path + "/manifest.json");
  } catch (const json::exception& e) {
    throw Error("checkpoint " + path + "/manifest.json: model: " + json_why(e));
  }
  if (got.family != s.family)
    throw Error("checkpoint " + path + ": the model family differs (checkpoint " + std::string(to_string(got.family)) + ", config " +
                std::string(to_string(s.family)) + ")");
  if (!(got == s))
    throw Error("checkpoint " + path + ": model shape differs (checkpoint n_layer " + std::to_string(got.n_layer) + ", d_model " +
                std::to_string(got.d_model) + ", n_head " + std::to_string(got.n_head) + ", vocab " + std::to_string(got.vocab_size) +
                ", seq_len " + std::to_string(got.seq_len) + "; config n_layer " + std::to_string(s.n_layer) + ", d_model " +
                std::to_string(s.d_model) + ", n_head " + std::to_string(s.n_head) + ", vocab " + std::to_string(s.vocab_size) +
                ", seq_len " + std::to_string(s.seq_len) + ")");
}

// Streams states.bin tensor by tensor, checking each checksum; hands each unit to `use` when given.
// Throws json::exception when the manifest's states_bytes or tensors are missing or mistyped.
void read_states_file_or_throw_json(const std::string& path, const json& j, const ModelShape& shape, const StatesWriter* use) {
  const std::string sf = path + "/states.bin";
  // A byte count or offset: an unsigned integer (a float would not convert to one safely).
  auto bytes_at = [&](const json& o, const char* key) {
    const json& v = o.at(key);
    if (!v.is_number_unsigned()) throw Error("checkpoint " + path + "/manifest.json: " + key + ": " + v.dump() + " is not a byte count");
    return v.get<std::uint64_t>();
  };
  std::ifstream f(sf, std::ios::binary);
  if (!f) throw Error("checkpoint " + sf + ": missing or unreadable");
  f.seekg(0, std::ios::end);
  const std::uint64_t size = static_cast<std::uint64_t>(f.tellg());
  f.seekg(0);
  if (size != bytes_at(j, "states_bytes"))
    throw Error("checkpoint " + sf + ": " + std::to_string(size) + " bytes, the manifest says " +
                std::to_string(bytes_at(j, "states_bytes")) + " (truncated?)");
  const auto units = layer_units(shape);
  const json& tensors = j.at("tensors");
  if (tensors.size() != units.size() * 3) throw Error("checkpoint " + path + "/manifest.json: wrong number of tensors");
  std::vector<float> buf[3];
  for (std::size_t u = 0; u < units.size(); ++u) {
    const std::size_t n = static_cast<std::size_t>(units[u].params);
    for (int k = 0; k < 3; ++k) {
      const json& t = tensors[u * 3 + static_cast<std::size_t>(k)];
      const std::string name = t.at("name").get<std::string>();
      if (bytes_at(t, "bytes") != n * 4)
        throw Error("checkpoint " + sf + ": tensor " + name + " has " + std::to_string(bytes_at(t, "bytes")) +
                    " bytes, the model needs " + std::to_string(n * 4));
      buf[k].resize(n);
      const std::uint64_t at = bytes_at(t, "offset");
      if (at > size || size - at < n * 4) throw Error("checkpoint " + sf + ": tensor " + name + " is cut short");
      f.seekg(static_cast<std::streamoff>(at));
      f.read(reinterpret_cast<char*>(buf[k].data()), static_cast<std::streamsize>(n * 4));
      if (!f) throw Error("checkpoint " + sf + ": tensor " + name + " is cut short");
      if (hex(XXH64(buf[k].data(), n * 4, 0)) != t.at("xxh64").get<std::string>())
        throw Error("checkpoint " + sf + ": tensor " + name + " fails its checksum (corrupt)");
    }
    if (use) (*use)(u, buf[0].data(), buf[1].data(), buf[2].data());
  }
}

void read_states_file(const std::string& path, const json& j, const ModelShape& shape, const StatesWriter* use) {
  try {
    read_states_file_or_throw_json(path, j, shape, use);
  } catch (const json::exception& e) {  // a key missing or of the wrong type in states_bytes or tensors
    throw Error("checkpoint " + path + "/manifest.json: " + json_why(e));
  }
}

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
      throw Error("checkpoint " + mf + ": " + key + ": " + v.dump() + " is not an integer between " + std::to_string(lo) + " and " +
                  std::to_string(hi));
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
    throw Error("checkpoint " + mf + ": " + json_why(e));
  }
  return s;
}

}  // namespace

void set_checkpoint_fault(int nth_save) {
  g_fault_at = nth_save;
  g_saves = 0;
}

std::string save_checkpoint(const std::string& dir, int keep_last, const Config& c, const ModelShape& shape,
                            const CheckpointState& s, const StatesReader& read) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) io_fail("create directory", dir, ec.value());
  const int nth = ++g_saves;
  const std::string final_path = dir + "/" + step_name(s.step);
  const std::string tmp = final_path + ".tmp-" + std::to_string(::getpid());
  fs::remove_all(tmp, ec);
  if (::mkdir(tmp.c_str(), 0755) != 0) io_fail("create directory", tmp, errno);
  try {
    json j;
    j["format"] = kFormat;
    j["version"] = kVersion;
    j["step"] = s.step;
    j["opt_steps"] = s.opt_steps;
    j["rows_drawn"] = s.rows_drawn;
    j["skipped"] = s.skipped;
    j["scaler"] = {{"scale", s.loss_scale}, {"iter", s.scaler_iter}, {"last_overflow_iter", s.scaler_last_overflow},
                   {"hysteresis", s.scaler_hysteresis}};
    j["model"] = shape_json(shape);
    j["config"] = json::parse(c.resolved_json);
    j["tensors"] = json::array();
    SyncedFile states(tmp + "/states.bin");
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
        j["tensors"].push_back({{"name", units[u].name + "/" + kinds[k]}, {"offset", off}, {"bytes", n * 4},
                                {"xxh64", hex(XXH64(buf[k].data(), n * 4, 0))}});
        off += n * 4;
      }
    }
    states.finish();
    j["states_bytes"] = off;
    SyncedFile manifest(tmp + "/manifest.json");
    const std::string text = j.dump(1);
    manifest.write(text.data(), text.size());
    manifest.finish();
    fsync_dir(tmp);
    // Publish: an older checkpoint of the same step (a rerun after resume) is replaced.
    if (fs::exists(final_path)) {
      const std::string old = final_path + ".old-" + std::to_string(::getpid());
      if (::rename(final_path.c_str(), old.c_str()) != 0) io_fail("rename", final_path, errno);
      fs::remove_all(old, ec);
    }
    if (::rename(tmp.c_str(), final_path.c_str()) != 0) io_fail("rename to " + final_path, tmp, errno);
    fsync_dir(dir);
  } catch (...) {
    fs::remove_all(tmp, ec);  // never leave a torn checkpoint behind
    throw;
  }
  // Keep the newest keep_last; also sweep temporaries of runs that were killed mid-write.
  auto steps = list_steps(dir);
  for (std::size_t i = static_cast<std::size_t>(std::max(keep_last, 1)); i < steps.size(); ++i) fs::remove_all(steps[i].second, ec);
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("step-", 0) == 0 && (n.find(".tmp-") != std::string::npos || n.find(".old-") != std::string::npos) &&
        e.path().string() != tmp)
      fs::remove_all(e.path(), ec);
  }
  return final_path;
}

ModelShape checkpoint_shape(const std::string& path) {
  const json j = read_manifest(path);
  try {
    return shape_from_json(j.at("model"), path + "/manifest.json");
  } catch (const json::exception& e) {
    throw Error("checkpoint " + path + "/manifest.json: model: " + json_why(e));
  }
}

void verify_checkpoint(const std::string& path, const ModelShape& shape) {
  const json j = read_manifest(path);
  check_shape(j, shape, path);
  (void)state_from_json(j, path);
  read_states_file(path, j, shape, nullptr);
}

CheckpointState load_checkpoint(const std::string& path, const ModelShape& shape, const StatesWriter& write) {
  const json j = read_manifest(path);
  check_shape(j, shape, path);
  verify_checkpoint(path, shape);  // every checksum before anything is overwritten
  read_states_file(path, j, shape, &write);
  return state_from_json(j, path);
}

std::string latest_valid_checkpoint(const std::string& dir, const ModelShape& shape, std::vector<std::string>* skipped) {
  for (const auto& [step, path] : list_steps(dir)) {
    try {
      verify_checkpoint(path, shape);
      return path;
    } catch (const Error& e) {
      if (skipped) skipped->push_back(std::string(e.what()) + " — falling back to an earlier checkpoint");
    }
  }
  return "";
}

}  // namespace zinf
