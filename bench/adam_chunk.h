// adam_chunk.h — the Update's chunk over arrays laid out as the Adam benches hold them (`zinf bench
// adam`, adam_bench.cpp, and the micro benches, micro/cpu_adam_bench.cpp): fp16 gradients and
// parameters, the fp32 master, m and v stored in one format with their 8-bit block scales.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zinf/cpu_adam/adam.h"

namespace zinf::bench {

// Elements [b, e) of the arrays; b is a multiple of 1024 (HostThreads' chunks), so a q8 range starts
// on a block.
inline cpu_adam::UpdateChunk adam_chunk(std::size_t b, std::size_t e, cpu_adam::StateFormat f,
                                        const std::uint16_t* grad, float* master, std::uint8_t* m, std::uint8_t* v,
                                        float* m_scale, float* v_scale, std::uint16_t* param16) {
  cpu_adam::UpdateChunk c;
  c.n = e - b;
  c.grad = grad + b;
  c.grad_type = cpu_adam::GradType::fp16;
  c.master = master + b;
  c.m = m + b * cpu_adam::state_elem_bytes(f);
  c.v = v + b * cpu_adam::state_elem_bytes(f);
  c.m_scale = m_scale + b / cpu_adam::kQ8Block;
  c.v_scale = v_scale + b / cpu_adam::kQ8Block;
  c.states = f;
  c.param16 = param16 + b;
  c.param16_type = cpu_adam::HalfType::fp16;
  return c;
}

}  // namespace zinf::bench
