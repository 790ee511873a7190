// report.cpp — see report.h.
#include "app/train/report.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

#include "app/config/device_choice.h"
#include "app/train/train.h"
#include "io/files.h"
#include "zinf/error.h"

namespace zinf {

MetricsFile::MetricsFile(const std::string& path) : path_(path) {
  if (path.empty()) return;
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd_ < 0) {
    const int e = errno;
    throw ConfigError("train.metrics_file " + path + ": cannot open for writing (" + std::strerror(e) + ")");
  }
}

MetricsFile::~MetricsFile() {
  if (fd_ >= 0) ::close(fd_);
}

// Each line goes out in one write, unbuffered: a full disk or a broken file stops the run at the
// first line that did not reach the file, not with a silently short file at the end.
void MetricsFile::write_line(const std::string& line) {
  if (const int e = write_all(fd_, line.data(), line.size()))
    throw IoError("train.metrics_file " + path_ + ": write failed (" + std::strerror(e) + ")", e);
}

void MetricsFile::step(const StepReport& r) {
  if (fd_ < 0) return;
  nlohmann::json j = {{"step", r.step},
                      {"loss", r.loss},
                      {"lr", r.lr},
                      {"loss_scale", r.loss_scale},
                      {"grad_norm", std::isfinite(r.grad_norm) ? r.grad_norm : -1.0},
                      {"skipped", r.skipped},
                      {"tokens_per_s", r.tokens_per_s},
                      {"step_s", r.step_s}};
  if (r.speculative) j["rollbacks"] = r.rollbacks;
  r.busy.each([&](const std::string& name, double s) { j["busy_s"][name] = s; });
  j["busiest"] = r.busy.busiest_name();
  if (!r.busy.disks.empty())
    j["nvme_bytes"] = {{"read", r.busy.nvme_read_bytes()}, {"written", r.busy.nvme_write_bytes()}};
  write_line(j.dump() + "\n");
}

void MetricsFile::validation(std::int64_t step, double val_loss) {
  if (fd_ >= 0) write_line(nlohmann::json{{"step", step}, {"val_loss", val_loss}}.dump() + "\n");
}

std::string progress_line(const Config& c, const StepReport& r, double fwd_ms, double bwd_ms) {
  char line[512];
  std::snprintf(line, sizeof line,
                "step %5" PRId64 "/%" PRId64 " | loss %.4f | lr %.3e | scale %g | norm %.3f | %.0f tok/s", r.step,
                r.steps, r.loss, r.lr, r.loss_scale, r.grad_norm, r.tokens_per_s);
  std::string s = line;
  if (c.wall_clock_breakdown) {
    std::snprintf(line, sizeof line, " | fwd %.1f ms bwd %.1f ms", fwd_ms, bwd_ms);
    s += line;
  }
  if (c.zero.offload_optimizer.device != OffloadDevice::none || c.zero.offload_param.device != OffloadDevice::none)
    s += busy_summary(r.busy, r.step_s);
  if (c.zero.offload_optimizer.speculative) s += " | rollbacks " + std::to_string(r.rollbacks);
  return s;
}

std::string busy_summary(const BusyTimes& b, double step_s) {
  char part[256];
  std::snprintf(part, sizeof part, " | busy ms: compute %.0f h2d %.0f d2h %.0f host %.0f", 1e3 * b.compute,
                1e3 * b.h2d, 1e3 * b.d2h, 1e3 * b.host);
  std::string s = part;
  for (const auto& d : b.disks) {  // a disk once, with its reads and writes (which may overlap) beside it
    std::snprintf(part, sizeof part, " disk %s %.0f (r %.0f w %.0f)", d.name.c_str(), 1e3 * d.busy, 1e3 * d.read,
                  1e3 * d.write);
    s += part;
  }
  if (!b.disks.empty()) {
    std::snprintf(part, sizeof part, " | nvme MB r %.0f w %.0f", b.nvme_read_bytes() / 1e6, b.nvme_write_bytes() / 1e6);
    s += part;
  }
  std::snprintf(part, sizeof part, " | pace: %s, overlap %.2f", b.busiest_name().c_str(),
                b.busiest() > 0 ? step_s / b.busiest() : 0.0);
  return s + part;
}

std::string op_timing(const Config& c) {
  if (run_device_type(c) == DeviceType::cuda) return "CUDA events on the compute stream";
  return c.device.async ? "the CPU device's compute stream" : "host clock: the CPU device runs ops inline";
}

std::string op_table(const std::vector<OpTime>& ops, double steps, double step_s, const BusyTimes& busy,
                     const std::string& timing) {
  const double n = steps > 0 ? steps : 1;
  std::vector<OpTime> sorted = ops;
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const OpTime& a, const OpTime& b) { return a.seconds > b.seconds; });
  double total = 0;
  for (const auto& o : sorted) total += o.seconds;
  auto share = [&](double per_step) { return step_s > 0 ? 100 * per_step / step_s : 0.0; };
  char line[512];
  std::snprintf(line, sizeof line, "  the model's ops by kind, per step (%s; %.1f ms in ops, %.0f%% of the step)\n",
                timing.c_str(), 1e3 * total / n, share(total / n));
  std::string s = line;
  std::snprintf(line, sizeof line, "  %-16s %10s %8s %8s %9s\n", "op", "ms", "share", "calls", "TFLOPS");
  s += line;
  for (const auto& o : sorted) {
    const std::string tflops =
        o.flops > 0 && o.seconds > 0 ? std::to_string(o.flops / o.seconds / 1e12).substr(0, 6) : "-";
    std::snprintf(line, sizeof line, "  %-16s %10.2f %7.1f%% %8.0f %9s\n", o.name.c_str(), 1e3 * o.seconds / n,
                  share(o.seconds / n), static_cast<double>(o.calls) / n, tflops.c_str());
    s += line;
  }
  // The engine's side of the step, on its own streams and workers (overlapped with the above).
  s += "  engine, beside the ops (busy per step):";
  busy.each([&](const std::string& name, double sec) {
    if (name == "compute") return;
    std::snprintf(line, sizeof line, " %s %.2f ms (%.1f%%)", name.c_str(), 1e3 * sec, share(sec));
    s += line;
  });
  return s + "\n";
}

std::string params_digest(offload::Engine& engine, const ModelShape& shape) {
  std::uint64_t h = fnv1a64(nullptr, 0);
  std::vector<float> buf;
  const auto units = layer_units(shape);
  for (std::size_t u = 0; u < units.size(); ++u) {
    buf.resize(static_cast<std::size_t>(units[u].params));
    engine.read_master(u, buf.data());
    h = fnv1a64(buf.data(), buf.size() * 4, h);
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016" PRIx64, h);
  return hex;
}

}  // namespace zinf
