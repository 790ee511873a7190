// adam_bench.h — `zinf bench adam`. Like every user-facing measurement (`zinf bench …`) it reports ratios
// against a limit measured in the same run, because absolute numbers drift on a shared machine.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "zinf/cpu_adam/adam.h"

namespace zinf {

struct AdamBenchOptions {
  std::int64_t params = 256'000'000;
  int threads = 0;  // 0: physical cores
  int reps = 5;     // best of
  cpu_adam::StateFormat states = cpu_adam::StateFormat::fp32;  // how m and v are stored
};

struct AdamBenchRow {
  double seconds = 0;  // best of reps
  double params_per_s = 0;
  double gb_per_s = 0;  // at bytes_per_param
};

struct AdamBenchResult {
  std::int64_t params = 0;
  int threads = 0;
  std::string simd;
  cpu_adam::StateFormat states = cpu_adam::StateFormat::fp32;
  // read grad16 2 + master 4 + m, v; write master 4 + m, v + param16 2. fp32 states: 28; bf16: 20;
  // 8-bit: 16 plus the two scales per 256 parameters read and written (16.06).
  double bytes_per_param = 28;
  AdamBenchRow fused;           // (a) the fused Update: fp16 grads in, fp16 param copy out
  AdamBenchRow traffic;         // (b) the same loads and stores with trivial math: the memory limit
  AdamBenchRow naive;           // (c) Adam written the ordinary way (fp32 states only; else 0)
  double ratio = 0;             // (a)/(b) in throughput: 1.0 = at the memory limit
  double speedup_vs_naive = 0;  // (a)/(c); 0 when (c) did not run
};

// Bytes one Update moves per parameter with fp16 gradients and an fp16 parameter copy.
double adam_bytes_per_param(cpu_adam::StateFormat f);

// Validates the fused path against the reference on a slice first (throws zinf::Error on mismatch),
// then times (a), (b), (c) interleaved, best of `reps`. `progress` gets one line per phase.
AdamBenchResult run_adam_bench(const AdamBenchOptions& o, const std::function<void(const std::string&)>& progress);

}  // namespace zinf
