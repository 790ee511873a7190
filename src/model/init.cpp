// init.cpp — see init.h.
#include "model/init.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "model/fixed_math.h"
#include "model/gpt.h"

namespace zinf {

void normal_fill(std::mt19937_64& rng, float* dst, std::size_t n, double stdv) {
  for (std::size_t i = 0; i < n; i += 2) {  // Box–Muller, so the numbers do not depend on the libstdc++ version
    const double u1 = (static_cast<double>(rng() >> 11) + 0.5) * 0x1.0p-53;
    const double u2 = (static_cast<double>(rng() >> 11) + 0.5) * 0x1.0p-53;
    // fixed::, not libm, whose per-CPU variants differ in the last bit: one init on every x86-64 CPU
    const double r = std::sqrt(-2.0 * fixed::log(u1)) * stdv;
    double s, c;
    fixed::sincos(2 * M_PI * u2, s, c);
    dst[i] = static_cast<float>(r * c);
    if (i + 1 < n) dst[i + 1] = static_cast<float>(r * s);
  }
}

void gpt2_init_unit(float* p, std::size_t unit, const ModelShape& s, std::uint64_t seed) {
  std::mt19937_64 rng(seed * 1000003ull + unit * 7919ull + 17);
  auto normal = [&](float* dst, std::size_t n, double stdv) { normal_fill(rng, dst, n, stdv); };
  const std::size_t C = static_cast<std::size_t>(s.d_model), V = static_cast<std::size_t>(s.vocab_size),
                    T = static_cast<std::size_t>(s.seq_len);
  const std::size_t L = static_cast<std::size_t>(s.n_layer);
  if (unit == 0) {
    normal(p, V * C, 0.02);
    normal(p + V * C, T * C, 0.01);
  } else if (unit == L + 1) {
    for (std::size_t i = 0; i < C; ++i) p[i] = 1.0f, p[C + i] = 0.0f;
  } else {
    BlockView b = block_view(p, s.d_model);
    const double proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(L));
    for (std::size_t i = 0; i < C; ++i) b.ln1w[i] = b.ln2w[i] = 1.0f, b.ln1b[i] = b.ln2b[i] = 0.0f;
    normal(b.qkvw, C * 3 * C, 0.02);
    std::fill(b.qkvb, b.qkvb + 3 * C, 0.0f);
    normal(b.projw, C * C, proj_std);
    std::fill(b.projb, b.projb + C, 0.0f);
    normal(b.fcw, C * 4 * C, 0.02);
    std::fill(b.fcb, b.fcb + 4 * C, 0.0f);
    normal(b.fcprojw, 4 * C * C, proj_std);
    std::fill(b.fcprojb, b.fcprojb + C, 0.0f);
  }
}

}  // namespace zinf
