// host_math.cpp — see host_math.h.
#include "model/host_math.h"

#include <algorithm>
#include <cmath>

#include "model/fixed_math.h"
#include "model/shape.h"
#include "zinf/error.h"

namespace zinf::ops {

double mean_loss(const float* losses, int R) {
  double total = 0;
  for (int r = 0; r < R; ++r) total += losses[r];
  return total / R;
}

namespace {
// YaRN's attention scale for a stretch of `scale` (its paper's eq. 21).
double yarn_mscale(double scale, double mscale = 1) {
  return scale <= 1 ? 1.0 : 0.1 * mscale * fixed::log(scale) + 1.0;
}
}  // namespace

double rope_attention_factor(const RopeScaling& sc) {
  if (sc.type != "yarn" && sc.type != "longrope") return 1;
  if (sc.attention_factor > 0) return sc.attention_factor;
  if (sc.type == "yarn")
    return sc.mscale != 0 && sc.mscale_all_dim != 0 ? yarn_mscale(sc.factor, sc.mscale) / yarn_mscale(sc.factor, sc.mscale_all_dim)
                                                    : yarn_mscale(sc.factor);
  return sc.factor <= 1 ? 1.0
                        : std::sqrt(1 + fixed::log(sc.factor) / fixed::log(sc.original_max_position_embeddings));
}

std::vector<double> rope_inv_freq(int D, double theta, const RopeScaling& sc, int T) {
  ZINF_CHECK(D > 0 && D % 2 == 0);
  std::vector<double> f(static_cast<std::size_t>(D / 2));
  for (int i = 0; i < D / 2; ++i) f[static_cast<std::size_t>(i)] = fixed::pow_positive(theta, -2.0 * i / D);
  if (sc.type == "default") return f;
  if (sc.type == "linear") {
    for (double& x : f) x /= sc.factor;
    return f;
  }
  if (sc.type == "dynamic") {
    // NTK-aware scaling only changes theta for sequences past max_position_embeddings.
    if (sc.max_position_embeddings > 0 && T > sc.max_position_embeddings)
      throw ConfigError("rope_type dynamic: " + std::to_string(T) + " positions are more than max_position_embeddings " +
                        std::to_string(static_cast<long long>(sc.max_position_embeddings)) +
                        "; zinf computes dynamic scaling only up to there (where it equals the default)");
    return f;
  }
  if (sc.type == "longrope") {
    const auto& ext = T > sc.original_max_position_embeddings ? sc.long_factor : sc.short_factor;
    ZINF_CHECK(ext.size() == f.size());
    for (std::size_t i = 0; i < f.size(); ++i) f[i] /= ext[i];
    return f;
  }
  if (sc.type == "yarn") {
    // Dimensions that turn fewer than beta_slow times over the original context are interpolated
    // (divided by factor), those that turn more than beta_fast times are kept, and a linear ramp
    // over the dimension index blends the ones between.
    const double lb = fixed::log(theta);
    auto correction_dim = [&](double rotations) {
      return D * fixed::log(sc.original_max_position_embeddings / (rotations * 2 * M_PI)) / (2 * lb);
    };
    double low = correction_dim(sc.beta_fast), high = correction_dim(sc.beta_slow);
    if (sc.truncate) low = std::floor(low), high = std::ceil(high);
    low = std::max(low, 0.0), high = std::min(high, static_cast<double>(D - 1));
    if (low == high) high += 0.001;
    for (std::size_t i = 0; i < f.size(); ++i) {
      const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
      f[i] = f[i] / sc.factor * ramp + f[i] * (1 - ramp);
    }
    return f;
  }
  ZINF_CHECK(sc.type == "llama3");
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

void rope_tables(const std::vector<double>& inv_freq, int T, std::vector<float>& cos_t, std::vector<float>& sin_t,
                 double scale) {
  const std::size_t half = inv_freq.size();
  cos_t.resize(static_cast<std::size_t>(T) * half);
  sin_t.resize(cos_t.size());
  for (int t = 0; t < T; ++t)
    for (std::size_t i = 0; i < half; ++i) {
      const double a = t * inv_freq[i];
      double s, c;
      fixed::sincos(a, s, c);
      cos_t[static_cast<std::size_t>(t) * half + i] = static_cast<float>(c * scale);
      sin_t[static_cast<std::size_t>(t) * half + i] = static_cast<float>(s * scale);
    }
}

}  // namespace zinf::ops

namespace zinf {

ops::RopeScaling llama_rope_scaling(const ModelShape& s) {
  ops::RopeScaling sc;
  // A shape built with rope_factor != 1 and no type (the run config's model.rope_scaling, older
  // manifests) means Llama 3's scaling, the only one zinf had before the others.
  sc.type = s.rope.type == "default" && s.rope_factor != 1 ? "llama3" : s.rope.type;
  sc.factor = s.rope_factor, sc.low_freq_factor = s.rope_low_freq_factor, sc.high_freq_factor = s.rope_high_freq_factor;
  sc.original_max_position_embeddings = s.rope_original_max;
  sc.max_position_embeddings = s.max_positions > 0 ? s.max_positions : s.seq_len;
  sc.attention_factor = s.rope.attention_factor;
  sc.beta_fast = s.rope.beta_fast, sc.beta_slow = s.rope.beta_slow;
  sc.mscale = s.rope.mscale, sc.mscale_all_dim = s.rope.mscale_all_dim, sc.truncate = s.rope.truncate;
  sc.short_factor = s.rope.short_factor, sc.long_factor = s.rope.long_factor;
  return sc;
}

}  // namespace zinf
