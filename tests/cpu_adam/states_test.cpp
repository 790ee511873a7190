// states_test.cpp — compressed Adam states (bf16, q8): the encodings against hand-checked values,
// the round trip decode(encode(decode(c))) == decode(c) over every code and every block exponent an
// encode can produce, partial and non-finite blocks, the Update in each format against "decode → the
// fp32 reference → encode" element by element, every SIMD path against the reference bit for bit, and
// the thread split.
#include <gtest/gtest.h>

#include "paths.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "zinf/cpu_adam/adam.h"
#include "zinf/cpu_adam/convert.h"
#include "zinf/cpu_adam/host_threads.h"
#include "zinf/cpu_adam/spec.h"

namespace zinf::cpu_adam {
namespace {

float f_of(std::uint32_t u) { return std::bit_cast<float>(u); }

constexpr StateFormat kFormats[] = {StateFormat::fp32, StateFormat::bf16, StateFormat::q8};

// Bit-for-bit equality of two float arrays (any NaN equals any NaN: payloads are not specified).
int float_mismatches(const char* what, const float* a, const float* b, std::size_t n) {
  int bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (bits(a[i]) == bits(b[i]) || (std::isnan(a[i]) && std::isnan(b[i]))) continue;
    if (bad++ < 5) ADD_FAILURE() << what << "[" << i << "]: " << a[i] << " vs " << b[i];
  }
  return bad;
}
int byte_mismatches(const char* what, const std::uint8_t* a, const std::uint8_t* b, std::size_t n) {
  int bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (a[i] == b[i]) continue;
    if (bad++ < 5) ADD_FAILURE() << what << " byte " << i << ": " << +a[i] << " vs " << +b[i];
  }
  return bad;
}

TEST(StateFormats, SizesAndNames) {
  EXPECT_EQ(state_elem_bytes(StateFormat::fp32), 4u);
  EXPECT_EQ(state_elem_bytes(StateFormat::bf16), 2u);
  EXPECT_EQ(state_elem_bytes(StateFormat::q8), 1u);
  EXPECT_EQ(state_scales(StateFormat::fp32, 1000), 0u);
  EXPECT_EQ(state_scales(StateFormat::bf16, 1000), 0u);
  EXPECT_EQ(state_scales(StateFormat::q8, 0), 0u);
  EXPECT_EQ(state_scales(StateFormat::q8, 1), 1u);
  EXPECT_EQ(state_scales(StateFormat::q8, 256), 1u);
  EXPECT_EQ(state_scales(StateFormat::q8, 257), 2u);
  EXPECT_STREQ(state_format_name(StateFormat::fp32), "fp32");
  EXPECT_STREQ(state_format_name(StateFormat::bf16), "bf16");
  EXPECT_STREQ(state_format_name(StateFormat::q8), "8bit");
}

// Values worked out by hand from the specification (spec.h).
TEST(Q8, EncodesHandCheckedValues) {
  // An m block whose largest element is 1.0: E = 127, scale 1, top 15.
  const std::vector<float> m = {1.0f,
                                -0.5f,
                                0.3f,                      // 1.2·2^-2 → 1.25·2^-2: e = 13, m3 = 2
                                1.0625f,                   // tie between m3 = 0 and 1 → even (0)
                                1.1875f,                   // tie between m3 = 1 and 2 → even (2)
                                std::ldexp(1.0f, -14),     // e = 1: the smallest normal code
                                std::ldexp(1.0f, -15),     // e = 0 grid (2^-17 apart): q = 4
                                std::ldexp(3.0f, -18),     // 1.5 steps: tie → even, q = 2
                                std::ldexp(1.0f, -18),     // half a step: tie → even, q = 0
                                -std::ldexp(5.0f, -19),    // 1.25 steps → q = 1, negative
                                std::ldexp(15.5f, -18),    // 7.75 steps → q = 8 = the e = 1 code 0x08
                                0.0f,
                                -0.0f,
                                f_of(1)};                  // the smallest subnormal: q = 0
  const std::uint8_t want_m[] = {0x78, 0xF0, 0x6A, 0x78, 0x7A, 0x08, 0x04, 0x02, 0x00, 0x81, 0x08, 0x00, 0x80, 0x00};
  std::vector<std::uint8_t> codes(m.size());
  float scale = -1;
  encode_states(StateFormat::q8, StateKind::m, m.data(), codes.data(), &scale, m.size());
  EXPECT_EQ(bits(scale), bits(1.0f));
  EXPECT_EQ(byte_mismatches("m codes", codes.data(), want_m, m.size()), 0);
  std::vector<float> back(m.size());
  decode_states(StateFormat::q8, StateKind::m, codes.data(), &scale, back.data(), m.size());
  const float want_back[] = {1.0f,
                             -0.5f,
                             0.3125f,
                             1.0f,
                             1.25f,
                             std::ldexp(1.0f, -14),
                             std::ldexp(1.0f, -15),
                             std::ldexp(1.0f, -16),
                             0.0f,
                             -std::ldexp(1.0f, -17),
                             std::ldexp(1.0f, -14),
                             0.0f,
                             -0.0f,
                             0.0f};
  EXPECT_EQ(float_mismatches("m decoded", back.data(), want_back, m.size()), 0);

  // A v block whose largest element is 6.0 (1.5·2^2): E = 129, scale 4, top 31; v keeps no sign.
  const std::vector<float> v = {6.0f, 1.0f, 7.5f / 4, std::ldexp(1.0f, -28), std::ldexp(1.0f, -29),
                                std::ldexp(3.0f, -31), -1.0f};
  const std::uint8_t want_v[] = {0xFC, 0xE8, 0xEF, 0x08, 0x04, 0x03, 0xE8};
  std::vector<std::uint8_t> vc(v.size());
  encode_states(StateFormat::q8, StateKind::v, v.data(), vc.data(), &scale, v.size());
  EXPECT_EQ(bits(scale), bits(4.0f));
  EXPECT_EQ(byte_mismatches("v codes", vc.data(), want_v, v.size()), 0);
  EXPECT_EQ(bits(spec::q8_decode(0xFC, 4.0f, StateKind::v)), bits(6.0f));
  EXPECT_EQ(bits(spec::q8_decode(0x03, 4.0f, StateKind::v)), bits(std::ldexp(3.0f, -31)));
  // 1.5 grid steps of 2^-31: a tie, to the even code 2
  const float tie = std::ldexp(3.0f, -32);
  EXPECT_EQ(spec::q8_encode(tie, 129, StateKind::v), 0x02);
}

TEST(Q8, ZeroNanAndOverflowBlocks) {
  std::vector<float> x(kQ8Block, 0.0f);
  std::vector<std::uint8_t> c(kQ8Block, 0xAA);
  float scale = -1;
  encode_states(StateFormat::q8, StateKind::m, x.data(), c.data(), &scale, x.size());  // all zero
  EXPECT_EQ(bits(scale), 0u);
  EXPECT_EQ(c[0], 0);
  // Tiny blocks (every |x| below 2^(top−126)) are zero blocks too.
  x[7] = std::ldexp(1.0f, -112);
  encode_states(StateFormat::q8, StateKind::m, x.data(), c.data(), &scale, x.size());
  EXPECT_EQ(bits(scale), 0u);
  EXPECT_EQ(c[7], 0);
  x[7] = std::ldexp(1.0f, -111);  // E = 16 = top + 1: the smallest scale
  encode_states(StateFormat::q8, StateKind::m, x.data(), c.data(), &scale, x.size());
  EXPECT_EQ(bits(scale), 16u << 23);
  EXPECT_EQ(c[7], 0x78);
  // The largest finite block: 1.875·2^127 keeps its exponent; anything that rounds above overflows.
  x[7] = f_of(0x7F700000);
  encode_states(StateFormat::q8, StateKind::v, x.data(), c.data(), &scale, x.size());
  EXPECT_EQ(bits(scale), 254u << 23);
  EXPECT_EQ(c[7], 0xFF);
  // every path: NaNs whose mantissa carries into the sign when rounded, too
  for (std::uint32_t bad : {0x7F780000u, 0x7F7FFFFFu, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0x7FFFFFFFu, 0xFFFFFFFFu,
                            0x7FF80000u}) {
    x[9] = f_of(bad);
    for (SimdLevel path : supported_paths()) {
      for (StateKind k : {StateKind::m, StateKind::v}) {
        SCOPED_TRACE(::testing::Message() << std::hex << bad << " " << to_string(path) << " kind " << static_cast<int>(k));
        std::fill(c.begin(), c.end(), 0xAA);
        encode_states(StateFormat::q8, k, x.data(), c.data(), &scale, x.size(), path);
        EXPECT_EQ(bits(scale), 0x7FC00000u);
        for (std::size_t i = 0; i < kQ8Block; ++i) ASSERT_EQ(c[i], 0) << i;
        std::vector<float> back(kQ8Block);
        decode_states(StateFormat::q8, k, c.data(), &scale, back.data(), kQ8Block, path);
        EXPECT_TRUE(std::isnan(back[0]) && std::isnan(back[255]));
      }
    }
  }
}

// decode(encode(decode(c))) == decode(c): a block holding all 256 codes, under every block exponent
// E. The round trip holds for E in (top, 254] — every scale an encode produces (it never produces a
// scale of 2^(E−127) with E ≤ top: such blocks are stored as zero blocks); the codes and the scale
// come back unchanged too. Random blocks (with one element at the top code, as every stored block
// has) check the same with mixed signs and orders.
TEST(Q8, DecodeEncodeRoundTripIsExactForEveryCodeAndScale) {
  for (StateKind k : {StateKind::m, StateKind::v}) {
    const std::uint32_t top = spec::q8_top(k);
    std::vector<std::uint8_t> codes(kQ8Block), again(kQ8Block);
    for (std::size_t i = 0; i < kQ8Block; ++i) codes[i] = static_cast<std::uint8_t>(i);
    std::vector<float> x(kQ8Block), y(kQ8Block);
    int checked = 0;
    for (std::uint32_t E = 1; E <= 254; ++E) {
      const float scale = f_of(E << 23);
      decode_states(StateFormat::q8, k, codes.data(), &scale, x.data(), kQ8Block);
      float scale2 = -1;
      encode_states(StateFormat::q8, k, x.data(), again.data(), &scale2, kQ8Block);
      if (E <= top) {  // below the smallest scale: stored as a zero block
        EXPECT_EQ(bits(scale2), 0u) << E;
        continue;
      }
      SCOPED_TRACE(::testing::Message() << "kind " << static_cast<int>(k) << " E=" << E);
      ASSERT_EQ(bits(scale2), bits(scale));
      ASSERT_EQ(byte_mismatches("codes", again.data(), codes.data(), kQ8Block), 0);
      decode_states(StateFormat::q8, k, again.data(), &scale2, y.data(), kQ8Block);
      ASSERT_EQ(float_mismatches("values", y.data(), x.data(), kQ8Block), 0);
      ++checked;
    }
    EXPECT_EQ(checked, static_cast<int>(254 - top));

    std::mt19937 rng(7);
    for (int trial = 0; trial < 2000; ++trial) {
      const std::size_t n = 1 + rng() % kQ8Block;
      for (std::size_t i = 0; i < n; ++i) codes[i] = static_cast<std::uint8_t>(rng());
      codes[rng() % n] = static_cast<std::uint8_t>((top << 3) | (rng() & 7) | (k == StateKind::m ? rng() & 0x80 : 0));
      const float scale = f_of((top + 1 + rng() % (254 - top)) << 23);
      decode_states(StateFormat::q8, k, codes.data(), &scale, x.data(), n);
      float scale2 = -1;
      encode_states(StateFormat::q8, k, x.data(), again.data(), &scale2, n);
      decode_states(StateFormat::q8, k, again.data(), &scale2, y.data(), n);
      ASSERT_EQ(float_mismatches("random block", y.data(), x.data(), n), 0) << trial;
    }
  }
}

// Re-encoding a decoded value never moves it, and encoding rounds to the nearest stored value: for a
// block of fixed scale, every x lies at most half a grid step from decode(encode(x)).
TEST(Q8, EncodeRoundsToANearestCode) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  for (StateKind k : {StateKind::m, StateKind::v}) {
    std::vector<float> x(kQ8Block), y(kQ8Block);
    std::vector<std::uint8_t> c(kQ8Block);
    for (int trial = 0; trial < 200; ++trial) {
      for (auto& e : x) e = k == StateKind::m ? nd(rng) * 1e-3f : std::fabs(nd(rng)) * 1e-7f;
      x[0] = k == StateKind::m ? 3e-3f : 3e-7f;  // pins the block's exponent
      float scale;
      encode_states(StateFormat::q8, k, x.data(), c.data(), &scale, kQ8Block);
      decode_states(StateFormat::q8, k, c.data(), &scale, y.data(), kQ8Block);
      for (std::size_t i = 0; i < kQ8Block; ++i) {
        // the neighbours of y among all codes' values: none is strictly closer to x
        for (int code = 0; code < 256; ++code) {
          const float z = spec::q8_decode(static_cast<std::uint8_t>(code), scale, k);
          ASSERT_LE(std::fabs(y[i] - x[i]), std::fabs(z - x[i])) << "x=" << x[i] << " code " << code;
        }
      }
    }
  }
}

TEST(Q8, PartialLastBlockHasItsOwnScale) {
  const std::size_t n = 300;
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = i < kQ8Block ? 8.0f + static_cast<float>(i) : 1e-3f * static_cast<float>(i);
  std::vector<std::uint8_t> c(n), c2(n);
  float scales[2], s2[2];
  encode_states(StateFormat::q8, StateKind::m, x.data(), c.data(), scales, n);
  // the same as encoding the two blocks separately
  encode_states(StateFormat::q8, StateKind::m, x.data(), c2.data(), s2, kQ8Block);
  encode_states(StateFormat::q8, StateKind::m, x.data() + kQ8Block, c2.data() + kQ8Block, s2 + 1, n - kQ8Block);
  EXPECT_EQ(byte_mismatches("codes", c.data(), c2.data(), n), 0);
  EXPECT_EQ(bits(scales[0]), bits(s2[0]));
  EXPECT_EQ(bits(scales[1]), bits(s2[1]));
  EXPECT_EQ(bits(scales[0]), bits(256.0f));           // 263 → round3 264 = 1.03·2^8
  EXPECT_EQ(bits(scales[1]), bits(0.25f));            // 0.299 → 2^-2 · 1.19...
  std::vector<float> y(n);
  decode_states(StateFormat::q8, StateKind::m, c.data(), scales, y.data(), n);
  for (std::size_t i = kQ8Block; i < n; ++i) EXPECT_NEAR(y[i], x[i], x[i] / 16 + 1e-9) << i;
}

// Blocks built to hit every branch of the encoder: exact ties of round3 and of the grid below the
// normal codes, values just above and below them, fp32 subnormals, zeros of both signs, overflow and
// non-finite values in some blocks, and blocks of random bits.
std::vector<float> encoder_stress(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> x(n);
  for (std::size_t b = 0; b < n; b += kQ8Block) {
    const std::uint32_t kind = rng() % 8, top_exp = 40 + rng() % 210;  // the block's E, mostly
    for (std::size_t i = b; i < std::min(n, b + kQ8Block); ++i) {
      const std::uint32_t sign = (rng() & 1) << 31;
      std::uint32_t ex = top_exp - 1 - rng() % 40, mant = rng() & 0x7FFFFF;
      switch (rng() % 6) {
        case 0: mant = (mant & ~0xFFFFFu) | 0x80000u; break;  // a round3 tie
        case 1: mant = (mant & ~0xFFFFFu) | (0x80000u + (rng() % 3) - 1); break;
        case 2: {  // a tie (or a neighbour) on the grid below the normal codes of m (top 15) or v (31)
          const std::uint32_t j = rng() % 4, s = 21 + j;
          ex = top_exp - (rng() % 2 ? 15 : 31) - j;
          mant = ((mant >> s) << s) | ((1u << (s - 1)) + (rng() % 3) - 1);
          mant &= 0x7FFFFF;
          break;
        }
        default: break;
      }
      if (i == b) ex = top_exp, mant = 0;  // pins E
      std::uint32_t u = sign | (ex << 23) | mant;
      if (kind == 1) u = static_cast<std::uint32_t>(rng());             // random bits (often a NaN block)
      if (kind == 2 && i % 5 == 0) u = sign | (rng() & 0x7FFFFF);      // fp32 subnormals
      if (kind == 3 && i % 7 == 0) u = sign;                           // ±0
      if (kind == 4 && i == b + 3) u = 0x7F780000u | sign;             // rounds to inf
      if (kind == 5) u &= 0x807FFFFFu | (std::min<std::uint32_t>(ex, 40) << 23);  // tiny blocks
      x[i] = f_of(u);
    }
  }
  return x;
}

TEST(Q8, EveryPathEncodesAndDecodesLikeTheReference) {
  for (SimdLevel path : supported_paths()) {
    for (StateKind k : {StateKind::m, StateKind::v}) {
      for (std::size_t n : {std::size_t{0}, std::size_t{100}, std::size_t{256}, std::size_t{257}, std::size_t{8191}}) {
        for (std::size_t off : {std::size_t{0}, std::size_t{3}}) {
          SCOPED_TRACE(::testing::Message() << to_string(path) << " kind " << static_cast<int>(k) << " n=" << n
                                            << " off=" << off);
          const std::vector<float> x = encoder_stress(n + off, static_cast<std::uint32_t>(n + off));
          std::vector<std::uint8_t> want(n + off, 0x55), got(n + off, 0x55);
          std::vector<float> ws(state_scales(StateFormat::q8, n) + 1, -1), gs = ws;
          encode_states(StateFormat::q8, k, x.data() + off, want.data() + off, ws.data(), n, SimdLevel::scalar);
          encode_states(StateFormat::q8, k, x.data() + off, got.data() + off, gs.data(), n, path);
          ASSERT_EQ(byte_mismatches("codes", got.data(), want.data(), n + off), 0);
          ASSERT_EQ(float_mismatches("scales", gs.data(), ws.data(), gs.size()), 0);
          std::vector<float> wd(n + off, 7), gd(n + off, 7);
          decode_states(StateFormat::q8, k, want.data() + off, ws.data(), wd.data() + off, n, SimdLevel::scalar);
          decode_states(StateFormat::q8, k, want.data() + off, ws.data(), gd.data() + off, n, path);
          ASSERT_EQ(float_mismatches("decoded", gd.data(), wd.data(), n + off), 0);
        }
      }
    }
  }
}

// Blocks in which every element has a normal code (e ≥ 1), the kind the vector paths encode without
// per-element range tests, with the elements at the edges of that: round3 ties, values whose round3
// carries into the next exponent (at the block's largest element too, which moves E), the smallest
// values that still round up into e = 1 and, in some blocks, one that rounds down below it (so the
// block takes the general encoder); for v, some blocks hold a −0 or a negative value (stored as its
// magnitude).
std::vector<float> normal_blocks(std::size_t n, StateKind k, std::uint32_t seed) {
  std::mt19937 rng(seed);
  const std::uint32_t top = spec::q8_top(k);
  std::vector<float> x(n);
  for (std::size_t b = 0; b < n; b += kQ8Block) {
    const std::uint32_t ex_max = top + 2 + rng() % (252 - top), kind = rng() % 6;
    // the smallest exponent with a normal code (E = ex_max, or ex_max + 1 in kind 1)
    const std::uint32_t lowest = ex_max - top + 1 + (kind == 1 ? 1 : 0);
    const std::size_t end = std::min(n, b + kQ8Block);
    for (std::size_t i = b; i < end; ++i) {
      std::uint32_t ex = lowest + rng() % (ex_max - lowest), mant = rng() & 0x7FFFFF;  // below ex_max
      switch (rng() % 5) {
        case 0: mant = (mant & ~0xFFFFFu) | 0x80000u; break;  // a round3 tie
        case 1: mant = rng() % 3 == 0 ? 0x77FFFFu : (rng() % 2 ? 0x780000u : 0x7E0000u); break;  // at a carry
        default: break;
      }
      if (i == b) ex = ex_max, mant = kind == 1 ? 0x7C0000u : 0;  // pins E (kind 1: E = ex_max + 1)
      std::uint32_t u = (k == StateKind::m ? (rng() & 1) << 31 : 0u) | (ex << 23) | mant;
      if (i == b + 5 && kind == 2) u = ((lowest - 1) << 23) | 0x780000u;  // rounds up to e = 1
      if (i == b + 6 && kind == 3) u = ((lowest - 1) << 23) | 0x77FFFFu;  // rounds below e = 1: general
      if (i == b + 7 && kind == 4) u = k == StateKind::v ? 0x80000000u : 0u;  // ±0 (v: −0 → general)
      if (i == b + 8 && kind == 5 && k == StateKind::v) u |= 0x80000000u;      // a negative v: general
      x[i] = f_of(u);
    }
  }
  return x;
}

TEST(Q8, EveryPathEncodesNormalBlocksLikeTheReference) {
  for (SimdLevel path : supported_paths()) {
    for (StateKind k : {StateKind::m, StateKind::v}) {
      for (std::size_t n : {std::size_t{256}, std::size_t{300}, std::size_t{16384}}) {
        SCOPED_TRACE(::testing::Message() << to_string(path) << " kind " << static_cast<int>(k) << " n=" << n);
        const std::vector<float> x = normal_blocks(n, k, static_cast<std::uint32_t>(n) + static_cast<std::uint32_t>(k));
        std::vector<std::uint8_t> want(n, 0x55), got(n, 0x55);
        std::vector<float> ws(state_scales(StateFormat::q8, n), -1), gs = ws;
        encode_states(StateFormat::q8, k, x.data(), want.data(), ws.data(), n, SimdLevel::scalar);
        encode_states(StateFormat::q8, k, x.data(), got.data(), gs.data(), n, path);
        ASSERT_EQ(byte_mismatches("codes", got.data(), want.data(), n), 0);
        ASSERT_EQ(float_mismatches("scales", gs.data(), ws.data(), gs.size()), 0);
        std::vector<float> wd(n, 7), gd(n, 7);
        decode_states(StateFormat::q8, k, want.data(), ws.data(), wd.data(), n, SimdLevel::scalar);
        decode_states(StateFormat::q8, k, want.data(), ws.data(), gd.data(), n, path);
        ASSERT_EQ(float_mismatches("decoded", gd.data(), wd.data(), n), 0);
      }
    }
  }
}

// Decoding any bytes under any scale (a damaged or hand-made checkpoint): blocks of normal codes
// only, of any codes, and of zero codes, under power-of-two scales at and past the edges of what an
// encode stores (E ≤ top, 254, inf), NaN, ±0, negative, subnormal and not-a-power-of-two scales.
TEST(Q8, EveryPathDecodesAnyCodesUnderAnyScale) {
  std::mt19937 rng(23);
  const std::size_t blocks = 400, n = blocks * kQ8Block;
  std::vector<std::uint8_t> codes(n);
  std::vector<float> scales(blocks);
  for (StateKind k : {StateKind::m, StateKind::v}) {
    const std::uint32_t top = spec::q8_top(k);
    for (std::size_t b = 0; b < blocks; ++b) {
      const std::uint32_t codes_kind = rng() % 3;
      for (std::size_t i = b * kQ8Block; i < (b + 1) * kQ8Block; ++i) {
        std::uint32_t c = rng() & 0xFF;
        if (codes_kind == 0) c = (c & 0x87) | ((1 + rng() % (k == StateKind::m ? 15 : 31)) << 3);  // e ≥ 1
        if (codes_kind == 2) c = (rng() % 8 == 0) ? 0x80 : 0;
        codes[i] = static_cast<std::uint8_t>(c);
      }
      const std::uint32_t E = b % 2 ? top + 1 + rng() % (254 - top) : rng() % 256;
      std::uint32_t sb = E << 23;
      switch (b % 11) {
        case 1: sb = 0x7FC00000u; break;
        case 3: sb = 0x80000000u; break;
        case 5: sb |= 0x80000000u; break;
        case 7: sb |= 1u + rng() % 0x7FFFFF; break;
        case 9: sb = rng() % 0x800000u; break;
        default: break;
      }
      if (b == 2) sb = (top + 1) << 23;
      if (b == 4) sb = 254u << 23;
      if (b == 6) sb = top << 23;
      scales[b] = f_of(sb);
    }
    for (SimdLevel path : supported_paths()) {
      SCOPED_TRACE(::testing::Message() << to_string(path) << " kind " << static_cast<int>(k));
      std::vector<float> want(n, 7), got(n, 7);
      decode_states(StateFormat::q8, k, codes.data(), scales.data(), want.data(), n, SimdLevel::scalar);
      decode_states(StateFormat::q8, k, codes.data(), scales.data(), got.data(), n, path);
      ASSERT_EQ(float_mismatches("decoded", got.data(), want.data(), n), 0);
    }
  }
}

TEST(StateFormats, Bf16AndFp32Conversions) {
  std::mt19937 rng(11);
  const std::size_t n = 1000;
  std::vector<float> x(n), y(n);
  for (auto& e : x) e = f_of(static_cast<std::uint32_t>(rng()));
  std::vector<std::uint16_t> b(n);
  encode_states(StateFormat::bf16, StateKind::m, x.data(), b.data(), nullptr, n);
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(b[i], spec::fp32_to_bf16(x[i])) << i;
  decode_states(StateFormat::bf16, StateKind::v, b.data(), nullptr, y.data(), n);
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(bits(y[i]), bits(spec::bf16_to_fp32(b[i]))) << i;
  std::vector<std::uint16_t> again(n);  // stored values survive decode → encode
  encode_states(StateFormat::bf16, StateKind::v, y.data(), again.data(), nullptr, n);
  EXPECT_EQ(again, b);
  std::vector<float> f(n);
  encode_states(StateFormat::fp32, StateKind::m, x.data(), f.data(), nullptr, n);
  decode_states(StateFormat::fp32, StateKind::m, f.data(), nullptr, y.data(), n);
  EXPECT_EQ(std::memcmp(x.data(), y.data(), n * 4), 0);
}

// ---- the Update in every format ------------------------------------------------------------------

// Stored m, v (+ scales) of one format, `off` elements into their buffers, so that no pointer is
// aligned to a vector (each stays aligned to its element type, as any array of it is).
struct Stored {
  StateFormat f;
  std::size_t n, off;
  std::vector<std::uint8_t> m, v;  // (n + off)·elem_bytes bytes
  std::vector<float> ms, vs;
  void* mp() { return m.data() + off * state_elem_bytes(f); }
  void* vp() { return v.data() + off * state_elem_bytes(f); }
};

Stored store(StateFormat f, const std::vector<float>& m, const std::vector<float>& v, std::size_t n, std::size_t off) {
  Stored s{f, n, off, {}, {}, {}, {}};
  s.m.assign((n + off) * state_elem_bytes(f), 0);
  s.v.assign((n + off) * state_elem_bytes(f), 0);
  s.ms.assign(state_scales(f, n) + 1, 0);
  s.vs.assign(state_scales(f, n) + 1, 0);
  encode_states(f, StateKind::m, m.data(), s.mp(), s.ms.data(), n);
  encode_states(f, StateKind::v, v.data(), s.vp(), s.vs.data(), n);
  return s;
}

struct Problem {
  std::vector<float> master, m, v, grad32;
  std::vector<std::uint16_t> grad16, out;
};

// n elements (+1 past the end, for offset views), zero, the parameter copy filled with `out`.
Problem sized_problem(std::size_t n, std::uint16_t out) {
  Problem p;
  p.master.resize(n + 1);
  p.m.resize(n + 1);
  p.v.resize(n + 1);
  p.grad32.resize(n + 1);
  p.grad16.resize(n + 1);
  p.out.assign(n + 1, out);
  return p;
}

Problem make_problem(std::size_t n, std::uint32_t seed, bool specials) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Problem p = sized_problem(n, 0xABCD);
  for (std::size_t i = 0; i < n + 1; ++i) {
    p.master[i] = nd(rng) * 0.02f;
    p.m[i] = nd(rng) * (i % 600 < 300 ? 1e-3f : 1e-6f);  // blocks of different scales
    p.v[i] = std::fabs(nd(rng)) * 1e-6f;
    if (i % 1000 == 3) p.m[i] = p.v[i] = 0;
    float g = nd(rng) * (i % 7 == 0 ? 100.0f : 0.01f);
    if (i % 5 == 1) {  // values far below their block's largest: the codes below the normal range
      p.m[i] *= 1e-5f;
      p.v[i] *= 1e-9f;
      g *= 1e-6f;
    }
    if (specials && i % 397 == 5) g = (i % 2) ? INFINITY : NAN;
    p.grad32[i] = g;
  }
  return p;
}

UpdateChunk chunk(Problem& p, Stored& s, GradType gt, int out, std::size_t off) {
  UpdateChunk c;
  c.n = s.n;
  c.grad_type = gt;
  if (gt == GradType::fp16) fp32_to_fp16(p.grad32.data(), p.grad16.data(), p.grad16.size(), SimdLevel::scalar);
  if (gt == GradType::bf16) fp32_to_bf16(p.grad32.data(), p.grad16.data(), p.grad16.size(), SimdLevel::scalar);
  c.grad = gt == GradType::fp32 ? static_cast<const void*>(p.grad32.data() + off) : p.grad16.data() + off;
  c.master = p.master.data() + off;
  c.m = s.mp();
  c.v = s.vp();
  c.m_scale = s.ms.data();
  c.v_scale = s.vs.data();
  c.states = s.f;
  c.param16 = out ? p.out.data() + off : nullptr;
  c.param16_type = out == 2 ? HalfType::bf16 : HalfType::fp16;
  return c;
}

void expect_same(Problem& a, Stored& sa, Problem& b, Stored& sb) {
  EXPECT_EQ(float_mismatches("master", a.master.data(), b.master.data(), a.master.size()), 0);
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(byte_mismatches("m", sa.m.data(), sb.m.data(), sa.m.size()), 0);
  EXPECT_EQ(byte_mismatches("v", sa.v.data(), sb.v.data(), sa.v.size()), 0);
  EXPECT_EQ(float_mismatches("m_scale", sa.ms.data(), sb.ms.data(), sa.ms.size()), 0);
  EXPECT_EQ(float_mismatches("v_scale", sa.vs.data(), sb.vs.data(), sa.vs.size()), 0);
}

// The Update in a compressed format is exactly: decode m and v, the fp32 reference, encode.
TEST(StatesUpdate, EqualsDecodeThenFp32ReferenceThenEncode) {
  const AdamStep st = make_adam_step(AdamHyper{.lr = 1e-3f, .weight_decay = 0.1f}, 10, 1.0f / 1024);
  for (StateFormat f : kFormats) {
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{255}, std::size_t{256}, std::size_t{1000},
                          std::size_t{4099}}) {
      SCOPED_TRACE(::testing::Message() << state_format_name(f) << " n=" << n);
      Problem p = make_problem(n, static_cast<std::uint32_t>(n + 1), true), q = p;
      Stored s = store(f, p.m, p.v, n, 1);
      // what the Update must compute
      std::vector<float> m(n), v(n);
      decode_states(f, StateKind::m, s.mp(), s.ms.data(), m.data(), n);
      decode_states(f, StateKind::v, s.vp(), s.vs.data(), v.data(), n);
      Stored want = store(StateFormat::fp32, m, v, n, 0);
      adam_update_reference(st, chunk(q, want, GradType::fp16, 1, 0));
      if (n) std::memcpy(m.data(), want.mp(), n * 4);  // (an empty vector's data() may be null)
      if (n) std::memcpy(v.data(), want.vp(), n * 4);
      Stored want_f = store(f, m, v, n, 1);
      // what it computes
      const Stored before = s;
      adam_update_reference(st, chunk(p, s, GradType::fp16, 1, 0));
      expect_same(p, s, q, want_f);
      if (n > 0) {
        EXPECT_NE(s.m, before.m);
      }
    }
  }
}

struct HyperCase {
  const char* name;
  AdamHyper h;
  std::int64_t step;
  float grad_scale;
};

std::vector<HyperCase> hyper_cases() {
  AdamHyper adamw{.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.1f, .decoupled = true};
  AdamHyper nowd = adamw;
  nowd.weight_decay = 0;
  AdamHyper l2 = adamw;
  l2.decoupled = false;
  l2.weight_decay = 0.05f;
  return {{"adamw_step1", adamw, 1, 1.0f},
          {"adamw_step10", adamw, 10, 1.0f / 1024},
          {"adamw_step1e6", adamw, 1000000, 0.5f},
          {"wd0", nowd, 3, 1.0f},
          {"l2", l2, 5, 1.0f / 65536}};
}

TEST(StatesUpdate, EveryPathMatchesTheReferenceBitForBit) {
  const std::size_t sizes[] = {0, 1, 15, 17, 255, 256, 257, 1023, 4099};
  for (SimdLevel path : supported_paths()) {
    for (StateFormat f : {StateFormat::bf16, StateFormat::q8}) {
      for (std::size_t n : sizes) {
        for (GradType gt : {GradType::fp32, GradType::fp16, GradType::bf16}) {
          for (const auto& hc : hyper_cases()) {
            for (std::size_t off : {std::size_t{0}, std::size_t{1}}) {
              const int out = static_cast<int>((n + off + static_cast<std::size_t>(gt)) % 3);
              const bool specials = hc.step == 3;
              SCOPED_TRACE(::testing::Message() << to_string(path) << " " << state_format_name(f) << " n=" << n
                                                << " grad=" << static_cast<int>(gt) << " out=" << out << " "
                                                << hc.name << " off=" << off);
              Problem a = make_problem(n, static_cast<std::uint32_t>(n * 7 + off), specials), b = a;
              Stored sa = store(f, a.m, a.v, n, off), sb = sa;
              const AdamStep st = make_adam_step(hc.h, hc.step, hc.grad_scale);
              adam_update_reference(st, chunk(a, sa, gt, out, off));
              adam_update(st, chunk(b, sb, gt, out, off), path);
              expect_same(b, sb, a, sa);
              if (::testing::Test::HasFailure()) return;
            }
          }
        }
      }
    }
  }
}

// Smooth data (no element far below its block's largest, as in the benchmark) so that nearly every
// block takes the vector paths' fast decode and encode, with a few blocks made to leave them: a NaN
// gradient (a NaN block), an all-zero block, a stored m code below the normal range, a new m that
// rounds below it, a huge gradient (a block whose m jumps by many exponents), a −0 m. Several steps
// in a row, so each step decodes what the path itself stored; the result must equal the reference
// after every step.
// Four steps in a row of every path against the reference, with fp32 and fp16 gradients, from q8
// states stored from `base`: each step decodes what the path itself stored.
void expect_q8_steps_match_the_reference(const Problem& base, std::size_t n) {
  const AdamHyper h{.lr = 1e-4f, .weight_decay = 0.01f};
  for (SimdLevel path : supported_paths()) {
    for (GradType gt : {GradType::fp32, GradType::fp16}) {
      SCOPED_TRACE(::testing::Message() << to_string(path) << " grad=" << static_cast<int>(gt));
      Problem a = base, b = base;
      Stored sa = store(StateFormat::q8, a.m, a.v, n, 0), sb = sa;
      for (std::int64_t step = 1; step <= 4; ++step) {
        const AdamStep st = make_adam_step(h, step, 1.0f / 1024);
        adam_update_reference(st, chunk(a, sa, gt, 1, 0));
        adam_update(st, chunk(b, sb, gt, 1, 0), path);
        expect_same(b, sb, a, sa);
        if (::testing::Test::HasFailure()) return;
      }
    }
  }
}

TEST(StatesUpdate, Q8FastBlocksMatchTheReferenceOverSteps) {
  const std::size_t n = 64 * kQ8Block + 77;
  std::mt19937 rng(41);
  std::uniform_real_distribution<float> u(-0.5f, 0.5f);
  Problem base = sized_problem(n, 0);
  for (std::size_t i = 0; i < n + 1; ++i) {
    const float r = u(rng);
    base.master[i] = r * 0.02f;
    base.m[i] = r * 1e-3f;
    base.v[i] = r * r * 1e-6f + 1e-8f;
    base.grad32[i] = u(rng) * 1e-2f;
  }
  auto at = [](std::size_t block, std::size_t j) { return block * kQ8Block + j; };
  base.grad32[at(3, 17)] = NAN;
  for (std::size_t j = 0; j < kQ8Block; ++j) base.m[at(5, j)] = base.v[at(5, j)] = base.grad32[at(5, j)] = 0;
  base.m[at(7, 40)] = 1e-12f;                              // stored as a code below the normal range
  base.m[at(9, 3)] = 1e-11f, base.grad32[at(9, 3)] = 0;    // new m below the normal range too
  base.grad32[at(11, 100)] = 60000.0f;                     // m's block exponent jumps
  base.m[at(13, 9)] = -0.0f, base.grad32[at(13, 9)] = 0;
  expect_q8_steps_match_the_reference(base, n);
}

// States as training leaves them: each parameter's gradient has its own scale, spread over 24
// binades, so most blocks hold m and v codes below the normal range (e = 0) and new values that round
// onto them — the vector paths decode and encode such blocks in their loops, with per-lane selects.
// Some blocks sit at the ends of the exponent range: m's and v's block exponent just above top (the
// encoder's multiply for the small codes would need 2^128 there) or two above it, and blocks of huge
// states (where that multiply scales down, by up to 2^−110). Several steps in a row, so each step
// decodes what the path itself stored.
TEST(StatesUpdate, Q8BlocksWithCodesBelowTheNormalRangeMatchTheReferenceOverSteps) {
  const std::size_t n = 96 * kQ8Block + 33;
  std::mt19937 rng(77);
  std::uniform_real_distribution<float> u(-0.5f, 0.5f);
  Problem base = sized_problem(n, 0);
  for (std::size_t i = 0; i < n + 1; ++i) {
    const float sigma = std::exp2(24.0f * u(rng)) * 1e-3f;
    base.master[i] = u(rng) * 0.02f;
    base.grad32[i] = (u(rng) + u(rng) + u(rng)) * sigma;
    base.m[i] = (u(rng) + u(rng) + u(rng)) * 0.23f * sigma / 1024;
    base.v[i] = (1.0f + u(rng)) * 0.25f * sigma * sigma / (1024.0f * 1024.0f);
  }
  // Blocks pinned to a block exponent (the largest element at 1.5·2^(E−127)) with the others spread
  // below it, and gradients that keep them there (fp32 gradients; fp16 ones may flush them to zero).
  auto pin = [&](std::vector<float>& x, std::size_t block, int E, float spread_binades) {
    for (std::size_t j = 0; j < kQ8Block; ++j)
      x[block * kQ8Block + j] = std::ldexp(j == 0 ? 1.5f : 1.0f + u(rng), E - 127 - (j == 0 ? 0 : static_cast<int>(
                                                                                       spread_binades * (u(rng) + 0.5f))));
  };
  pin(base.m, 20, 16, 20), pin(base.v, 20, 32, 36);   // E = top + 1
  pin(base.m, 21, 17, 20), pin(base.v, 21, 33, 36);   // E = top + 2
  pin(base.m, 22, 200, 24), pin(base.v, 22, 250, 40);  // huge states
  pin(base.m, 23, 150, 24), pin(base.v, 23, 170, 40);
  for (std::size_t block : {20, 21, 22, 23})
    for (std::size_t j = 0; j < kQ8Block; ++j) {
      const std::size_t i = block * kQ8Block + j;
      base.grad32[i] = base.m[i] * 10.0f * 1024;  // g · grad_scale ≈ 10 m: m's exponent moves a little
      if (block == 20 || block == 21) base.v[i] = std::ldexp(1.0f + u(rng), (block == 20 ? 32 : 33) - 127 - static_cast<int>(36 * (u(rng) + 0.5f)));
    }
  // the premise: blocks with codes below the normal range, and the pinned exponents
  const Stored sa = store(StateFormat::q8, base.m, base.v, n, 0);
  std::size_t with_e0 = 0;
  for (std::size_t blk = 0; blk < n / kQ8Block; ++blk) {
    bool e0 = false;
    for (std::size_t j = 0; j < kQ8Block; ++j) e0 |= (sa.m[blk * kQ8Block + j] & 0x78) == 0;
    with_e0 += e0;
  }
  EXPECT_GT(with_e0, n / kQ8Block / 2);
  EXPECT_EQ(bits(sa.ms[20]) >> 23, 16u);
  EXPECT_EQ(bits(sa.vs[20]) >> 23, 32u);
  EXPECT_EQ(bits(sa.ms[22]) >> 23, 200u);
  expect_q8_steps_match_the_reference(base, n);
}

// The encoder and decoder alone on such blocks: the block exponent just above top (no 2^128 for the
// small codes' multiply) and two above it, and huge blocks, each with elements down to far below the
// normal codes, ties on the grid below them included.
TEST(Q8, EveryPathEncodesBlocksWithSmallCodesAtTheEndsOfTheExponentRange) {
  std::mt19937 rng(5);
  for (StateKind k : {StateKind::m, StateKind::v}) {
    const int top = k == StateKind::m ? 15 : 31;
    std::vector<float> x;
    for (int E : {top + 1, top + 2, top + 3, 140, 160, 200, 254}) {
      for (int rep = 0; rep < 4; ++rep) {
        for (std::size_t j = 0; j < kQ8Block; ++j) {
          std::uint32_t sign = k == StateKind::m ? (rng() & 1) << 31 : 0;
          int ex = j == 0 ? E : E - 1 - static_cast<int>(rng() % 40);
          std::uint32_t mant = rng() & 0x7FFFFF;
          if (rng() % 4 == 0) {  // a tie (or a neighbour) on the grid below the normal codes
            const int sh = 21 + static_cast<int>(rng() % 4);
            ex = E - top - static_cast<int>(sh - 21);
            mant = (((mant >> sh) << sh) | ((1u << (sh - 1)) + (rng() % 3) - 1)) & 0x7FFFFF;
          }
          if (j == 0) mant = 0;
          const std::uint32_t bits_ = ex >= 1 ? sign | (static_cast<std::uint32_t>(ex) << 23) | mant : sign | (mant >> 3);
          x.push_back(f_of(bits_));
        }
      }
    }
    const std::size_t n = x.size();
    std::vector<std::uint8_t> want(n), got(n);
    std::vector<float> ws(n / kQ8Block), gs(n / kQ8Block);
    encode_states(StateFormat::q8, k, x.data(), want.data(), ws.data(), n, SimdLevel::scalar);
    std::size_t small = 0;
    for (std::uint8_t c : want) small += (c & (k == StateKind::m ? 0x78 : 0xF8)) == 0;
    ASSERT_GT(small, n / 8);  // the premise: many codes below the normal range
    for (SimdLevel path : supported_paths()) {
      SCOPED_TRACE(::testing::Message() << to_string(path) << " kind " << static_cast<int>(k));
      encode_states(StateFormat::q8, k, x.data(), got.data(), gs.data(), n, path);
      ASSERT_EQ(byte_mismatches("codes", got.data(), want.data(), n), 0);
      ASSERT_EQ(float_mismatches("scales", gs.data(), ws.data(), gs.size()), 0);
      std::vector<float> wd(n), gd(n);
      decode_states(StateFormat::q8, k, want.data(), ws.data(), wd.data(), n, SimdLevel::scalar);
      decode_states(StateFormat::q8, k, want.data(), ws.data(), gd.data(), n, path);
      ASSERT_EQ(float_mismatches("decoded", gd.data(), wd.data(), n), 0);
    }
  }
}

TEST(StatesUpdate, ThreadCountDoesNotChangeResults) {
  const std::size_t n = (std::size_t{1} << 19) + 37;
  const AdamStep st = make_adam_step(AdamHyper{.weight_decay = 0.01f}, 4, 0.25f);
  HostThreads p1(1), p3(3);
  for (StateFormat f : kFormats) {
    SCOPED_TRACE(state_format_name(f));
    Problem a = make_problem(n, 5, false), b = a;
    Stored sa = store(f, a.m, a.v, n, 0), sb = sa;
    adam_update(p1, st, chunk(a, sa, GradType::bf16, 2, 0));
    adam_update(p3, st, chunk(b, sb, GradType::bf16, 2, 0));
    expect_same(a, sa, b, sb);
    Problem r = make_problem(n, 5, false);
    Stored sr = store(f, r.m, r.v, n, 0);
    adam_update_reference(st, chunk(r, sr, GradType::bf16, 2, 0));
    expect_same(b, sb, r, sr);
  }
}

TEST(StatesUpdate, MemoryTrafficKernelTouchesEveryStream) {
  const std::size_t n = 1000;
  for (StateFormat f : kFormats) {
    for (SimdLevel path : supported_paths()) {
      SCOPED_TRACE(::testing::Message() << state_format_name(f) << " " << to_string(path));
      Problem a = make_problem(n, 9, false);
      for (auto& g : a.grad32) g = 1.0f;
      Stored s = store(f, a.m, a.v, n, 0), before = s;
      adam_memory_traffic(chunk(a, s, GradType::fp32, 1, 0), path);
      EXPECT_NE(s.m, before.m);
      EXPECT_NE(s.v, before.v);
      if (f == StateFormat::q8) {
        EXPECT_NE(s.ms, before.ms);
      }
    }
  }
}

}  // namespace
}  // namespace zinf::cpu_adam
