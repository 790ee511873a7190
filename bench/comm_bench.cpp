// comm_bench.cpp — `zinf bench comm` (comm_bench.h).
#include "bench/comm_bench.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

#include "zinf/error.h"
#include "zinf/offload/collectives.h"

namespace zinf {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Even parts of n elements, in rank order (the last may be shorter).
std::vector<std::size_t> parts(std::size_t n, int world) {
  std::vector<std::size_t> c(static_cast<std::size_t>(world));
  const std::size_t per = (n + c.size() - 1) / c.size();
  for (std::size_t r = 0, left = n; r < c.size(); ++r) {
    c[r] = std::min(per, left);
    left -= c[r];
  }
  return c;
}

}  // namespace

std::vector<CommBenchRow> bench_comm(Comm& comm, Device& device, offload::EngineKernels& kernels,
                                     const std::vector<std::uint64_t>& sizes, int iters) {
  const int W = comm.size(), R = comm.rank();
  const double share = W > 1 ? static_cast<double>(W - 1) / W : 0.0;
  const StreamRole s = StreamRole::d2h;
  auto run = [&](const std::function<void(void*)>& f) { offload::on_stream(comm, device, s, f); };
  std::vector<CommBenchRow> rows;
  for (std::uint64_t bytes : sizes) {
    const std::size_t n = std::max<std::size_t>(static_cast<std::size_t>(bytes / 4), static_cast<std::size_t>(W));
    const auto counts = parts(n, W);
    const std::size_t mine = counts[static_cast<std::size_t>(R)];
    DeviceBuffer buf(device, n * 4, "bench comm buffer"),
        recv(device, std::max<std::size_t>(1, mine * static_cast<std::size_t>(W)) * 4, "bench comm receive"),
        copy(device, n * 4, "bench comm copy");
    std::vector<float> init(n);
    for (std::size_t i = 0; i < n; ++i)
      init[i] = static_cast<float>((i * 7 + static_cast<std::size_t>(R)) % 1000) * 1e-3f;
    device.copy_to_device(buf.as<void>(), init.data(), n * 4, s);
    device.synchronize(s);
    const std::vector<std::size_t> recv_counts(counts.size(), mine);
    float* b = buf.as<float>();
    float* rv = recv.as<float>();

    auto reduce_scatter = [&] {
      offload::reduce_scatter_ordered(comm, device, kernels, s, b, counts, rv);
    };  // the engine's
    auto all_gather = [&] { run([&](void* st) { comm.allgatherv(b, counts, 4, st); }); };
    struct Op {
      const char* name;
      double factor;  // bus bandwidth / algorithm bandwidth
      std::function<void()> run;
    };
    const std::vector<Op> ops = {
        {"all_gather", share, all_gather},
        {"all_to_all", share, [&] { run([&](void* st) { comm.alltoallv(b, counts, rv, recv_counts, 4, st); }); }},
        {"reduce_scatter", share, reduce_scatter},
        {"all_reduce", 2 * share,
         [&] {
           reduce_scatter();
           all_gather();
         }},
        {"broadcast", 1.0, [&] { run([&](void* st) { comm.broadcast(b, n * 4, 0, st); }); }},
    };
    // The device's own copy rate at this size: the reference the bus bandwidth is read against.
    double t_copy = 1e30;
    for (int i = 0; i < 3; ++i) {
      const auto t0 = Clock::now();
      kernels.copy(copy.as<void>(), b, n * 4, s);
      device.synchronize(s);
      t_copy = std::min(t_copy, seconds_since(t0));
    }
    for (const Op& op : ops) {
      op.run();  // warm-up
      device.synchronize(s);
      comm.barrier();
      const auto t0 = Clock::now();
      for (int i = 0; i < iters; ++i) op.run();
      device.synchronize(s);
      const double mean = seconds_since(t0) / iters;
      const auto all = comm.allgather(&mean, 1);
      CommBenchRow row;
      row.op = op.name;
      row.bytes = n * 4;
      row.seconds = *std::max_element(all.begin(), all.end());
      row.algbw = static_cast<double>(row.bytes) / row.seconds / 1e9;
      row.busbw = row.algbw * op.factor;
      row.copy_gbps = static_cast<double>(row.bytes) / t_copy / 1e9;
      rows.push_back(row);
    }
  }
  return rows;
}

}  // namespace zinf
