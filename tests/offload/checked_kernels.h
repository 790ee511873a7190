// checked_kernels.h — EngineKernels that forward to the CPU device's kernels, count the calls by name,
// and fail the running test on every call with nothing to do (n = 0, bytes = 0, a norm input of 0 elements). A GPU
// refuses a launch of zero blocks, so the engine must skip empty work itself (the empty shards of small units under
// ZeRO stage ≥ 2, a rank's empty part of a bucket): on the CPU device such a call would pass unnoticed.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "zinf/backends/cpu.h"
#include "zinf/offload/engine_kernels.h"

namespace zinf::offload::test {

struct KernelCalls {
  std::mutex mu;
  std::map<std::string, int> by_name;  // under mu
  int of(const std::string& what) {
    std::lock_guard<std::mutex> lk(mu);
    return by_name[what];
  }
};

class NonEmptyKernels final : public EngineKernels {
 public:
  NonEmptyKernels(std::unique_ptr<EngineKernels> inner, std::shared_ptr<std::atomic<int>> empty_calls,
                  std::shared_ptr<KernelCalls> calls = nullptr)
      : in_(std::move(inner)), empty_(std::move(empty_calls)), calls_(std::move(calls)) {}
  void zero(void* p, std::size_t bytes, StreamRole s) override {
    check(bytes, "zero");
    in_->zero(p, bytes, s);
  }
  void to_half(const float* src, void* dst, std::size_t n, cpu_adam::HalfType t, StreamRole s) override {
    check(n, "to_half");
    in_->to_half(src, dst, n, t, s);
  }
  void from_half(const void* src, float* dst, std::size_t n, cpu_adam::HalfType t, StreamRole s) override {
    check(n, "from_half");
    in_->from_half(src, dst, n, t, s);
  }
  void copy(void* dst, const void* src, std::size_t bytes, StreamRole s) override {
    check(bytes, "copy");
    in_->copy(dst, src, bytes, s);
  }
  void add(float* acc, const float* x, std::size_t n, StreamRole s) override {
    check(n, "add");
    in_->add(acc, x, n, s);
  }
  std::vector<std::vector<double>> block_sums(const std::vector<NormInput>& in, StreamRole s) override {
    for (const auto& x : in) check(x.n, "block_sums");
    return in_->block_sums(in, s);
  }
  void adam_update(const cpu_adam::AdamStep& st, const cpu_adam::UpdateChunk& c, StreamRole s) override {
    check(c.n, "adam_update");
    in_->adam_update(st, c, s);
  }
  bool takes_states(cpu_adam::StateFormat f) const override { return in_->takes_states(f); }

 private:
  void check(std::size_t n, const char* what) {
    if (calls_) {
      std::lock_guard<std::mutex> lk(calls_->mu);
      ++calls_->by_name[what];
    }
    if (n) return;
    // The first few by name; the count tells the rest.
    if (empty_->fetch_add(1) < 5) ADD_FAILURE() << "EngineKernels::" << what << " called with nothing to do";
  }
  std::unique_ptr<EngineKernels> in_;
  std::shared_ptr<std::atomic<int>> empty_;
  std::shared_ptr<KernelCalls> calls_;
};

// EngineConfig::kernels that wraps the CPU device's kernels; `empty_calls` counts the empty calls.
// `calls` (optional) counts every call by name.
inline auto non_empty_kernels(std::shared_ptr<std::atomic<int>> empty_calls,
                              std::shared_ptr<KernelCalls> calls = nullptr) {
  return [empty_calls, calls](Device& d, cpu_adam::HostThreads& t) -> std::unique_ptr<EngineKernels> {
    return std::make_unique<NonEmptyKernels>(make_cpu_engine_kernels(d, t), empty_calls, calls);
  };
}

}  // namespace zinf::offload::test
