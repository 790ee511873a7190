// monitor.cpp — see monitor.h.
#include "app/train/monitor.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>

#include "io/files.h"
#include "zinf/error.h"

namespace zinf {
namespace {

// The shortest text that reads back as the same double (Python's repr, as DeepSpeed's csv writer
// prints a float); inf and nan as "inf" and "nan".
std::string number(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

double wall_clock() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

CsvScalars::CsvScalars(std::string dir) : dir_(std::move(dir)) {}

CsvScalars::~CsvScalars() {
  for (auto& [tag, fd] : fds_) ::close(fd);
}

std::string CsvScalars::file_name(const std::string& tag) {
  std::string f = tag;
  for (char& ch : f)
    if (ch == '/' || ch == ' ') ch = '_';
  return f + ".csv";
}

int CsvScalars::open_file(const std::string& tag) {
  if (auto it = fds_.find(tag); it != fds_.end()) return it->second;
  const std::string path = dir_ + "/" + file_name(tag);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0666);
  if (fd < 0) {
    const int e = errno;
    throw IoError(path + ": cannot open the CSV monitor file (" + std::strerror(e) + ")", e);
  }
  fds_[tag] = fd;
  struct stat st {};
  if (::fstat(fd, &st) == 0 && st.st_size == 0) {  // a new file (a resumed run appends below its header)
    const std::string header = "step," + tag.substr(tag.rfind('/') + 1) + "\n";
    if (const int e = write_all(fd, header.data(), header.size()))
      throw IoError(path + ": write failed (" + std::strerror(e) + ")", e);
  }
  return fd;
}

void CsvScalars::write(std::int64_t step, const std::vector<std::pair<std::string, double>>& values) {
  for (const auto& [tag, v] : values) {
    const int fd = open_file(tag);
    const std::string line = std::to_string(step) + "," + number(v) + "\n";
    if (const int e = write_all(fd, line.data(), line.size()))
      throw IoError(dir_ + "/" + file_name(tag) + ": write failed (" + std::strerror(e) + ")", e);
  }
}

Monitor::Monitor(const Config& c, bool write)
    : batch_(c.train_batch_size), fp16_(c.fp16.enabled), breakdown_(c.wall_clock_breakdown) {
  if (!write) return;
  if (!c.monitor.tensorboard_dir.empty()) tb_ = std::make_unique<EventFileWriter>(c.monitor.tensorboard_dir);
  if (!c.monitor.csv_dir.empty()) csv_ = std::make_unique<CsvScalars>(c.monitor.csv_dir);
}

std::vector<std::pair<std::string, double>> Monitor::scalars(const StepReport& r) const {
  std::vector<std::pair<std::string, double>> v = {{"Train/Samples/train_loss", r.loss}, {"Train/Samples/lr", r.lr}};
  if (fp16_) v.emplace_back("Train/Samples/loss_scale", r.loss_scale);
  v.emplace_back("Train/Samples/grad_norm", r.grad_norm);
  v.emplace_back("Train/Samples/tokens_per_s", r.tokens_per_s);
  v.emplace_back("Train/Samples/step_time_ms", 1e3 * r.step_s);
  if (breakdown_) {
    v.emplace_back("Train/Samples/elapsed_time_ms_forward", 1e3 * r.fwd_s);
    v.emplace_back("Train/Samples/elapsed_time_ms_backward", 1e3 * r.bwd_s);
  }
  r.busy.each([&](const std::string& name, double s) {
    std::string tag = "Train/Samples/busy_ms_" + name;
    for (char& ch : tag)
      if (ch == ' ') ch = '_';
    v.emplace_back(std::move(tag), 1e3 * s);
  });
  return v;
}

void Monitor::step(const StepReport& r) {
  if (enabled()) write(samples(r.step), scalars(r));
}

void Monitor::validation(std::int64_t step, double val_loss) {
  if (enabled()) write(samples(step), {{"Train/Samples/val_loss", val_loss}});
}

void Monitor::write(std::int64_t step, const std::vector<std::pair<std::string, double>>& values) {
  if (tb_) {
    std::vector<std::pair<std::string, float>> f;
    f.reserve(values.size());
    for (const auto& [tag, v] : values) f.emplace_back(tag, static_cast<float>(v));  // simple_value is a float
    tb_->write_scalars(step, f, wall_clock());
  }
  if (csv_) csv_->write(step, values);
}

}  // namespace zinf
