// random_floats.h — seeded normal-distributed test data for the model-op tests (CPU and CUDA).
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace zinf {

inline std::vector<float> randf(std::size_t n, std::uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

}  // namespace zinf
