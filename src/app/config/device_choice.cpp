// device_choice.cpp — device.type resolved (device_choice.h).
#include "app/config/device_choice.h"

#include "zinf/backends/gpu.h"
#include "zinf/error.h"

namespace zinf {
namespace {

// Whether auto takes the GPU when one is visible. false while the CUDA path has not been confirmed on
// a GPU: device.type cuda alone selects it. Setting this to true is the whole change that makes auto
// mean "the GPU when one is visible" for train, eval, bench step, plan and generate alike.
constexpr bool kAutoTakesVisibleGpu = false;

std::string visible(const std::vector<GpuInfo>& gpus) {
  if (gpus.empty()) return "no GPU visible";
  return std::to_string(gpus.size()) + (gpus.size() == 1 ? " GPU visible" : " GPUs visible");
}

}  // namespace

DeviceChoice resolve_device_type(DeviceType requested, const std::vector<GpuInfo>& gpus) {
  switch (requested) {
    case DeviceType::cpu: return {DeviceType::cpu, "as configured"};
    case DeviceType::cuda: return {DeviceType::cuda, "as configured"};
    case DeviceType::automatic: break;
  }
  if (kAutoTakesVisibleGpu && !gpus.empty()) return {DeviceType::cuda, "auto: " + visible(gpus)};
  if (gpus.empty()) return {DeviceType::cpu, "auto: " + visible(gpus)};
  return {DeviceType::cpu,
          "auto: " + visible(gpus) + "; the CUDA path is chosen only by device.type cuda until confirmed on a GPU"};
}

DeviceChoice resolve_device_type(DeviceType requested) {
  if (requested != DeviceType::automatic) return resolve_device_type(requested, {});
  return resolve_device_type(requested, cuda::query_gpus(kNoOwnGpu).gpus);
}

void resolve_device(Config& c, const std::vector<GpuInfo>& gpus) {
  if (c.device.type != DeviceType::automatic && !c.device.type_reason.empty()) return;  // resolved already
  const bool was_auto = c.device.type == DeviceType::automatic;
  const DeviceChoice d = resolve_device_type(c.device.type, gpus);
  c.device.type = d.type;
  c.device.type_reason = d.reason;
  if (!was_auto) return;  // an explicit type's settings were checked as the config was read
  const std::string as = c.source + ": device.type auto is the " + (d.type == DeviceType::cuda ? "CUDA" : "CPU") +
                         " device here (" + d.reason + ")";
  if (d.type == DeviceType::cpu && c.device.comm == "nccl")
    throw ConfigError(as + ", and device.comm nccl moves CUDA device memory",
                      "set device.type cuda, or device.comm mpi (or auto)");
  if (d.type == DeviceType::cpu && (c.device.attention == Attention::cudnn || c.device.attention == Attention::wmma))
    throw ConfigError(as + ", and device.attention " + std::string(to_string(c.device.attention)) +
                          " runs on the CUDA device only",
                      "set device.type cuda, or device.attention auto");
  if (d.type == DeviceType::cuda && (c.device.async || c.device.jitter_seed))
    throw ConfigError(
        as + ", and device." + (c.device.async ? "async" : "jitter_seed") + " applies to the CPU device only",
        "set device.type cpu, or remove the setting");
}

void resolve_device(Config& c) {
  if (c.device.type != DeviceType::automatic) return resolve_device(c, {});
  resolve_device(c, cuda::query_gpus(kNoOwnGpu).gpus);
}

DeviceType run_device_type(const Config& c) {
  if (c.device.type != DeviceType::automatic) return c.device.type;
  return resolve_device_type(c.device.type).type;
}

std::string describe_device(const Config& c) {
  DeviceChoice d{c.device.type, c.device.type_reason};
  if (c.device.type == DeviceType::automatic)
    d = resolve_device_type(c.device.type);
  else if (d.reason.empty())
    d = resolve_device_type(c.device.type, {});
  return std::string(to_string(d.type)) + " (" + d.reason + ")";
}

}  // namespace zinf
