// engine_config_test.cpp — what of the config reaches the engine: the `aio` section, pin_memory, device_grad_accumulation.
#include <gtest/gtest.h>

#include <string>
#include <tuple>

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
// device_grad_accumulation: on in the engine where asked for; refused with the optimizer on the device
// or with several ranks (each micro batch is reduced across them), a note where GA is 1.
TEST(DeviceGradAccumulation, ReachesTheEngineAndIsRefusedWhereItCannotApply) {
  auto cfg = [](const char* opt, int ga, int world = 1) {
    return parse_config(std::string(R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": )") +
                            std::to_string(ga) + R"(, "model": {"preset": "gpt2-124m"}, "zero_optimization": {"stage": 2,
        "offload_optimizer": {"device": ")" + opt + R"(", "nvme_path": "/tmp", "device_grad_accumulation": true}}})",
                        {}, "<string>", world);
  };
  const Config on = cfg("cpu", 4);
  EXPECT_TRUE(on.zero.offload_optimizer.device_grad_accumulation);
  EXPECT_TRUE(engine_config(on, 1).plan.device_grad_accum);
  EXPECT_TRUE(on.notes.empty() || on.notes[0].find("device_grad_accumulation") == std::string::npos);
  bool noted = false;
  for (const auto& n : cfg("nvme", 1).notes) noted |= n.find("device_grad_accumulation: no effect") != std::string::npos;
  EXPECT_TRUE(noted);
  for (auto [opt, world, why] : {std::tuple{"none", 1, "needs the optimizer off the device"},
                                 std::tuple{"cpu", 2, "takes one rank (this job has 2)"}}) {
    try {
      cfg(opt, 4, world);
      ADD_FAILURE() << opt << " " << world << ": accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("zero_optimization.offload_optimizer.device_grad_accumulation"),
                std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  }
  EXPECT_FALSE(engine_config(parse_config(R"({"train_batch_size": 8})"), 1).plan.device_grad_accum);
}

// pin_memory false in either offload section leaves the staging pageable — but for the optimizer on
// the device with the parameters offloaded, whose Update writes their host homes through mapped
// memory: that stays page-locked, and the config says so.
TEST(PinMemory, FalseIsHonouredWhereNothingNeedsMappedMemory) {
  auto cfg = [](const char* opt, const char* param, const char* which) {
    return parse_config(std::string(R"({"train_batch_size": 8, "model": {"preset": "gpt2-124m"},
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": ")") + opt +
                        R"(", "nvme_path": "/tmp"}, "offload_param": {"device": ")" + param + R"("}}})",
                        {std::string("zero_optimization.") + which + ".pin_memory=false"});
  };
  for (const char* which : {"offload_optimizer", "offload_param"}) {
    SCOPED_TRACE(which);
    for (const char* opt : {"cpu", "nvme"})
      for (const char* param : {"none", "cpu"}) {
        const Config c = cfg(opt, param, which);
        EXPECT_FALSE(pin_memory(c)) << opt << " " << param;
        EXPECT_FALSE(engine_config(c, 1).plan.pin_memory);
        for (const auto& n : c.notes) EXPECT_EQ(n.find("pin_memory"), std::string::npos) << n;
      }
    const Config mapped = cfg("none", "cpu", which);
    EXPECT_TRUE(pin_memory(mapped));
    bool noted = false;
    for (const auto& n : mapped.notes)
      noted |= n.find(std::string("zero_optimization.") + which + ".pin_memory: false is not honoured") !=
               std::string::npos;
    EXPECT_TRUE(noted);
  }
  EXPECT_TRUE(pin_memory(cfg("none", "none", "offload_optimizer")) == false);  // nothing offloaded: nothing pinned
}

}  // namespace zinf
