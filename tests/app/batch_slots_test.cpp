// batch_slots_test.cpp — the trainer's token and target upload: every copy reads page-locked memory
// registered with the device (a copy from pageable memory blocks the trainer's thread while the
// driver stages it), and under jitter every batch the model reads is the one filled for it (the
// staging ring's events hand each slot over between the host, h2d and compute).
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "app/train/batches.h"
#include "common/forwarding_device.h"
#include "zinf/backends/cpu.h"

namespace zinf {
namespace {

TEST(BatchSlots, UploadFromRegisteredMemoryAndHandEachSlotOverByEvents) {
  for (bool async : {false, true})
    for (std::uint64_t seed : {1, 2, 3}) {
      SCOPED_TRACE(std::string(async ? "async" : "sync") + " seed " + std::to_string(seed));
      CpuDeviceOptions o;
      o.async = async;
      if (async) o.jitter = JitterSpec{seed, 200};
      test::ForwardingDevice dev(make_cpu_device(16 << 20, o));
      const std::size_t n = 3000;  // not a whole number of pages
      const int batches = 24;
      auto seen = std::make_shared<std::vector<std::int64_t>>(batches, -1);
      {
        BatchSlots slots(dev, n);
        for (int i = 0; i < batches; ++i) {
          Batch& b = slots.next([&](int* tok, int* tgt) {
            for (std::size_t j = 0; j < n; ++j) tok[j] = i * 7 + static_cast<int>(j), tgt[j] = i;
          });
          auto read = [seen, i, t = b.tokens(), g = b.targets(), n] {
            std::int64_t s = 0;
            for (std::size_t j = 0; j < n; ++j) s += t[j] + g[j];
            (*seen)[static_cast<std::size_t>(i)] = s;
          };
          if (dev.ops_stream_ordered())
            dev.launch(StreamRole::compute, read);
          else
            read();
          slots.done_with(b);
        }
        dev.synchronize();
      }
      for (int i = 0; i < batches; ++i) {
        const auto N = static_cast<std::int64_t>(n);
        EXPECT_EQ((*seen)[static_cast<std::size_t>(i)], N * (i * 7) + N * (N - 1) / 2 + N * i) << "batch " << i;
      }
      EXPECT_TRUE(dev.unregistered_copies().empty())
          << "copies from unregistered host memory: " << dev.unregistered_copies().begin()->second;
      EXPECT_EQ(dev.in_use(), 0u);
    }
}

}  // namespace
}  // namespace zinf
