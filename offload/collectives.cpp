// collectives.cpp — see zinf/offload/collectives.h.
#include "zinf/offload/collectives.h"

namespace zinf::offload {

void on_stream(Comm& comm, Device& dev, StreamRole s, const std::function<void(void*)>& f) {
  if (comm.stream_ordered()) {
    f(dev.native_stream(s));
  } else {
    dev.synchronize(s);
    f(nullptr);
  }
}

void CollectiveOrder::run(Comm& comm, Device& dev, StreamRole s, const std::function<void(void*)>& f) {
  if (!comm.stream_ordered()) return on_stream(comm, dev, s, f);
  std::lock_guard<std::mutex> lk(mu_);
  if (last_ && last_role_ != s)
    dev.wait_event(s, last_);  // the previous collective has finished (same stream: in order already)
  f(dev.native_stream(s));
  last_ = dev.record(s);
  last_role_ = s;
}

void reduce_scatter_ordered(Comm& comm, Device& dev, EngineKernels& kern, StreamRole s, float* g,
                            const std::vector<std::size_t>& counts, float* recv, CollectiveOrder* order) {
  const auto me = static_cast<std::size_t>(comm.rank());
  const std::size_t mine = counts[me];
  std::size_t first = 0;  // this rank's part within g
  for (std::size_t r = 0; r < me; ++r) first += counts[r];
  const std::vector<std::size_t> recv_counts(counts.size(), mine);
  const auto a2a = [&](void* st) { comm.alltoallv(g, counts, recv, recv_counts, 4, st); };
  if (order)
    order->run(comm, dev, s, a2a);
  else
    on_stream(comm, dev, s, a2a);
  if (!mine) return;
  kern.copy(g + first, recv, mine * 4, s);
  for (std::size_t k = 1; k < counts.size(); ++k) kern.add(g + first, recv + k * mine, mine, s);
}

}  // namespace zinf::offload
