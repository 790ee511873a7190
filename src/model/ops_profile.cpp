// ops_profile.cpp — see ops_profile.h.
#include "model/ops_profile.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "model/ops_forward.h"

namespace zinf {
namespace {

class Profile final : public OpProfile {
 public:
  explicit Profile(Device& dev) : dev_(dev) {}

  void add_host(const std::string& name, double flops, double seconds) {
    std::lock_guard<std::mutex> lk(mu_);
    auto& t = sums_[name];
    t.calls++, t.flops += flops, t.seconds += seconds;
  }
  void add_pending(std::string name, double flops, EventHandle a, EventHandle b) {
    std::lock_guard<std::mutex> lk(mu_);
    pending_.push_back({std::move(name), flops, std::move(a), std::move(b)});
  }
  std::vector<OpTime> take() override {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& p : pending_) {
      auto& t = sums_[p.name];
      t.calls++, t.flops += p.flops, t.seconds += dev_.elapsed_seconds(p.a, p.b);
    }
    pending_.clear();
    std::vector<OpTime> out;
    for (auto& [name, t] : sums_) {
      OpTime o = t;
      o.name = name;
      out.push_back(o);
    }
    sums_.clear();
    std::sort(out.begin(), out.end(), [](const OpTime& x, const OpTime& y) { return x.seconds > y.seconds; });
    return out;
  }

 private:
  struct Pending {
    std::string name;
    double flops;
    EventHandle a, b;
  };
  Device& dev_;
  std::mutex mu_;
  std::map<std::string, OpTime> sums_;
  std::vector<Pending> pending_;
};

class ProfileOps final : public ForwardingOps {
 public:
  ProfileOps(Device& dev, const ModelShape& shape, std::unique_ptr<OpsBackend> inner, std::shared_ptr<Profile> p)
      : ForwardingOps(std::move(inner)), dev_(dev), shape_(shape), profile_(std::move(p)) {}

 protected:
  void run(const OpInfo& op, std::function<void()> f) override {
    if (!profile_->active()) {
      f();
      return;
    }
    const std::string name = label(op);
    if (!dev_.ops_stream_ordered()) {  // the op runs inside the call
      const auto t0 = std::chrono::steady_clock::now();
      f();
      profile_->add_host(name, op.flops, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      return;
    }
    EventHandle a = dev_.record_timed(StreamRole::compute);
    f();  // enqueues on the compute stream
    profile_->add_pending(name, op.flops, std::move(a), dev_.record_timed(StreamRole::compute));
  }

 private:
  std::string label(const OpInfo& op) const {
    const int C = shape_.d_model, F = shape_.d_ff > 0 ? shape_.d_ff : 4 * C, KV = shape_.kv_heads() * shape_.head_dim();
    switch (op.kind) {
      case OpKind::gemm:
        if (op.in == C && op.out == 3 * C) return "gemm qkv";
        if (op.in == C && op.out == C) return "gemm attn proj";
        if (op.in == C && op.out == KV) return "gemm kv";
        if (op.in == C && op.out == F) return "gemm mlp up";
        if (op.in == F && op.out == C) return "gemm mlp down";
        return "gemm other";
      case OpKind::attention: return "attention";
      case OpKind::norm: return "norm";
      case OpKind::elementwise: return "elementwise";
      case OpKind::embedding: return "embedding";
      case OpKind::lm_head: return "lm head";
      case OpKind::copy: return "copies";
    }
    return "other";
  }
  Device& dev_;
  ModelShape shape_;
  std::shared_ptr<Profile> profile_;
};

}  // namespace

std::unique_ptr<OpsBackend> make_profile_ops(Device& dev, const ModelShape& shape, std::unique_ptr<OpsBackend> inner,
                                             std::shared_ptr<OpProfile>* profile) {
  auto p = std::make_shared<Profile>(dev);
  *profile = p;
  return std::make_unique<ProfileOps>(dev, shape, std::move(inner), std::move(p));
}

}  // namespace zinf
