// host_math.cpp — see host_math.h.
#include "model/host_math.h"

#include <cmath>

#include "model/fixed_math.h"
#include "zinf/error.h"

namespace zinf::ops {

double mean_loss(const float* losses, int R) {
  double total = 0;
  for (int r = 0; r < R; ++r) total += losses[r];
  return total / R;
}

std::vector<double> rope_inv_freq(int D, double theta, const RopeScaling& sc) {
  ZINF_CHECK(D > 0 && D % 2 == 0);
  std::vector<double> f(static_cast<std::size_t>(D / 2));
  for (int i = 0; i < D / 2; ++i) f[static_cast<std::size_t>(i)] = fixed::pow_positive(theta, -2.0 * i / D);
  if (sc.factor == 1) return f;
  // Llama 3: wavelengths shorter than old_len / high_freq_factor keep their frequency, those longer
  // than old_len / low_freq_factor are slowed by `factor`, and the band between is interpolated.
  const double low_wavelen = sc.original_max_position_embeddings / sc.low_freq_factor;
  const double high_wavelen = sc.original_max_position_embeddings / sc.high_freq_factor;
  for (double& x : f) {
    const double wavelen = 2 * M_PI / x;
    if (wavelen < high_wavelen) continue;
    if (wavelen > low_wavelen) {
      x /= sc.factor;
      continue;
    }
    const double smooth = (sc.original_max_position_embeddings / wavelen - sc.low_freq_factor) /
                          (sc.high_freq_factor - sc.low_freq_factor);
    x = (1 - smooth) * x / sc.factor + smooth * x;
  }
  return f;
}

void rope_tables(const std::vector<double>& inv_freq, int T, std::vector<float>& cos_t, std::vector<float>& sin_t) {
  const std::size_t half = inv_freq.size();
  cos_t.resize(static_cast<std::size_t>(T) * half);
  sin_t.resize(cos_t.size());
  for (int t = 0; t < T; ++t)
    for (std::size_t i = 0; i < half; ++i) {
      const double a = t * inv_freq[i];
      double s, c;
      fixed::sincos(a, s, c);
      cos_t[static_cast<std::size_t>(t) * half + i] = static_cast<float>(c);
      sin_t[static_cast<std::size_t>(t) * half + i] = static_cast<float>(s);
    }
}

}  // namespace zinf::ops
