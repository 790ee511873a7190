// zinf/cpu_adam/simd.h — which SIMD path runs, chosen at run time from CPUID.
//
// One binary serves any x86-64: each instruction set lives in its own translation unit compiled
// with its own flags, and detect_simd() picks the best the CPU (and OS) supports. A cap (config
// device.simd, or the environment variable ZINF_SIMD=avx512|avx2|scalar) forces a lower path for
// tests and benchmarks. Thread-safe: the cap is an atomic read on every dispatch.
#pragma once

#include <string_view>

namespace zinf::cpu_adam {

enum class SimdLevel { scalar = 0, avx2 = 1, avx512 = 2 };

std::string_view to_string(SimdLevel s);
// Parses "scalar", "avx2", "avx512" (and "auto" → the detected level); throws zinf::ConfigError.
SimdLevel parse_simd_level(std::string_view name);

// The best level this CPU supports: avx512 needs AVX-512 F/BW/VL/DQ; avx2 needs AVX2+FMA+F16C.
SimdLevel detect_simd();
// Whether the CPU has the AVX512-BF16 conversion instructions (used by the avx512 path when present).
bool cpu_has_avx512_bf16();

// The level dispatch uses now: min(detected, cap). The cap starts from ZINF_SIMD when set.
SimdLevel active_simd();
// Caps dispatch at `level` (process-wide). A level above what the CPU has is clamped to it.
void set_simd_cap(SimdLevel level);

}  // namespace zinf::cpu_adam
