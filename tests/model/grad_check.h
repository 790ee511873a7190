// grad_check.h — shared by the op tests: double-precision references of the ops both model families
// use (matmul, the LM head's loss), central finite differences, and element-wise comparisons that
// print the first mismatches.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "model/host_math.h"
#include "model/lm.h"
#include "common/random_floats.h"

namespace zinf::test {

using VD = std::vector<double>;
using VF = std::vector<float>;

inline VD to_d(const VF& v) { return VD(v.begin(), v.end()); }

// A layer unit's parameters read in their order: each take(n) is the next n of them.
class UnitReader {
 public:
  explicit UnitReader(const VD& unit) : unit_(unit) {}
  VD take(std::size_t n) {
    VD v(unit_.begin() + static_cast<std::ptrdiff_t>(offset_),
         unit_.begin() + static_cast<std::ptrdiff_t>(offset_ + n));
    offset_ += n;
    return v;
  }

 private:
  const VD& unit_;
  std::size_t offset_ = 0;
};

inline VD ref_matmul(const VD& x, const VD& w, const VD& b, int R, int IC, int OC) {
  VD o(static_cast<std::size_t>(R) * OC);
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < OC; ++j) {
      double s = b.empty() ? 0 : b[static_cast<std::size_t>(j)];
      for (int k = 0; k < IC; ++k)
        s += x[static_cast<std::size_t>(r) * IC + k] * w[static_cast<std::size_t>(k) * OC + j];
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
      for (int i = 0; i < C; ++i)
        s += x[static_cast<std::size_t>(r) * C + i] * wte[static_cast<std::size_t>(v) * C + i];
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

// One forward and backward of `model` on random units (seeded from `seed`, scale `scale`) and the given
// tokens; the loss must equal the double reference `ref_loss(units)` within 1e-5 relative and every
// unit's gradient its finite differences (check_grad).
inline void check_whole_model(LanguageModel& model, const ModelShape& s, int B, std::uint32_t seed, float scale,
                              const std::vector<int>& tok, const std::vector<int>& tg,
                              const std::function<double(const std::vector<VD>&)>& ref_loss) {
  const int R = B * s.seq_len;
  std::vector<VF> u, gr;
  std::vector<const float*> w;
  std::vector<float*> g;
  std::vector<std::size_t> sizes;
  for (const auto& lu : layer_units(s)) {
    u.push_back(randf(static_cast<std::size_t>(lu.params), seed++, scale));
    gr.emplace_back(static_cast<std::size_t>(lu.params), 0.0f);
    sizes.push_back(static_cast<std::size_t>(lu.params));
  }
  for (std::size_t i = 0; i < u.size(); ++i) w.push_back(u[i].data()), g.push_back(gr[i].data());
  ResidentUnits src(w, g, sizes);
  model.forward(src, tok.data(), tg.data());
  const double loss =
      ops::mean_loss(model.row_losses(), model.rows());  // (the synchronous CPU device: the ops have run)
  model.backward(src, tok.data(), tg.data(), 1.0f / R);
  std::vector<VD> ud;
  for (const auto& v : u) ud.push_back(to_d(v));
  EXPECT_NEAR(loss, ref_loss(ud), 1e-5 * std::fabs(loss));
  for (std::size_t k = 0; k < ud.size(); ++k) {
    SCOPED_TRACE("unit " + std::to_string(k));
    check_grad("model grad", gr[k], ud[k], [&] { return ref_loss(ud); });
  }
}

}  // namespace zinf::test
