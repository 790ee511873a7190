// host_math.h — the model's own arithmetic on the host, whatever the device: the mean of the row
// losses and the rotary-position tables of the Llama family (computed once, then copied to the
// device). Built from fixed_math.h, so the bits are the same on every x86-64 CPU.
#pragma once

#include <string>
#include <vector>

namespace zinf {
struct ModelShape;
}

namespace zinf::ops {

// The mean of R row losses, summed in row order in double (host memory).
double mean_loss(const float* losses, int R);

// The rotary scaling of the Llama family, as transformers computes it (config.json's
// rope_parameters, or rope_scaling before transformers 5). `type`:
//   "default"   theta^(-2i/D)
//   "linear"    default / factor (position interpolation)
//   "dynamic"   NTK-aware: default for tables of at most max_position_embeddings positions; a longer
//               table is refused (transformers rescales theta per forward there)
//   "yarn"      a per-dimension blend of default and default / factor (beta_fast, beta_slow,
//               truncate), cos and sin scaled by attention_factor
//   "longrope"  default / short_factor[i], or / long_factor[i] for tables longer than
//               original_max_position_embeddings; cos and sin scaled by attention_factor
//   "llama3"    Llama 3's banded slow-down; factor 1 (the default) leaves the frequencies alone
struct RopeScaling {
  std::string type = "llama3";
  double factor = 1, low_freq_factor = 1, high_freq_factor = 4;
  double original_max_position_embeddings = 8192;
  double max_position_embeddings = 0;  // dynamic: the longest table it leaves alone (0: no limit)
  double attention_factor = 0;         // yarn, longrope: 0 = derived from factor as transformers does
  double beta_fast = 32, beta_slow = 1, mscale = 0, mscale_all_dim = 0;
  bool truncate = true;
  std::vector<double> short_factor, long_factor;
};
// The D/2 inverse frequencies for a table of T positions (T matters to longrope and dynamic only;
// 0: short_factor). Throws ConfigError where the type cannot give a table of T positions.
std::vector<double> rope_inv_freq(int D, double theta, const RopeScaling& scaling = {}, int T = 0);
// The factor cos and sin are multiplied by: 1, or yarn's and longrope's attention factor.
double rope_attention_factor(const RopeScaling& scaling);
// cos and sin of position t × inv_freq[i], times `scale`, as [T, D/2] tables (computed in double,
// stored as float).
void rope_tables(const std::vector<double>& inv_freq, int T, std::vector<float>& cos_t, std::vector<float>& sin_t,
                 double scale = 1);

}  // namespace zinf::ops

namespace zinf {
// The shape's rotary scaling as the host arithmetic above takes it.
ops::RopeScaling llama_rope_scaling(const ModelShape& s);
}  // namespace zinf
