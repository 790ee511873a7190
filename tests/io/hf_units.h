// hf_units.h — what the Hugging Face folder tests share: random parameters for every layer unit of a
// shape, rounded to values a storage dtype holds exactly (so a write-read round trip is exact), and a
// whole file as a string.
#pragma once

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/random_floats.h"
#include "io/safetensors.h"
#include "model/shape.h"
#include "zinf/cpu_adam/convert.h"

namespace zinf::test {

inline std::vector<std::vector<float>> random_units(const ModelShape& s, StDtype dt, std::uint32_t seed, float scale) {
  std::vector<std::vector<float>> u;
  for (const auto& lu : layer_units(s)) {
    auto v = randf(static_cast<std::size_t>(lu.params), seed++, scale);
    if (dt != StDtype::f32) {
      std::vector<std::uint16_t> h(v.size());
      if (dt == StDtype::bf16)
        cpu_adam::fp32_to_bf16(v.data(), h.data(), v.size()), cpu_adam::bf16_to_fp32(h.data(), v.data(), v.size());
      else
        cpu_adam::fp32_to_fp16(v.data(), h.data(), v.size()), cpu_adam::fp16_to_fp32(h.data(), v.data(), v.size());
    }
    u.push_back(std::move(v));
  }
  return u;
}

inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace zinf::test
