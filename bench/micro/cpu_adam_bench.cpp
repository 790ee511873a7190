// cpu_adam_bench.cpp — Google Benchmark micro benches for the host Update pass.
//   BM_cpu_adam_fused/<params>/<threads>     the fused Update, fp16 grads in, fp16 params out
//   BM_cpu_adam_traffic/<params>/<threads>   the same loads/stores, trivial math (memory limit)
//   BM_cpu_adam_naive/<params>/<threads>     Adam as a plain loop
//   BM_cpu_adam_sum_squares/<params>/<threads>, BM_cpu_adam_fp32_to_bf16/<params>
// bytes_per_second counts 28 B/param for the Update (the ratio fused/traffic is what matters).
// Every bench first checks its path against the reference on a slice and aborts on a mismatch.
#include <benchmark/benchmark.h>

#include <cstring>
#include <memory>
#include <vector>

#include "zinf/cpu_adam/adam.h"
#include "zinf/cpu_adam/convert.h"
#include "zinf/cpu_adam/host_threads.h"

namespace {

using namespace zinf::cpu_adam;

struct Arrays {
  std::size_t n;
  std::vector<std::uint16_t> grad, out;
  std::vector<float> master, m, v;
  explicit Arrays(std::size_t count) : n(count), grad(count), out(count), master(count), m(count), v(count) {
    for (std::size_t i = 0; i < n; ++i) {
      const float r = static_cast<float>((i * 2654435761u) % 1000003) / 1000003.0f - 0.5f;
      grad[i] = fp32_to_fp16_reference(r * 1e-2f);
      master[i] = r * 0.02f;
      m[i] = r * 1e-3f;
      v[i] = r * r * 1e-6f;
    }
  }
  UpdateChunk chunk(std::size_t b, std::size_t e) {
    UpdateChunk c;
    c.n = e - b;
    c.grad = grad.data() + b;
    c.master = master.data() + b;
    c.m = m.data() + b;
    c.v = v.data() + b;
    c.param16 = out.data() + b;
    return c;
  }
};

const AdamHyper kHyper{.lr = 1e-4f, .weight_decay = 0.01f};

void validate_once() {
  static const bool ok = [] {
    Arrays a(100003), b(100003);
    const AdamStep s = make_adam_step(kHyper, 3, 0.5f);
    adam_update_reference(s, a.chunk(0, a.n));
    adam_update(s, b.chunk(0, b.n));
    return std::memcmp(a.master.data(), b.master.data(), a.n * 4) == 0 && a.out == b.out;
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
  Arrays a(n);
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
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(n) * 28);
  state.counters["params_per_s"] =
      benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(to_string(level)));
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

const std::vector<std::vector<std::int64_t>> kUpdateArgs = {{16 << 20, 64 << 20}, {1, 2}};

}  // namespace

BENCHMARK(BM_cpu_adam_fused)->ArgsProduct(kUpdateArgs)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_cpu_adam_traffic)->ArgsProduct(kUpdateArgs)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_cpu_adam_naive)->Args({16 << 20, 1})->Args({16 << 20, 2})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_cpu_adam_sum_squares)
    ->Args({64 << 20, 1})
    ->Args({64 << 20, 2})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_cpu_adam_fp32_to_bf16)->Arg(64 << 20)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_MAIN();
