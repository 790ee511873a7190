// engine_config_test.cpp — the `aio` section reaches the NVMe engine as documented.
#include <gtest/gtest.h>

#include "app/config/config.h"
#include "app/config/engine_config.h"

namespace zinf {
namespace {

TEST(IoOptions, AioSectionMapsOntoTheEngine) {
  Config c = parse_config(R"({"train_batch_size": 8, "aio": {"block_size": 2097152, "queue_depth": 32,
                              "thread_count": 4, "single_submit": true, "engine": "posix"}})");
  nvme::StoreOptions o = store_options(c.aio, "/mnt/nvme");
  EXPECT_EQ(o.parent, "/mnt/nvme");
  EXPECT_EQ(o.io.block_size, 2u << 20);
  EXPECT_EQ(o.io.queue_depth, 32);
  EXPECT_EQ(o.io.threads, 4);
  EXPECT_TRUE(o.io.single_submit);
  EXPECT_EQ(o.io_kind, nvme::AsyncIoKind::posix);
  EXPECT_EQ(store_options(parse_config(R"({"train_batch_size": 8})").aio, "/x").io_kind, nvme::AsyncIoKind::automatic);
}

}  // namespace
}  // namespace zinf
