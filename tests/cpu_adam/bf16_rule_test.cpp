// bf16_rule_test.cpp — the one fp32 → bf16 rounding rule (and fp32 → fp16's), bit for bit, NaN
// payloads included: cpu_adam/spec.h's conversion against the one the CUDA fast kernels use
// (cuda/round16.cuh, compiled here by g++ from NVIDIA's <cuda_bf16.h> / <cuda_fp16.h> host code, the
// code the CUDA executor runs) and against every SIMD path of cpu_adam this machine has (the bulk
// conversions of convert.h, the Update's own conversions).
//   bf16  every one of the 2^32 fp32 inputs;
//   fp16  every input whose exponent field is one where fp16's rounding changes form — 0 and 1 (zeros,
//         subnormals, the smallest normals), 101–114 (the flush-to-zero edge, fp16's subnormal range,
//         its first normal binades), 141–143 (the last binades, the overflow edge at 65520, beyond),
//         254 and 255 (the largest finite values, inf, NaN) — both signs, every mantissa: 8 % of the
//         inputs; the other exponents take the same arithmetic as their neighbours. (All 2^32 would
//         take the test from about 3 s to 6 s on 2 cores; walked once, the CUDA and spec.h fp16
//         rules parted on NaNs only.)
#include <gtest/gtest.h>

#include "paths.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "zinf/cpu_adam/convert.h"
#include "zinf/cpu_adam/spec.h"

#if defined(ZINF_TEST_CUDA_FP_HEADERS)
#include "cuda/round16.cuh"
#endif

namespace zinf::cpu_adam {
namespace {

constexpr std::uint64_t kAll = std::uint64_t{1} << 32;
constexpr std::uint32_t kChunk = 1u << 16;  // a multiple of compare's block; 128 chunks per exponent

// The exponent fields whose inputs the fp16 comparisons walk (the header says why these).
bool fp16_walks(std::uint32_t exponent_field) {
  const std::uint32_t e = exponent_field;
  return e <= 1 || (e >= 101 && e <= 114) || (e >= 141 && e <= 143) || e >= 254;
}

// One comparison over the walk: how many inputs it saw and how many disagree, how many of those are
// fp32 subnormals (nonzero, exponent field 0) and NaNs, and the first few of them (input, got, spec).
struct Tally {
  std::uint64_t seen = 0, bad = 0, bad_subnormal = 0, bad_nan = 0;
  std::vector<std::array<std::uint32_t, 3>> examples;

  void add(std::uint32_t u, std::uint16_t got, std::uint16_t want) {
    const std::uint32_t a = u & 0x7FFFFFFFu;
    ++bad;
    bad_subnormal += a != 0 && a < 0x00800000u;
    bad_nan += a > 0x7F800000u;
    if (examples.size() < kExamples) examples.push_back({u, got, want});
  }
  void merge(const Tally& o) {
    seen += o.seen, bad += o.bad, bad_subnormal += o.bad_subnormal, bad_nan += o.bad_nan;
    examples.insert(examples.end(), o.examples.begin(), o.examples.end());
    std::sort(examples.begin(), examples.end());
    if (examples.size() > kExamples) examples.resize(kExamples);
  }
  std::string report(const std::string& name) const {
    std::ostringstream s;
    s << name << ": " << bad << " of " << seen << " inputs differ from spec.h (" << bad_subnormal
      << " fp32 subnormals, " << bad_nan << " NaNs)" << std::hex;
    for (const auto& [u, got, want] : examples) s << "\n  x=0x" << u << ": 0x" << got << ", spec 0x" << want;
    return s.str();
  }
  static constexpr std::size_t kExamples = 6;
};

// One chunk of the walk: the inputs base … base + kChunk − 1, spec.h's conversions of them and the
// CUDA kernels' ones, and a buffer for a CPU path's. These loops are the walk's cost, so they are
// compiled twice: for AVX2 (where GCC vectorizes the bf16 ones) and for the baseline.
struct Chunk {
  std::vector<float> x = std::vector<float>(kChunk);
  std::vector<std::uint16_t> spec_b = std::vector<std::uint16_t>(kChunk), spec_h = spec_b, cuda_b = spec_b,
                             cuda_h = spec_b, got = spec_b;
};
[[gnu::always_inline]] inline void convert_chunk(std::uint32_t base, bool fp16, Chunk& c) {
  float* x = c.x.data();
  std::uint16_t *sb = c.spec_b.data(), *sh = c.spec_h.data();
  for (std::uint32_t i = 0; i < kChunk; ++i) x[i] = spec::float_of(base + i);
  for (std::uint32_t i = 0; i < kChunk; ++i) sb[i] = spec::fp32_to_bf16(x[i]);
#if defined(ZINF_TEST_CUDA_FP_HEADERS)
  std::uint16_t *cb = c.cuda_b.data(), *ch = c.cuda_h.data();
  for (std::uint32_t i = 0; i < kChunk; ++i) {
    const __nv_bfloat16 b = cuda::round_bf16(x[i]);
    std::memcpy(cb + i, &b, 2);
  }
  if (fp16)
    for (std::uint32_t i = 0; i < kChunk; ++i) {  // not vectorized: one loop for both
      sh[i] = spec::fp32_to_fp16(x[i]);
      const __half h = cuda::round_fp16(x[i]);
      std::memcpy(ch + i, &h, 2);
    }
#else
  if (fp16)
    for (std::uint32_t i = 0; i < kChunk; ++i) sh[i] = spec::fp32_to_fp16(x[i]);
#endif
}
__attribute__((target("avx2"))) void convert_chunk_avx2(std::uint32_t base, bool fp16, Chunk& c) {
  convert_chunk(base, fp16, c);
}
void convert_chunk_baseline(std::uint32_t base, bool fp16, Chunk& c) { convert_chunk(base, fp16, c); }

// Element by element only inside the 1024-element blocks that differ (memcmp finds them quickly).
void compare(const std::vector<std::uint16_t>& got, const std::vector<std::uint16_t>& want, std::uint32_t base,
             Tally& t) {
  constexpr std::uint32_t kBlock = 1024;
  static_assert(kChunk % kBlock == 0);
  for (std::uint32_t b = 0; b < kChunk; b += kBlock) {
    if (std::memcmp(got.data() + b, want.data() + b, kBlock * sizeof(std::uint16_t)) == 0) continue;
    for (std::uint32_t i = b; i < b + kBlock; ++i)
      if (got[i] != want[i]) t.add(base + i, got[i], want[i]);
  }
}

// What the walk compares with spec.h: the CUDA kernels' bf16 and fp16 rounding (where the CUDA headers
// are here), then each SIMD path's bf16 and fp16 bulk conversion. The scalar path is not walked: its
// conversions are spec.h's functions themselves (cpu_adam/reference.cpp; convert_test checks it).
struct Candidate {
  std::string name;
  bool cuda;       // else a CPU path
  SimdLevel path;  // a CPU path's
  bool fp16;       // else bf16
  Tally tally;
};

std::vector<Candidate> candidates() {
  std::vector<Candidate> c;
#if defined(ZINF_TEST_CUDA_FP_HEADERS)
  c.push_back({"the CUDA kernels' bf16 rounding (cuda::round_bf16)", true, SimdLevel::scalar, false, {}});
  c.push_back({"the CUDA kernels' fp16 rounding (cuda::round_fp16)", true, SimdLevel::scalar, true, {}});
#endif
  for (SimdLevel p : supported_paths()) {
    if (p == SimdLevel::scalar) continue;
    c.push_back({"cpu_adam::fp32_to_bf16 on the " + std::string(to_string(p)) + " path", false, p, false, {}});
    c.push_back({"cpu_adam::fp32_to_fp16 on the " + std::string(to_string(p)) + " path", false, p, true, {}});
  }
  return c;
}

// Walks every fp32 bit pattern, split across the machine's threads (each keeps its own tallies,
// merged at the end).
void walk(std::vector<Candidate>& cands) {
  const bool avx2 = detect_simd() >= SimdLevel::avx2;
  std::atomic<std::uint64_t> next{0};
  std::mutex mu;
  auto worker = [&] {
    std::vector<Tally> mine(cands.size());
    Chunk c;
    for (std::uint64_t start; (start = next.fetch_add(kChunk)) < kAll;) {
      const auto base = static_cast<std::uint32_t>(start);
      const bool fp16 = fp16_walks((base >> 23) & 0xFFu);
      avx2 ? convert_chunk_avx2(base, fp16, c) : convert_chunk_baseline(base, fp16, c);
      for (std::size_t k = 0; k < cands.size(); ++k) {
        const Candidate& d = cands[k];
        if (d.fp16 && !fp16) continue;
        mine[k].seen += kChunk;
        const std::vector<std::uint16_t>* got = &c.got;
        if (d.cuda) {
          got = d.fp16 ? &c.cuda_h : &c.cuda_b;
        } else if (d.fp16) {
          fp32_to_fp16(c.x.data(), c.got.data(), kChunk, d.path);
        } else {
          fp32_to_bf16(c.x.data(), c.got.data(), kChunk, d.path);
        }
        compare(*got, d.fp16 ? c.spec_h : c.spec_b, base, mine[k]);
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    for (std::size_t k = 0; k < cands.size(); ++k) cands[k].tally.merge(mine[k]);
  };
  const unsigned n = std::clamp(std::thread::hardware_concurrency(), 1u, 64u);
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < n; ++t) threads.emplace_back(worker);
  for (auto& t : threads) t.join();
}

// The rule itself, at the points where the candidates used to part: fp32 subnormals become ±0,
// NaNs stay NaN with their sign, quiet bit set and top payload bits kept.
TEST(Bf16Rule, SpecRuleAtItsEdges) {
  EXPECT_EQ(spec::fp32_to_bf16(spec::float_of(0x00000001u)), 0x0000);
  EXPECT_EQ(spec::fp32_to_bf16(spec::float_of(0x007FFFFFu)), 0x0000);  // RNE on the bits would give 0x0080
  EXPECT_EQ(spec::fp32_to_bf16(spec::float_of(0x80400000u)), 0x8000);
  EXPECT_EQ(spec::fp32_to_bf16(spec::float_of(0x00800000u)), 0x0080);  // the smallest normal is kept
  EXPECT_EQ(spec::fp32_to_bf16(spec::float_of(0xFFC12345u)), 0xFFC1);  // −NaN keeps its sign and payload
  EXPECT_EQ(spec::fp32_to_bf16(spec::float_of(0x7F800001u)), 0x7FC0);  // sNaN → quiet
  EXPECT_EQ(spec::fp32_to_fp16(spec::float_of(0xFFC12345u)), 0xFE09);
}

// One test for the whole walk (ctest runs each test in its own process, so two would walk twice).
TEST(Bf16Rule, EveryFp32RoundsAsTheSpecOnEveryPath) {
  std::vector<Candidate> cands = candidates();
#if !defined(ZINF_TEST_CUDA_FP_HEADERS)
  GTEST_LOG_(INFO) << "built without the CUDA headers (cuda_bf16.h): the CUDA kernels' rounding is not checked";
#endif
  const auto t0 = std::chrono::steady_clock::now();
  walk(cands);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const Candidate& d : cands) {
    EXPECT_EQ(d.tally.seen, d.fp16 ? 21 * (std::uint64_t{1} << 24) : kAll) << d.name;
    EXPECT_EQ(d.tally.bad, 0u) << d.tally.report(d.name);
  }
  if (cpu_has_avx512_bf16()) GTEST_LOG_(INFO) << "the avx512 path used AVX512-BF16's vcvtneps2bf16 for bf16";
  GTEST_LOG_(INFO) << cands.size() << " conversions against spec.h (bf16 over all 2^32 inputs) in " << s << " s on "
                   << std::thread::hardware_concurrency() << " threads";
}

}  // namespace
}  // namespace zinf::cpu_adam
