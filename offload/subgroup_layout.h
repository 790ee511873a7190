// subgroup_layout.h — how optimizer states are laid out in memory and on NVMe (internal to
// zinf_offload). The one place that knows these layouts: the engine's tiers allocate and address
// by them, and the buffer specs (so `zinf plan`) size by them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zinf/cpu_adam/adam.h"

namespace zinf::offload::detail {

// One sub-group's optimizer states as stored on NVMe (and in the swapper's pinned buffers):
//   master | m | v | m_scale | v_scale
// master is fp32; m and v are in the run's state format (cpu_adam::StateFormat: 4, 2 or 1 byte per
// element); the scales (q8 only: one fp32 per kQ8Block elements, counted from the sub-group's start)
// are empty otherwise. Each part is padded to 4 KiB, so each starts aligned for O_DIRECT and SIMD.
// In fp32 that is master | m | v, each of n elements rounded up to 1024.
struct SubGroupLayout {
  static constexpr std::size_t kPadBytes = 4096;
  static std::size_t pad(std::size_t bytes) { return (bytes + kPadBytes - 1) / kPadBytes * kPadBytes; }

  std::size_t len;
  cpu_adam::StateFormat format;
  std::size_t master_bytes, state_bytes, scale_bytes;  // each part, padded (m and v alike)

  SubGroupLayout(std::size_t n, cpu_adam::StateFormat f)
      : len(n),
        format(f),
        master_bytes(pad(4 * n)),
        state_bytes(pad(cpu_adam::state_elem_bytes(f) * n)),
        scale_bytes(pad(4 * cpu_adam::state_scales(f, n))) {}
  static std::size_t bytes_for(std::size_t n, cpu_adam::StateFormat f) { return SubGroupLayout(n, f).bytes(); }
  std::size_t bytes() const { return master_bytes + 2 * state_bytes + 2 * scale_bytes; }
  // The bytes of each row of the plan: master, m (with its scales), v (with its scales).
  std::size_t m_part() const { return state_bytes + scale_bytes; }

  float* master(void* b) const { return static_cast<float*>(b); }
  void* m(void* b) const { return at(b, master_bytes); }
  void* v(void* b) const { return at(b, master_bytes + state_bytes); }
  float* m_scale(void* b) const { return scale_bytes ? static_cast<float*>(at(b, master_bytes + 2 * state_bytes)) : nullptr; }
  float* v_scale(void* b) const {
    return scale_bytes ? static_cast<float*>(at(b, master_bytes + 2 * state_bytes + scale_bytes)) : nullptr;
  }

 private:
  static void* at(void* b, std::size_t off) { return static_cast<char*>(b) + off; }
};

// One of m, v of a range of n elements held in place (device or host memory): the n elements of the
// format, then (q8) its scales, one per kQ8Block elements counted from the range's start, at a
// 64-byte boundary. In fp32 and bf16 exactly the elements.
struct StateArray {
  static std::size_t scales_at(std::size_t n, cpu_adam::StateFormat f) {
    return cpu_adam::state_scales(f, n) ? (cpu_adam::state_elem_bytes(f) * n + 63) / 64 * 64
                                        : cpu_adam::state_elem_bytes(f) * n;
  }
  static std::size_t bytes(std::size_t n, cpu_adam::StateFormat f) {
    return scales_at(n, f) + 4 * cpu_adam::state_scales(f, n);
  }
};

}  // namespace zinf::offload::detail
