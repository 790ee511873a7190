// ops_forward.h — a backend that wraps another: every op of the wrapped backend is handed to run()
// as a closure, with what it is (its kind, its floating-point work, a GEMM's sizes). The stream
// wrapper (ops_stream.h) enqueues the closure on the compute stream; the profiler (ops_profile.h)
// times it. The math is always the wrapped backend's, so results are bit-identical to calling it.
#pragma once

#include <functional>
#include <memory>
#include <utility>

#include "model/backend.h"

namespace zinf {

// OpKind and OpInfo: model/op_list.h, where each op's info is written.
class ForwardingOps : public OpsBackend {
 public:
  explicit ForwardingOps(std::unique_ptr<OpsBackend> inner) : in_(std::move(inner)) {}

  // Every op of model/op_list.h (defined in ops_forward.cpp).
#define ZINF_FORWARD_OP(name, info, params, args) void name params override;
  ZINF_OPS(ZINF_FORWARD_OP)
#undef ZINF_FORWARD_OP
  DType storage_dtype() const override { return in_->storage_dtype(); }
  std::size_t attention_state_elems(int B, int H, int T) const override { return in_->attention_state_elems(B, H, T); }
  LogitsRows logits_rows() const override { return in_->logits_rows(); }

 protected:
  // Runs (or enqueues) one op of the wrapped backend.
  virtual void run(const OpInfo& op, std::function<void()> f) = 0;
  OpsBackend& inner() { return *in_; }

 private:
  std::unique_ptr<OpsBackend> in_;
};

}  // namespace zinf
