// cpu_adam_bench.cpp — Google Benchmark micro benches for the host Update pass.
//   BM_cpu_adam_fused/<params>/<threads>/<states>     the fused Update, fp16 grads in, fp16 params out
//   BM_cpu_adam_traffic/<params>/<threads>/<states>   the same loads/stores, trivial math (memory limit)
//   BM_cpu_adam_naive/<params>/<threads>/0            Adam as a plain loop (fp32 states)
//   BM_cpu_adam_sum_squares/<params>/<threads>, BM_cpu_adam_fp32_to_bf16/<params>
// <states>: 0 fp32, 1 bf16, 2 8-bit m and v. bytes_per_second counts 28, 20 or 16.06 B/param for the
// Update (the ratio fused/traffic at the same <states> is what matters).
// Every bench first checks its path against the reference on a slice and aborts on a mismatch.
#include <benchmark/benchmark.h>

#include <cstring>
#include <memory>
#include <vector>

#include "bench/adam_chunk.h"
#include "zinf/cpu_adam/adam.h"
#include "zinf/cpu_adam/convert.h"
#include "zinf/cpu_adam/host_threads.h"

namespace {

using namespace zinf::cpu_adam;

struct Arrays {
  std::size_t n;
  StateFormat f;
  std::vector<std::uint16_t> grad, out;
  std::vector<float> master, m_scale, v_scale;
  std::vector<std::uint8_t> m, v;  // n elements of format f
  explicit Arrays(std::size_t count, StateFormat format = StateFormat::fp32)
      : n(count),
        f(format),
        grad(count),
        out(count),
        master(count),
        m_scale(state_scales(format, count)),
        v_scale(state_scales(format, count)),
        m(count * state_elem_bytes(format)),
        v(count * state_elem_bytes(format)) {
    std::vector<float> m32(n), v32(n);
    for (std::size_t i = 0; i < n; ++i) {
      const float r = static_cast<float>((i * 2654435761u) % 1000003) / 1000003.0f - 0.5f;
      grad[i] = fp32_to_fp16_reference(r * 1e-2f);
      master[i] = r * 0.02f;
      m32[i] = r * 1e-3f;
      v32[i] = r * r * 1e-6f;
    }
    encode_states(f, StateKind::m, m32.data(), m.data(), m_scale.data(), n);
    encode_states(f, StateKind::v, v32.data(), v.data(), v_scale.data(), n);
  }
  UpdateChunk chunk(std::size_t b, std::size_t e) {
    return zinf::bench::adam_chunk(b, e, f, grad.data(), master.data(), m.data(), v.data(), m_scale.data(),
                                   v_scale.data(), out.data());
  }
  bool operator==(const Arrays& o) const {
    return master == o.master && out == o.out && m == o.m && v == o.v && m_scale == o.m_scale && v_scale == o.v_scale;
  }
};

const AdamHyper kHyper{.lr = 1e-4f, .weight_decay = 0.01f};

void validate_once() {
  static const bool ok = [] {
    for (StateFormat f : {StateFormat::fp32, StateFormat::bf16, StateFormat::q8}) {
      Arrays a(100003, f), b(100003, f);
      const AdamStep s = make_adam_step(kHyper, 3, 0.5f);
      adam_update_reference(s, a.chunk(0, a.n));
      adam_update(s, b.chunk(0, b.n));
      if (!(a == b)) return false;
    }
    return true;
  }();
  if (!ok) {
    std::fprintf(stderr, "cpu_adam_bench: the active SIMD path does not match the reference\n");
    std::abort();
  }
}

template <int Kind>
void BM_update(benchmark::State& state) {
  validate_once();
  const auto n = static_cast<std::size_t>(state.range(0));
  HostThreads pool(static_cast<int>(state.range(1)));
  const auto f = static_cast<StateFormat>(state.range(2));
  Arrays a(n, f);
  const AdamStep s = make_adam_step(kHyper, 10, 1.0f / 1024);
  const SimdLevel level = active_simd();
  for (auto _ : state) {
    pool.parallel_for(n, 1 << 16, [&](std::size_t b, std::size_t e) {
      if constexpr (Kind == 0) adam_update(s, a.chunk(b, e), level);
      if constexpr (Kind == 1) adam_memory_traffic(a.chunk(b, e), level);
      if constexpr (Kind == 2) adam_update_naive(kHyper, 10, 1.0f / 1024, a.chunk(b, e));
    });
    benchmark::ClobberMemory();
  }
  const double bytes_per_param = 12 + 4 * static_cast<double>(state_elem_bytes(f)) +
                                 (f == StateFormat::q8 ? 16.0 / static_cast<double>(kQ8Block) : 0.0);
  state.SetBytesProcessed(static_cast<std::int64_t>(static_cast<double>(state.iterations()) *
                                                    static_cast<double>(n) * bytes_per_param));
  state.counters["params_per_s"] =
      benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(to_string(level)) + " " + state_format_name(f));
}
void BM_cpu_adam_fused(benchmark::State& s) { BM_update<0>(s); }
void BM_cpu_adam_traffic(benchmark::State& s) { BM_update<1>(s); }
void BM_cpu_adam_naive(benchmark::State& s) { BM_update<2>(s); }

void BM_cpu_adam_sum_squares(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  HostThreads pool(static_cast<int>(state.range(1)));
  Arrays a(n);
  if (sum_squares(pool, a.grad.data(), GradType::fp16, n).sum !=
      sum_squares_blocked(a.grad.data(), GradType::fp16, n).sum)
    std::abort();
  for (auto _ : state) benchmark::DoNotOptimize(sum_squares(pool, a.grad.data(), GradType::fp16, n));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(n) * 2);
}

void BM_cpu_adam_fp32_to_bf16(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  Arrays a(n);
  for (std::size_t i = 0; i < 1000; ++i) {
    std::uint16_t o;
    fp32_to_bf16(&a.master[i], &o, 1);
    if (o != fp32_to_bf16_reference(a.master[i])) std::abort();
  }
  for (auto _ : state) {
    fp32_to_bf16(a.master.data(), a.out.data(), n);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(n) * 6);
}

const std::vector<std::vector<std::int64_t>> kUpdateArgs = {{16 << 20, 64 << 20}, {1, 2}, {0, 1, 2}};

}  // namespace

BENCHMARK(BM_cpu_adam_fused)->ArgsProduct(kUpdateArgs)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_cpu_adam_traffic)->ArgsProduct(kUpdateArgs)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_cpu_adam_naive)->Args({16 << 20, 1, 0})->Args({16 << 20, 2, 0})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_cpu_adam_sum_squares)
    ->Args({64 << 20, 1})
    ->Args({64 << 20, 2})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_cpu_adam_fp32_to_bf16)->Arg(64 << 20)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_MAIN();
