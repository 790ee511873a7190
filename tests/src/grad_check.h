// grad_check.h — shared by the op tests: double-precision references of the ops both model families
// use (matmul, the LM head's loss), central finite differences, and element-wise comparisons that
// print the first mismatches.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

namespace zinf::test {

using VD = std::vector<double>;
using VF = std::vector<float>;

inline VD to_d(const VF& v) { return VD(v.begin(), v.end()); }

inline VD ref_matmul(const VD& x, const VD& w, const VD& b, int R, int IC, int OC) {
  VD o(static_cast<std::size_t>(R) * OC);
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < OC; ++j) {
      double s = b.empty() ? 0 : b[static_cast<std::size_t>(j)];
      for (int k = 0; k < IC; ++k) s += x[static_cast<std::size_t>(r) * IC + k] * w[static_cast<std::size_t>(k) * OC + j];
      o[static_cast<std::size_t>(r) * OC + j] = s;
    }
  return o;
}
inline double ref_lm_loss(const VD& x, const VD& wte, const std::vector<int>& tg, int R, int C, int V) {
  double total = 0;
  for (int r = 0; r < R; ++r) {
    VD l(static_cast<std::size_t>(V));
    double mx = -1e300;
    for (int v = 0; v < V; ++v) {
      double s = 0;
      for (int i = 0; i < C; ++i) s += x[static_cast<std::size_t>(r) * C + i] * wte[static_cast<std::size_t>(v) * C + i];
      l[static_cast<std::size_t>(v)] = s;
      mx = std::max(mx, s);
    }
    double sum = 0;
    for (double s : l) sum += std::exp(s - mx);
    total += -(l[static_cast<std::size_t>(tg[static_cast<std::size_t>(r)])] - mx - std::log(sum));
  }
  return total / R;
}

// Central difference of J with respect to x[i] (x is modified and restored).
inline double numgrad(VD& x, std::size_t i, const std::function<double()>& J, double h = 1e-6) {
  const double keep = x[i];
  x[i] = keep + h;
  const double jp = J();
  x[i] = keep - h;
  const double jm = J();
  x[i] = keep;
  return (jp - jm) / (2 * h);
}

inline double dot(const VD& a, const VF& g) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * g[i];
  return s;
}

inline int check_grad(const char* what, const VF& analytic, VD& x, const std::function<double()>& J) {
  int bad = 0;
  double max_err = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double n = numgrad(x, i, J);
    const double err = std::fabs(analytic[i] - n);
    max_err = std::max(max_err, err / (1e-4 + std::fabs(n)));
    if (err > 2e-3 * std::fabs(n) + 1e-4) {
      if (bad < 5) ADD_FAILURE() << what << "[" << i << "]: analytic " << analytic[i] << " numeric " << n;
      ++bad;
    }
  }
  if (bad) ADD_FAILURE() << what << ": " << bad << " of " << x.size() << " mismatches, max rel err " << max_err;
  return bad;
}

inline void expect_close(const char* what, const VF& got, const VD& want, double rel = 1e-4) {
  int bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (std::fabs(got[i] - want[i]) > rel * std::fabs(want[i]) + 1e-5 && bad++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: " << got[i] << " vs " << want[i];
  EXPECT_EQ(bad, 0) << what;
}

}  // namespace zinf::test
