// init.h — GPT-2's initialisation of one layer unit, deterministic per unit and seed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>

#include "model/shape.h"

namespace zinf {

// n normal samples N(0, stdv²) from `rng` (Box–Muller on 53-bit uniforms: the same numbers with every
// standard library).
void normal_fill(std::mt19937_64& rng, float* dst, std::size_t n, double stdv);

// Fills unit `unit`'s flat fp32 parameters (layout of gpt.h): N(0, 0.02) weights, N(0, 0.02/√(2L))
// for the two residual projections, N(0, 0.01) positions, zero biases, LayerNorm weights 1.
void gpt2_init_unit(float* p, std::size_t unit, const ModelShape& s, std::uint64_t seed);

}  // namespace zinf
