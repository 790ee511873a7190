// zinf/cpu_adam/adam.h — the fused Update supernode's kernels: one pass over a chunk of parameters
// that unscales and clips the gradient, runs Adam/AdamW, and writes master, m, v and the 16-bit
// parameter copy (straight into a caller-supplied — typically pinned — buffer). Plus the gradient
// sum-of-squares pre-pass and bulk fp16/bf16 conversions.
//
// The exactness contract: every SIMD path (avx512, avx2, scalar) produces bit-identical outputs to
// the scalar reference (adam_update_reference and friends), which is the specification:
//
//   g  = grad · grad_scale                      (grad_scale = clip_coef / loss_scale, one fp32 mul)
//   L2 mode, wd > 0:      g = fma(wd, p, g)
//   m  = fma(m, β1, g·(1−β1))
//   v  = fma(v, β2, (g·g)·(1−β2))
//   u  = m / fma(sqrt(v), 1/sqrt(1−β2^t), eps)  (eps outside the bias correction, as PyTorch/DeepSpeed)
//   AdamW mode, wd > 0:   p = p · (1 − lr·wd)    (decoupled decay, applied before the step)
//   p  = fma(−lr/(1−β1^t), u, p)
//   param16 = round_to_nearest_even(p)          (fp16 or bf16; see convert.h for NaN/overflow rules)
//
// Every operation is an IEEE fp32 operation with one rounding (fma included), so the vector paths
// reproduce it exactly; nothing depends on how a range is split across threads.
//
// Thread-safety: the kernels are pure functions of their arguments; ranges may be processed
// concurrently when they do not overlap.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zinf/cpu_adam/simd.h"
#include "zinf/types.h"

namespace zinf::cpu_adam {

enum class GradType { fp32, fp16, bf16 };
enum class HalfType { fp16, bf16 };

struct AdamHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  bool decoupled = true;  // AdamW (p·(1−lr·wd)); false: Adam with L2 (g += wd·p)
  bool bias_correction = true;
};

// Per-step scalars, computed once per step (in double, rounded once to float) and shared by every
// chunk and path — DeepSpeed folds bias correction into scalars the same way.
struct AdamStep {
  float beta1 = 0, one_minus_beta1 = 0, beta2 = 0, one_minus_beta2 = 0, eps = 0;
  float step_size = 0;  // −lr / (1 − β1^t)
  float bc2_rsqrt = 0;  // 1 / sqrt(1 − β2^t)
  float decay = 0;      // AdamW: 1 − lr·wd (a multiplier); L2: wd (added to g as wd·p)
  bool apply_decay = false;
  bool decoupled = true;
  float grad_scale = 1;  // multiplies every gradient: clip_coef / loss_scale
};

// `step` counts from 1. Throws nothing; an invalid step (< 1) is a programming error (ZINF_CHECK).
AdamStep make_adam_step(const AdamHyper& h, std::int64_t step, float grad_scale = 1.0f);

// How m and v are stored (config zero_optimization.optimizer_states: "fp32", "bf16", "8bit").
//  * fp32: float per element.
//  * bf16: the upper 16 bits of the fp32 value, rounded to nearest even (spec::fp32_to_bf16).
//  * q8:   one byte per element plus one fp32 power-of-two scale per kQ8Block elements (blocks are
//          counted from the start of a chunk). The byte is a small float relative to the scale: for
//          m sign | 4-bit exponent | 3-bit mantissa, for v (never negative) 5-bit exponent | 3-bit
//          mantissa; spec.h states the exact encoding. A block holding a non-finite value gets a NaN
//          scale (every element decodes to NaN); a block whose values are all below 2^-111 (m) or
//          2^-95 (v) a zero scale (every element decodes to 0).
// The Update decodes m and v to fp32, runs the fp32 specification below, and encodes the results;
// master and the step itself stay fp32 (the step uses the fp32 m and v, not their encoded copies).
enum class StateFormat { fp32, bf16, q8 };
enum class StateKind { m, v };  // q8 codes m (signed) and v (non-negative) differently
constexpr std::size_t kQ8Block = 256;
std::size_t state_elem_bytes(StateFormat f);             // 4, 2, 1
std::size_t state_scales(StateFormat f, std::size_t n);  // q8: ceil(n / kQ8Block); otherwise 0
// "fp32", "bf16", "8bit" (the config words). Inline: the parsers that record a checkpoint's mode
// need it without the kernels.
inline const char* state_format_name(StateFormat f) { return enum_name(f, {"fp32", "bf16", "8bit"}); }

// One chunk of the flat parameter space. master, m, v (and the q8 scales) are read and written in
// place; grad is read; param16 (may be null: no 16-bit copy) is written. No pointer needs any
// alignment. m and v point at n elements of the `states` format (fp32: float, bf16: std::uint16_t
// bits, q8: std::uint8_t codes); m_scale and v_scale (q8 only) at state_scales(q8, n) floats each,
// the first for the block that starts at element 0 — a q8 chunk starts on a block boundary.
struct UpdateChunk {
  std::size_t n = 0;
  const void* grad = nullptr;
  GradType grad_type = GradType::fp16;
  float* master = nullptr;
  void* m = nullptr;
  void* v = nullptr;
  float* m_scale = nullptr;
  float* v_scale = nullptr;
  StateFormat states = StateFormat::fp32;
  void* param16 = nullptr;
  HalfType param16_type = HalfType::fp16;
};

// Bulk conversions between fp32 states and a stored format (checkpoints, tier set-up). q8 blocks are
// counted from the start of src (encode) / dst (decode); scales has state_scales(f, n) entries (may be
// null for fp32 and bf16). decode(encode(x)) is what the Update would see; decoding stored states and
// encoding the result stores the same bytes and scales again (decoded checkpoints resume bit for bit).
void encode_states(StateFormat f, StateKind k, const float* src, void* dst, float* scales, std::size_t n);
void decode_states(StateFormat f, StateKind k, const void* src, const float* scales, float* dst, std::size_t n);
// The same on the given SIMD path (clamped to what the CPU has); the plain forms use active_simd().
void encode_states(StateFormat f, StateKind k, const float* src, void* dst, float* scales, std::size_t n,
                   SimdLevel level);
void decode_states(StateFormat f, StateKind k, const void* src, const float* scales, float* dst, std::size_t n,
                   SimdLevel level);

// The specification: plain scalar loop.
void adam_update_reference(const AdamStep& s, const UpdateChunk& c);
// The same on the given SIMD path (clamped to what the CPU has), single-threaded, on the caller's thread.
void adam_update(const AdamStep& s, const UpdateChunk& c, SimdLevel level);
// The same on active_simd().
void adam_update(const AdamStep& s, const UpdateChunk& c);

// Benchmark references (bench/micro/cpu_adam_bench.cpp, `zinf bench adam`):
//  * adam_memory_traffic: reads and writes exactly the streams adam_update does (grad, master, m, v
//    — and the q8 scales — in; master, m, v, scales, param16 out) in the chunk's state format, with
//    trivial math (adds) — the memory-movement limit of the pass.
//  * adam_update_naive: Adam written the ordinary way, a plain loop compiled without ISA flags — the
//    "what you'd write" baseline. Not bit-compatible with the specification (different op order).
//    fp32 states only.
void adam_memory_traffic(const UpdateChunk& c, SimdLevel level);
void adam_update_naive(const AdamHyper& h, std::int64_t step, float grad_scale, const UpdateChunk& c);

// Sum of squares of a gradient range, for the global norm. Each element is widened to double and
// squared exactly; element i (counted from the start of the range) goes to accumulator i mod 16;
// the 16 accumulators are folded pairwise (j += j+8, j += j+4, j += j+2, j += j+1). Identical on
// every path. `finite` is false when any element is NaN or ±Inf.
struct SumSquares {
  double sum = 0;
  bool finite = true;
};
SumSquares sum_squares_reference(const void* grad, GradType t, std::size_t n);
SumSquares sum_squares(const void* grad, GradType t, std::size_t n, SimdLevel level);
SumSquares sum_squares(const void* grad, GradType t, std::size_t n);

}  // namespace zinf::cpu_adam
