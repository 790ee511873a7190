// device_choice_test.cpp — device.type resolved in one place (app/config/device_choice.h): auto with
// and without a visible GPU, cpu and cuda as given, and `zinf plan` and `zinf train` agreeing on the
// device and its budget for the same config on the same machine.
#include <gtest/gtest.h>

#include "app/config/config.h"
#include "app/config/device_choice.h"
#include "app/config/engine_config.h"
#include "app/plan/plan.h"
#include "zinf/device_memory.h"
#include "zinf/error.h"

namespace zinf {
namespace {

GpuInfo gpu(int index, std::uint64_t total, std::uint64_t free, bool own) {
  GpuInfo g;
  g.index = index;
  g.name = "test GPU " + std::to_string(index);
  g.total_bytes = total;
  g.free_bytes = own ? free : 0;
  g.free_known = own;
  return g;
}

// A machine with `host` bytes available and GPUs of 80 GiB, this process's being `own`.
MachineInfo machine(std::uint64_t host, int gpus, int own) {
  MachineInfo m;
  m.mem_total = m.mem_available = host;
  m.memlock_soft = m.memlock_hard = ~0ull;
  for (int i = 0; i < gpus; ++i) m.gpus.push_back(gpu(i, 80ull << 30, (70ull - i) << 30, i == own));
  m.own_gpu = own < gpus ? own : kNoOwnGpu;
  m.gpu_status = std::to_string(gpus) + " GPUs";
  return m;
}

const std::vector<GpuInfo> kNoGpus;
const std::vector<GpuInfo> kOneGpu = {gpu(0, 80ull << 30, 70ull << 30, true)};

TEST(DeviceChoice, AutoIsTheCpuDeviceWithOrWithoutAVisibleGpu) {
  const DeviceChoice none = resolve_device_type(DeviceType::automatic, kNoGpus);
  EXPECT_EQ(none.type, DeviceType::cpu);
  EXPECT_EQ(none.reason, "auto: no GPU visible");
  const DeviceChoice one = resolve_device_type(DeviceType::automatic, kOneGpu);
  EXPECT_EQ(one.type, DeviceType::cpu);  // the CUDA path is chosen only by device.type cuda at this version
  EXPECT_NE(one.reason.find("1 GPU visible"), std::string::npos) << one.reason;
  EXPECT_NE(one.reason.find("device.type cuda"), std::string::npos) << one.reason;
}

TEST(DeviceChoice, CpuAndCudaAreTakenAsGiven) {
  for (const auto* gpus : {&kNoGpus, &kOneGpu}) {
    EXPECT_EQ(resolve_device_type(DeviceType::cpu, *gpus).type, DeviceType::cpu);
    EXPECT_EQ(resolve_device_type(DeviceType::cuda, *gpus).type, DeviceType::cuda);  // no GPU: the device says so
    EXPECT_EQ(resolve_device_type(DeviceType::cuda, *gpus).reason, "as configured");
  }
  // Asking this machine needs no query for an explicit type, and never answers auto.
  EXPECT_EQ(resolve_device_type(DeviceType::cuda).type, DeviceType::cuda);
  EXPECT_NE(resolve_device_type(DeviceType::automatic).type, DeviceType::automatic);
}

TEST(DeviceChoice, ResolveDeviceFillsTheConfigOnceAndChecksWhatDependsOnIt) {
  Config c = parse_config(R"({"train_batch_size": 4})");
  ASSERT_EQ(c.device.type, DeviceType::automatic);
  const std::string resolved_json = c.resolved_json;
  resolve_device(c, kOneGpu);
  EXPECT_EQ(c.device.type, DeviceType::cpu);
  EXPECT_EQ(c.device.type_reason, resolve_device_type(DeviceType::automatic, kOneGpu).reason);
  EXPECT_EQ(c.resolved_json, resolved_json);  // what the user asked for, as checkpoints and ranks compare it
  EXPECT_EQ(run_device_type(c), DeviceType::cpu);
  EXPECT_EQ(describe_device(c), "cpu (" + c.device.type_reason + ")");
  resolve_device(c, kNoGpus);  // resolved already: kept
  EXPECT_EQ(c.device.type_reason, resolve_device_type(DeviceType::automatic, kOneGpu).reason);

  Config cuda = parse_config(R"({"train_batch_size": 4, "device": {"type": "cuda"}})");
  resolve_device(cuda, kNoGpus);
  EXPECT_EQ(cuda.device.type, DeviceType::cuda);
  EXPECT_EQ(describe_device(cuda), "cuda (as configured)");

  // device.comm nccl moves CUDA memory: with auto on the CPU device, one error saying why.
  Config nccl = parse_config(R"({"train_batch_size": 4, "device": {"comm": "nccl"}})");
  try {
    resolve_device(nccl, kOneGpu);
    FAIL() << "auto + nccl resolved to the CPU device was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("device.comm nccl"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("device.type auto is the CPU device"), std::string::npos) << e.what();
  }
  // So does a CUDA attention: it would be ignored on the CPU device, and it changes results.
  Config att = parse_config(R"({"train_batch_size": 4, "device": {"kernels": "fast", "attention": "cudnn"}})");
  try {
    resolve_device(att, kOneGpu);
    FAIL() << "auto + device.attention cudnn resolved to the CPU device was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("device.attention cudnn runs on the CUDA device only"), std::string::npos)
        << e.what();
  }
}

// For the same config on the same machine, `zinf plan` (plan_run) and `zinf train` (which resolves
// device.type with resolve_device, then makes the engine from engine_config and the device with the
// budget the plan states) pick the same device and the same budget.
TEST(DeviceChoice, PlanAndTrainPickTheSameDeviceAndBudget) {
  const std::string body = R"("train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
      "model": {"n_layer": 2, "n_head": 4, "d_model": 64, "vocab_size": 256, "seq_len": 32},
      "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}})";
  const std::uint64_t host = 64ull << 30;
  for (const char* type : {"auto", "cpu", "cuda"}) {
    for (const MachineInfo& m : {machine(host, 0, 0), machine(host, 1, 0), machine(host, 4, 2)}) {
      SCOPED_TRACE(std::string(type) + ", " + std::to_string(m.gpus.size()) + " GPU(s)");
      const Config c = parse_config(std::string(R"({"device": {"type": ")") + type + R"("}, )" + body + "}");
      const RunPlan plan = plan_run(c, m);
      Config run = c;  // as train() and the commands resolve it
      resolve_device(run, m.gpus);
      EXPECT_EQ(plan.device.type, run.device.type);
      EXPECT_EQ(plan.device.reason, run.device.type_reason);
      EXPECT_EQ(plan.device.type, std::string(type) == "cuda" ? DeviceType::cuda : DeviceType::cpu);
      // The engine train builds plans device memory as the plan does (allocator blocks on CUDA).
      EXPECT_EQ(engine_config(run, 1).plan.device_blocks, run.device.type == DeviceType::cuda);
      EXPECT_EQ(make_plan_input(run, plan.shape).device_blocks, engine_config(run, 1).plan.device_blocks);
      // The budget the device takes: on CUDA the free memory of this process's GPU (GPU 2 of 4: its
      // own, not GPU 0) less the reserve, as the CUDA device computes it; on the CPU device half the
      // host's memory, as the CPU backend takes it. A plan for the GPU while train runs on the CPU
      // (or the reverse) fails here.
      const GpuInfo* own = own_gpu_info(m);
      const std::uint64_t expected = run.device.type == DeviceType::cpu ? host / 2
                                     : own ? cuda_auto_budget(own->free_bytes, own->total_bytes)
                                           : 0;
      EXPECT_EQ(plan.capacity.device, expected);
      if (run.device.type == DeviceType::cuda && m.gpus.size() == 4) {
        EXPECT_EQ(expected, cuda_auto_budget(68ull << 30, 80ull << 30));  // GPU 2's free memory
      }
    }
  }
}

}  // namespace
}  // namespace zinf
