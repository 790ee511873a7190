// subgroup_layout.h — the layout of one optimizer sub-group outside the device (internal to
// zinf_offload).
#pragma once

#include <cstddef>

namespace zinf::offload::detail {

// One sub-group's optimizer states as stored outside the device: master | m | v, each padded to 1024
// elements (4 KiB of fp32), so each part starts aligned for O_DIRECT and SIMD. The one place that
// knows this layout (the engine's tiers and zinf plan's arithmetic in placement.cpp).
struct SubGroupLayout {
  static constexpr std::size_t kPad = 1024;
  std::size_t len, padded;
  explicit SubGroupLayout(std::size_t n) : len(n), padded((n + kPad - 1) / kPad * kPad) {}
  static std::size_t bytes_for(std::size_t n) { return 12 * ((n + kPad - 1) / kPad * kPad); }
  std::size_t bytes() const { return 12 * padded; }
  float* master(void* b) const { return static_cast<float*>(b); }
  float* m(void* b) const { return static_cast<float*>(b) + padded; }
  float* v(void* b) const { return static_cast<float*>(b) + 2 * padded; }
};

}  // namespace zinf::offload::detail
