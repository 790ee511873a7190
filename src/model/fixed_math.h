// fixed_math.h — exp, log and tanh built from + − × ÷ alone, in a fixed order, so that they give the
// same bits on every x86-64 CPU. glibc picks an FMA or an SSE2 variant of exp, log, sin, cos, pow, expf
// and logf at run time from the CPU it runs on, and the variants differ in the last bit; a result
// that feeds training would then depend on the machine. The float functions here work in double and
// round once at the end, so they are within one float ulp of the true value (within half an ulp
// nearly always); they are checked against libm in tests/backends/cpu_determinism_test.cpp.
//
// The file that includes this must be compiled with -ffp-contract=off (src/CMakeLists.txt does for the
// ops), or a compiler targeting FMA could fuse the polynomial steps and change the bits.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace zinf::fixed {

namespace detail {
// 1/n! for n = 0…13: the Taylor series of e^r, enough for |r| ≤ ln2/2 to about 1e-17 relative.
constexpr double kInvFact[] = {
    1.0,        1.0,         1.0 / 2,      1.0 / 6,       1.0 / 24,       1.0 / 120,       1.0 / 720,
    1.0 / 5040, 1.0 / 40320, 1.0 / 362880, 1.0 / 3628800, 1.0 / 39916800, 1.0 / 479001600, 1.0 / 6227020800};
// 1/(2n+1)! and 1/(2n)! for n = 0…9: the Taylor series of sin and cos.
constexpr double kInvOddFact[] = {1.0,
                                  1.0 / 6,
                                  1.0 / 120,
                                  1.0 / 5040,
                                  1.0 / 362880,
                                  1.0 / 39916800,
                                  1.0 / 6227020800,
                                  1.0 / 1307674368000,
                                  1.0 / 355687428096000,
                                  1.0 / 121645100408832000};
constexpr double kInvEvenFact[] = {1.0,
                                   1.0 / 2,
                                   1.0 / 24,
                                   1.0 / 720,
                                   1.0 / 40320,
                                   1.0 / 3628800,
                                   1.0 / 479001600,
                                   1.0 / 87178291200,
                                   1.0 / 20922789888000,
                                   1.0 / 6402373705728000};
// ln 2 split so that k·kLn2Hi is exact for |k| < 2^11 (the low 32 bits of kLn2Hi are zero).
constexpr double kLn2Hi = 0x1.62e42feep-1;
constexpr double kLn2Lo = 0x1.a39ef35793c76p-33;
constexpr double kLog2e = 0x1.71547652b82fep0;
constexpr double kRound = 0x1.8p52;  // adding and subtracting it rounds a double below 2^51 to an integer

inline double from_bits(std::uint64_t u) {
  double d;
  std::memcpy(&d, &u, sizeof d);
  return d;
}
inline std::uint64_t to_bits(double d) {
  std::uint64_t u;
  std::memcpy(&u, &d, sizeof u);
  return u;
}

// e^x for x in [-708, 709]: x = k·ln2 + r with |r| ≤ ln2/2, e^r by its Taylor series (Horner), × 2^k.
inline double exp_in_range(double x) {
  const double kd = (x * kLog2e + kRound) - kRound;
  const double r = (x - kd * kLn2Hi) - kd * kLn2Lo;
  double p = kInvFact[13];
  for (int n = 12; n >= 0; --n) p = p * r + kInvFact[n];
  const auto k = static_cast<std::int64_t>(kd);
  if (k > 1023)  // x just below the overflow threshold rounds to k = 1024, whose 2^k is no double: 2^1023 · 2
    return p * from_bits(static_cast<std::uint64_t>(k - 1 + 1023) << 52) * 2.0;
  return p * from_bits(static_cast<std::uint64_t>(k + 1023) << 52);
}

// log x for finite x > 0: x = 2^e·m with m in [√½, √2), log m = 2·atanh(s), s = (m−1)/(m+1), |s| < 0.172.
inline double log_positive(double x) {
  int e = 0;
  if (x < 0x1p-1022) {  // subnormal: scale into the normal range first
    x *= 0x1p54;
    e = -54;
  }
  std::uint64_t u = to_bits(x);
  e += static_cast<int>(u >> 52) - 1023;
  u = (u & 0x000fffffffffffffull) | 0x3ff0000000000000ull;  // m in [1, 2)
  double m = from_bits(u);
  if (m > 0x1.6a09e667f3bcdp0) {  // above √2: halve (exact)
    m *= 0.5;
    ++e;
  }
  const double f = m - 1.0;  // exact (Sterbenz)
  const double s = f / (2.0 + f), s2 = s * s;
  // atanh(s)/s = 1 + s²/3 + s⁴/5 + …; s^22/23 < 1e-18
  double p = 1.0 / 23;
  for (int n = 21; n >= 1; n -= 2) p = p * s2 + 1.0 / n;
  const double ed = static_cast<double>(e);
  return ed * kLn2Hi + (ed * kLn2Lo + 2.0 * s * p);
}
}  // namespace detail

// e^x in double (inf above 709.78, 0 below −745.2, NaN kept).
inline double exp(double x) {
  if (x != x) return x;
  if (x > 709.78) return std::numeric_limits<double>::infinity();
  if (x < -745.2) return 0.0;
  if (x < -708.0) return detail::exp_in_range(x + 64 * detail::kLn2Hi + 64 * detail::kLn2Lo) * 0x1p-64;
  return detail::exp_in_range(x);
}

// sin x and cos x in double for |x| ≤ 1.6e6 (rotary tables up to the longest sequence a config allows,
// 2^20, schedules, Box–Muller); beyond that libm (no caller goes there): q stays below 2^20 there, so
// q times each 33-bit piece of π/2 is exact. x = q·π/2 + r with |r| ≤ π/4 (π/2 in three 33-bit pieces, so q·piece is
// exact), then the Taylor series of sin and cos on r, swapped and negated by the quadrant q mod 4.
inline void sincos(double x, double& s, double& c) {
  if (!(std::fabs(x) <= 1.6e6)) {
    s = std::sin(x);
    c = std::cos(x);
    return;
  }
  constexpr double kTwoOverPi = 0x1.45f306dc9c883p-1;
  constexpr double kPio2[] = {0x1.921fb544p0, 0x1.0b4611a6p-34, 0x1.3198a2ep-69, 0x1.b839a252049c1p-104};
  const double qd = (x * kTwoOverPi + detail::kRound) - detail::kRound;
  const double r = (((x - qd * kPio2[0]) - qd * kPio2[1]) - qd * kPio2[2]) - qd * kPio2[3];
  const double r2 = r * r;
  // sin r = r·Σ (−r²)^n/(2n+1)!, cos r = Σ (−r²)^n/(2n)!, n ≤ 9: the next terms are below 1e-20
  double ps = 0, pc = 0;
  for (int n = 9; n >= 0; --n) {
    ps = ps * -r2 + detail::kInvOddFact[n];
    pc = pc * -r2 + detail::kInvEvenFact[n];
  }
  const double sr = r * ps, cr = pc;
  switch (static_cast<std::int64_t>(qd) & 3) {
    case 0: s = sr, c = cr; break;
    case 1: s = cr, c = -sr; break;
    case 2: s = -sr, c = -cr; break;
    default: s = -cr, c = sr; break;
  }
}
inline double sin(double x) {
  double s, c;
  sincos(x, s, c);
  return s;
}
inline double cos(double x) {
  double s, c;
  sincos(x, s, c);
  return c;
}

// log x in double (−inf at 0, NaN below 0, +inf kept).
inline double log(double x) {
  if (x != x || x == std::numeric_limits<double>::infinity()) return x;
  if (x < 0) return std::numeric_limits<double>::quiet_NaN();
  if (x == 0) return -std::numeric_limits<double>::infinity();
  return detail::log_positive(x);
}

// x^y for x > 0 as e^{y·log x}; the relative error grows with |y·log x| (about 1e-15 at 10).
inline double pow_positive(double x, double y) { return fixed::exp(y * fixed::log(x)); }

// e^x in float, rounded once from double (inf above 88.73, 0 below −104, NaN kept).
inline float expf(float x) {
  if (x != x) return x;
  if (x > 88.73f) return std::numeric_limits<float>::infinity();
  if (x < -104.0f) return 0.0f;
  return static_cast<float>(detail::exp_in_range(static_cast<double>(x)));
}

inline float logf(float x) { return static_cast<float>(fixed::log(static_cast<double>(x))); }

// tanh x in float: (e^{2|x|} − 1)/(e^{2|x|} + 1) in double; x itself below 2^-13 (tanh x = x(1 − x²/3 …)
// rounds to x there), ±1 beyond 9.1 (where the float result is 1).
inline float tanhf(float x) {
  if (x != x) return x;
  const double a = std::fabs(static_cast<double>(x));
  if (a < 0x1p-13) return x;
  if (a > 9.1) return x > 0 ? 1.0f : -1.0f;
  const double e = detail::exp_in_range(2.0 * a);
  const double t = (e - 1.0) / (e + 1.0);
  return static_cast<float>(x > 0 ? t : -t);
}

}  // namespace zinf::fixed
