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

void reduce_scatter_ordered(Comm& comm, Device& dev, DeviceKernels& kern, StreamRole s, float* g, const std::vector<std::size_t>& counts,
                            float* recv) {
  const auto me = static_cast<std::size_t>(comm.rank());
  const std::size_t mine = counts[me];
  std::size_t first = 0;  // this rank's part within g
  for (std::size_t r = 0; r < me; ++r) first += counts[r];
  const std::vector<std::size_t> recv_counts(counts.size(), mine);
  on_stream(comm, dev, s, [&](void* st) { comm.alltoallv(g, counts, recv, recv_counts, 4, st); });
  if (!mine) return;
  kern.copy(g + first, recv, mine * 4, s);
  for (std::size_t k = 1; k < counts.size(); ++k) kern.add(g + first, recv + k * mine, mine, s);
}

}  // namespace zinf::offload
