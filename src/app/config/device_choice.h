// device_choice.h — what a run config's device.type means on this machine, decided in one place:
// `zinf train`, `eval`, `bench step`, `plan` and `generate` all take their device from
// resolve_device_type, so a plan checks the budget of the device the run will use.
#pragma once

#include <string>
#include <vector>

#include "app/config/config.h"
#include "zinf/backends/sysinfo.h"
#include "zinf/types.h"

namespace zinf {

struct DeviceChoice {
  DeviceType type = DeviceType::cpu;  // cpu or cuda, never auto
  std::string reason;                 // why, in a few words ("auto: no GPU visible")
};

// The device `requested` names on a machine whose CUDA runtime sees `gpus` (their static facts: no
// CUDA context is needed). cpu and cuda are taken as given. auto is the CPU device: the CUDA path has
// not been confirmed on a GPU at this version, so only device.type cuda selects it. Making auto the
// GPU when one is visible is one line (kAutoTakesVisibleGpu in device_choice.cpp); every command follows.
DeviceChoice resolve_device_type(DeviceType requested, const std::vector<GpuInfo>& gpus);
// The same on this machine: the CUDA runtime is asked which GPUs it sees (without opening a context)
// only for auto.
DeviceChoice resolve_device_type(DeviceType requested);

// Resolves c.device.type in place — auto becomes cpu or cuda, and c.device.type_reason says why — and
// checks the device settings that depend on it (device.comm nccl needs the CUDA device). A config whose
// type is cpu or cuda keeps it. Without `gpus`, the CUDA runtime is asked only for auto. Throws
// ConfigError for a setting the resolved device cannot take.
void resolve_device(Config& c, const std::vector<GpuInfo>& gpus);
void resolve_device(Config& c);

// The device a config runs on: device.type once resolved; for a config still at auto, resolved now on
// this machine (so a caller that did not resolve it gets the same answer as one that did).
DeviceType run_device_type(const Config& c);

// "cpu (auto: no GPU visible)": the resolved device and why, as `zinf train` and `zinf plan` print it.
std::string describe_device(const Config& c);

}  // namespace zinf
