// ops_stream.cpp — see ops_stream.h.
#include "cpu/ops_stream.h"

#include <utility>

#include "model/ops_forward.h"

namespace zinf {
namespace {

class StreamOps final : public ForwardingOps {
 public:
  StreamOps(Device& dev, std::unique_ptr<OpsBackend> inner) : ForwardingOps(std::move(inner)), dev_(dev) {}
  ~StreamOps() override {
    try {
      dev_.synchronize(StreamRole::compute);  // nothing may still run on the wrapped backend
    } catch (...) {
    }
  }

 protected:
  void run(const OpInfo&, std::function<void()> f) override { dev_.launch(StreamRole::compute, std::move(f)); }

 private:
  Device& dev_;
};

}  // namespace

std::unique_ptr<OpsBackend> make_stream_ops(Device& dev, std::unique_ptr<OpsBackend> inner) {
  return std::make_unique<StreamOps>(dev, std::move(inner));
}

}  // namespace zinf
