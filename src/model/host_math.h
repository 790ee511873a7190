// host_math.h — the model's own arithmetic on the host, whatever the device: the mean of the row
// losses and the rotary-position tables of the Llama family (computed once, then copied to the
// device). Built from fixed_math.h, so the bits are the same on every x86-64 CPU.
#pragma once

#include <vector>

namespace zinf::ops {

// The mean of R row losses, summed in row order in double (host memory).
double mean_loss(const float* losses, int R);

// Llama 3's rope_scaling ("rope_type": "llama3"); factor 1 (the default) leaves the frequencies alone.
struct RopeScaling {
  double factor = 1, low_freq_factor = 1, high_freq_factor = 4;
  double original_max_position_embeddings = 8192;
};
// The D/2 inverse frequencies theta^(-2i/D), rescaled as Llama 3 does when scaling.factor != 1.
std::vector<double> rope_inv_freq(int D, double theta, const RopeScaling& scaling = {});
// cos and sin of position t × inv_freq[i], as [T, D/2] tables (computed in double, stored as float).
void rope_tables(const std::vector<double>& inv_freq, int T, std::vector<float>& cos_t, std::vector<float>& sin_t);

}  // namespace zinf::ops
