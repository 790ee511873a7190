// device_cuda_test.cpp — the CUDA device through the device interface: budgeted allocation, async
// copies on the role streams ordered by events, and a host job's error reaching synchronize().
// Skips with the reason where no GPU is visible.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "zinf/cpu_adam/adam.h"
#include "zinf/cpu_adam/convert.h"
#include "zinf/offload/engine_kernels.h"

#include "cuda/cuda.h"
#include "zinf/backends/gpu.h"
#include "zinf/backends/world.h"
#include "zinf/comm.h"
#include "zinf/device.h"
#if ZINF_CUDA_EXECUTOR
#include "cudax/runtime.h"
#endif
#include "common/child_run.h"
#include "app/config/config.h"
#include "app/train/train.h"

namespace zinf {
namespace {

std::unique_ptr<Device> gpu_or_skip(std::size_t budget, std::string* why) {
  const cuda::GpuQuery q = cuda::query_gpus();
  if (q.gpus.empty()) {
    *why = q.status;
    return nullptr;
  }
  return cuda::make_cuda_device(0, budget);
}

TEST(CudaDevice, CopiesRoundTripAcrossStreamsOrderedByEvents) {
  std::string why;
  auto dev = gpu_or_skip(64 << 20, &why);
  if (!dev) GTEST_SKIP() << "no GPU: " << why;
  std::vector<float> src(1 << 20), dst(1 << 20, 0.0f);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i) * 0.5f;
  dev->register_host(src.data(), src.size() * 4);
  dev->register_host(dst.data(), dst.size() * 4);
  DeviceBuffer d(*dev, src.size() * 4, "roundtrip");
  dev->copy_to_device(d.as<void>(), src.data(), src.size() * 4, StreamRole::h2d);
  auto landed = dev->record(StreamRole::h2d);
  dev->wait_event(StreamRole::d2h, landed);
  dev->copy_to_host(dst.data(), d.as<void>(), dst.size() * 4, StreamRole::d2h);
  dev->synchronize(StreamRole::d2h);
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), src.size() * 4), 0);
  dev->unregister_host(src.data());
  dev->unregister_host(dst.data());
  EXPECT_GE(dev->peak(), src.size() * 4);
}

// The device's context blocks a host thread that waits on the GPU (a stream or device synchronise)
// in the driver instead of spinning on a core beside cpu_adam: the GPU query, which creates the
// context first, and the device both ask for cudaDeviceScheduleBlockingSync.
TEST(CudaDevice, WaitingHostThreadsBlockInsteadOfSpinning) {
  std::string why;
  auto dev = gpu_or_skip(8 << 20, &why);
  if (!dev) GTEST_SKIP() << "no GPU: " << why;
  dev->bind_thread();
  unsigned flags = 0;
  ASSERT_EQ(cudaGetDeviceFlags(&flags), cudaSuccess);
  EXPECT_EQ(flags & cudaDeviceScheduleMask, static_cast<unsigned>(cudaDeviceScheduleBlockingSync)) << flags;
}

TEST(CudaDevice, BudgetAndHostJobErrors) {
  std::string why;
  auto dev = gpu_or_skip(8 << 20, &why);
  if (!dev) GTEST_SKIP() << "no GPU: " << why;
  DeviceBuffer a(*dev, 6 << 20, "a");
  EXPECT_THROW(DeviceBuffer(*dev, 6 << 20, "b"), DeviceMemoryError);
  dev->launch(StreamRole::compute, [] { throw Error("host job failed"); });
  EXPECT_THROW(dev->synchronize(StreamRole::compute), Error);
}

// The engine's kernels: zero-sized calls are no-ops (small units' empty shards), the device's Update
// writes a 16-bit compute copy into registered pinned memory through its device address and an fp32
// one by a copy (both equal to cpu_adam's), unregistered host memory is a clear error, and a worker
// thread that binds itself reaches the same GPU.
TEST(CudaEngineKernels, EmptyCallsPinnedOutputsAndWorkerThreads) {
  std::string why;
  auto dev = gpu_or_skip(64 << 20, &why);
  if (!dev) GTEST_SKIP() << "no GPU: " << why;
  auto k = cuda::make_cuda_engine_kernels(*dev);
  const std::size_t n = 100000;
  DeviceBuffer g(*dev, n * 4, "g"), p(*dev, n * 4, "p"), m(*dev, n * 4, "m"), v(*dev, n * 4, "v");
  const StreamRole r = StreamRole::d2h;
  k->zero(g.as<void>(), 0, r);  // nothing to do: no launch, no error
  k->to_half(g.as<float>(), g.as<void>(), 0, cpu_adam::HalfType::bf16, r);
  k->from_half(g.as<void>(), g.as<float>(), 0, cpu_adam::HalfType::bf16, r);
  k->add(g.as<float>(), g.as<float>(), 0, r);
  k->copy(g.as<void>(), p.as<void>(), 0, r);
  EXPECT_TRUE(k->block_sums({{g.as<void>(), cpu_adam::GradType::fp32, 0}}, r)[0].empty());
  dev->synchronize();

  std::vector<float> grad(n), master(n), zeros(n, 0.0f);
  for (std::size_t i = 0; i < n; ++i) grad[i] = 0.001f * static_cast<float>(i % 97) - 0.04f, master[i] = 0.5f;
  const cpu_adam::AdamStep st = cpu_adam::make_adam_step(cpu_adam::AdamHyper{}, 1);
  // The host's answer.
  std::vector<float> hm = master, hmm(n, 0.0f), hv(n, 0.0f);
  std::vector<std::uint16_t> want16(n);
  cpu_adam::UpdateChunk hc;
  hc.n = n, hc.grad = grad.data(), hc.grad_type = cpu_adam::GradType::fp32;
  hc.master = hm.data(), hc.m = hmm.data(), hc.v = hv.data();
  hc.param16 = want16.data(), hc.param16_type = cpu_adam::HalfType::bf16;
  cpu_adam::adam_update_reference(st, hc);

  std::vector<std::uint16_t> out16(n, 0), unregistered(n);
  std::vector<float> out32(n, 0.0f);
  dev->register_host(out16.data(), n * 2);
  dev->register_host(out32.data(), n * 4);
  std::thread worker([&] {  // as the engine's Update worker does
    dev->bind_thread();
    dev->copy_to_device(g.as<void>(), grad.data(), n * 4, StreamRole::h2d);
    dev->copy_to_device(p.as<void>(), master.data(), n * 4, StreamRole::h2d);
    dev->copy_to_device(m.as<void>(), zeros.data(), n * 4, StreamRole::h2d);
    dev->copy_to_device(v.as<void>(), zeros.data(), n * 4, StreamRole::h2d);
    dev->wait_event(r, dev->record(StreamRole::h2d));
    cpu_adam::UpdateChunk c = hc;
    c.grad = g.as<void>(), c.master = p.as<float>(), c.m = m.as<float>(), c.v = v.as<float>();
    c.param16 = out16.data();
    k->adam_update(st, c, r);
    k->copy(out32.data(), p.as<void>(), n * 4, r);  // the fp32 compute copy's home in pinned memory
    dev->synchronize(r);
    c.param16 = unregistered.data();
    EXPECT_THROW(k->adam_update(st, c, r), Error);
  });
  worker.join();
  EXPECT_EQ(std::memcmp(out16.data(), want16.data(), n * 2), 0);
  EXPECT_EQ(std::memcmp(out32.data(), hm.data(), n * 4), 0);
  dev->unregister_host(out16.data());
  dev->unregister_host(out32.data());
}

// The device Update in every optimizer-state format against cpu_adam's reference, bit for bit:
// master, the 16-bit copy, the stored m and v and (8-bit) their block scales; partial last blocks;
// an Inf gradient turns its 8-bit block into a NaN block on both.
TEST(CudaEngineKernels, UpdateMatchesTheReferenceInEveryStateFormat) {
  std::string why;
  auto dev = gpu_or_skip(256 << 20, &why);
  if (!dev) GTEST_SKIP() << "no GPU: " << why;
  auto k = cuda::make_cuda_engine_kernels(*dev);
  using cpu_adam::StateFormat;
  using cpu_adam::StateKind;
  const cpu_adam::AdamStep st = cpu_adam::make_adam_step(cpu_adam::AdamHyper{.weight_decay = 0.01f}, 10, 1.0f / 1024);
  for (StateFormat f : {StateFormat::fp32, StateFormat::bf16, StateFormat::q8}) {
    for (std::size_t n : {std::size_t{1}, std::size_t{255}, std::size_t{256}, std::size_t{1000}, std::size_t{100037}}) {
      SCOPED_TRACE(::testing::Message() << cpu_adam::state_format_name(f) << " n=" << n);
      const std::size_t eb = cpu_adam::state_elem_bytes(f), ns = cpu_adam::state_scales(f, n);
      std::vector<std::uint16_t> grad(n), out(n, 0), dout(n, 1);
      std::vector<float> master(n), m32(n), v32(n), ms(ns + 1, 0), vs(ns + 1, 0);
      std::vector<std::uint8_t> m(n * eb), v(n * eb);
      for (std::size_t i = 0; i < n; ++i) {
        const float r = static_cast<float>((i * 2654435761u) % 1000003) / 1000003.0f - 0.5f;
        grad[i] = cpu_adam::fp32_to_fp16_reference(i % 5 == 1 ? r * 1e-8f : r * 10.0f);
        master[i] = r * 0.02f;
        m32[i] = i % 5 == 1 ? r * 1e-9f : r * 1e-3f;
        v32[i] = r * r * 1e-6f;
      }
      if (f == StateFormat::q8 && n > 300) grad[300] = 0x7C00;  // +Inf: block 1 becomes a NaN block
      cpu_adam::encode_states(f, StateKind::m, m32.data(), m.data(), ms.data(), n);
      cpu_adam::encode_states(f, StateKind::v, v32.data(), v.data(), vs.data(), n);
      DeviceBuffer dg(*dev, n * 2, "g"), dp(*dev, n * 4, "p"), dm(*dev, n * eb, "m"), dv(*dev, n * eb, "v"),
          dms(*dev, (ns + 1) * 4, "ms"), dvs(*dev, (ns + 1) * 4, "vs"), d16(*dev, n * 2, "out");
      const StreamRole r = StreamRole::d2h;
      dev->copy_to_device(dg.as<void>(), grad.data(), n * 2, r);
      dev->copy_to_device(dp.as<void>(), master.data(), n * 4, r);
      dev->copy_to_device(dm.as<void>(), m.data(), n * eb, r);
      dev->copy_to_device(dv.as<void>(), v.data(), n * eb, r);
      dev->copy_to_device(dms.as<void>(), ms.data(), (ns + 1) * 4, r);
      dev->copy_to_device(dvs.as<void>(), vs.data(), (ns + 1) * 4, r);
      cpu_adam::UpdateChunk c;
      c.n = n, c.grad = grad.data(), c.grad_type = cpu_adam::GradType::fp16, c.master = master.data();
      c.m = m.data(), c.v = v.data(), c.m_scale = ms.data(), c.v_scale = vs.data(), c.states = f;
      c.param16 = out.data(), c.param16_type = cpu_adam::HalfType::bf16;
      cpu_adam::UpdateChunk dc = c;
      dc.grad = dg.as<void>(), dc.master = dp.as<float>(), dc.m = dm.as<void>(), dc.v = dv.as<void>();
      dc.m_scale = dms.as<float>(), dc.v_scale = dvs.as<float>(), dc.param16 = d16.as<void>();
      k->adam_update(st, dc, r);
      cpu_adam::adam_update_reference(st, c);
      std::vector<float> gp(n), gms(ns + 1), gvs(ns + 1);
      std::vector<std::uint8_t> gm(n * eb), gv(n * eb);
      dev->copy_to_host(gp.data(), dp.as<void>(), n * 4, r);
      dev->copy_to_host(dout.data(), d16.as<void>(), n * 2, r);
      dev->copy_to_host(gm.data(), dm.as<void>(), n * eb, r);
      dev->copy_to_host(gv.data(), dv.as<void>(), n * eb, r);
      dev->copy_to_host(gms.data(), dms.as<void>(), (ns + 1) * 4, r);
      dev->copy_to_host(gvs.data(), dvs.as<void>(), (ns + 1) * 4, r);
      dev->synchronize();
      std::size_t bad = 0;
      for (std::size_t i = 0; i < n; ++i)  // a NaN master (the Inf gradient's element) may differ in payload
        bad += !(std::memcmp(&gp[i], &master[i], 4) == 0 || (gp[i] != gp[i] && master[i] != master[i]));
      EXPECT_EQ(bad, 0u) << "master";
      EXPECT_EQ(gm, m);
      EXPECT_EQ(gv, v);
      EXPECT_EQ(std::memcmp(gms.data(), ms.data(), ns * 4), 0);
      EXPECT_EQ(std::memcmp(gvs.data(), vs.data(), ns * 4), 0);
      std::size_t bad16 = 0;
      auto nan16 = [](std::uint16_t h) { return (h & 0x7F80) == 0x7F80 && (h & 0x7F); };  // bf16 NaN
      for (std::size_t i = 0; i < n; ++i) bad16 += dout[i] != out[i] && !(nan16(dout[i]) && nan16(out[i]));
      EXPECT_EQ(bad16, 0u) << "param16";
      if (f == StateFormat::q8 && n > 300) {
        std::uint32_t nan_bits;
        std::memcpy(&nan_bits, &gms[1], 4);
        EXPECT_EQ(nan_bits, 0x7FC00000u);
      }
    }
  }
}

// The GPU query opens a CUDA context on this process's own GPU only: every GPU's static facts come
// without one, the own GPU's free memory is read (on a thread of the query's own, so the caller's
// current device stays), the others' is unknown. On the executor, which records the devices whose
// primary context a call made or used (cudax/runtime.h), with four GPUs and this process's the third.
TEST(GpuQuery, OpensAContextOnTheOwnGpuOnly) {
#if ZINF_CUDA_EXECUTOR
  cudax::set_device_count(4);
  struct Restore {
    ~Restore() { cudax::set_device_count(0); }
  } restore;
  cudax::forget_contexts();
#endif
  const cuda::GpuQuery none = cuda::query_gpus(kNoOwnGpu);
  if (none.gpus.empty()) GTEST_SKIP() << "no GPU: " << none.status;
  for (const GpuInfo& g : none.gpus) {
    EXPECT_FALSE(g.free_known) << "GPU " << g.index;
    EXPECT_EQ(g.free_bytes, 0u) << "GPU " << g.index;
    EXPECT_GT(g.total_bytes, 0u) << "GPU " << g.index;
    EXPECT_FALSE(g.name.empty()) << "GPU " << g.index;
  }
#if ZINF_CUDA_EXECUTOR
  ASSERT_EQ(none.gpus.size(), 4u);
  EXPECT_EQ(cudax::context_devices(), 0u) << "the static facts made a context";
#endif
  const int own = std::min(2, static_cast<int>(none.gpus.size()) - 1);
  int before = -1, after = -1;
  ASSERT_EQ(cudaGetDevice(&before), cudaSuccess);
  const cuda::GpuQuery q = cuda::query_gpus(own);
  ASSERT_EQ(cudaGetDevice(&after), cudaSuccess);
  EXPECT_EQ(after, before) << "the query changed the calling thread's current device";
  ASSERT_EQ(q.gpus.size(), none.gpus.size());
  for (std::size_t i = 0; i < q.gpus.size(); ++i) {
    const GpuInfo& g = q.gpus[i];
    EXPECT_EQ(g.free_known, g.index == own) << "GPU " << g.index;
    if (g.index == own) {
      EXPECT_GT(g.free_bytes, 0u);
      EXPECT_LE(g.free_bytes, g.total_bytes);
    } else {
      EXPECT_EQ(g.free_bytes, 0u) << "GPU " << g.index;
    }
    EXPECT_EQ(g.name, none.gpus[i].name);  // the static facts, as without an own GPU
    EXPECT_EQ(g.total_bytes, none.gpus[i].total_bytes);
    EXPECT_EQ(g.pci_bus_id, none.gpus[i].pci_bus_id);
  }
#if ZINF_CUDA_EXECUTOR
  EXPECT_EQ(cudax::context_devices(), std::uint64_t{1} << own);
  // The same from the machine query behind `zinf info` and `zinf plan`.
  cudax::forget_contexts();
  const MachineInfo m = query_machine(own);
  EXPECT_EQ(m.own_gpu, own);
  ASSERT_NE(own_gpu_info(m), nullptr);
  EXPECT_TRUE(own_gpu_info(m)->free_known);
  EXPECT_EQ(cudax::context_devices(), std::uint64_t{1} << own);
  // And the CUDA device of that rank: its context, its memory and its streams, on its GPU alone.
  cudax::forget_contexts();
  {
    auto dev = cuda::make_cuda_device(own, 0);
    DeviceBuffer b(*dev, 1 << 20, "own GPU");
    dev->synchronize(StreamRole::compute);
  }
  EXPECT_EQ(cudax::context_devices(), std::uint64_t{1} << own);
#endif
}

TEST(CudaDevice, WithoutAGpuMakingOneIsAClearError) {
  const cuda::GpuQuery q = cuda::query_gpus();
  if (!q.gpus.empty()) GTEST_SKIP() << "a GPU is visible";
  EXPECT_THROW(cuda::make_cuda_device(0, 0), Error);
}

// The NCCL communicator with one rank (all a single-GPU machine can run): every collective on
// device memory, enqueued on a device stream, moves the data where zinf/comm.h says.
TEST(Nccl, OneRankCollectivesOnDeviceMemory) {
  std::string why;
  auto dev = gpu_or_skip(64 << 20, &why);
  if (!dev) GTEST_SKIP() << "no GPU: " << why;
  auto host = make_solo_comm();
  auto nccl = cuda::make_nccl_comm(*host, 0);
  EXPECT_EQ(nccl->backend(), "nccl");
  EXPECT_TRUE(nccl->stream_ordered());
  const std::size_t n = 1 << 16;
  std::vector<float> src(n), back(n, 0.0f);
  for (std::size_t i = 0; i < n; ++i) src[i] = static_cast<float>(i) * 0.25f;
  DeviceBuffer a(*dev, n * 4, "nccl a"), b(*dev, n * 4, "nccl b");
  void* st = dev->native_stream(StreamRole::d2h);
  dev->copy_to_device(a.as<void>(), src.data(), n * 4, StreamRole::d2h);
  nccl->alltoallv(a.as<void>(), {n}, b.as<void>(), {n}, 4, st);  // to itself
  nccl->allgatherv(b.as<void>(), a.as<void>(), {n}, 4, st);      // from a separate part
  nccl->allgatherv(a.as<void>(), {n}, 4, st);                    // in place
  nccl->broadcast(a.as<void>(), n * 4, 0, st);
  dev->copy_to_host(back.data(), a.as<void>(), n * 4, StreamRole::d2h);
  dev->synchronize(StreamRole::d2h);
  EXPECT_EQ(std::memcmp(src.data(), back.data(), n * 4), 0);
  auto twin = nccl->dup();
  EXPECT_EQ(twin->size(), 1);
}

#if ZINF_CUDA_EXECUTOR
// What a steady training step asks of the CUDA runtime, counted by the executor between the
// progress lines of steps 3 to 6: a step that allocates device or pinned memory, drains the device,
// or copies through pageable memory (a staged copy, synchronous on a GPU) loses the GPU's time to the
// host. For each placement the offload engine has on a GPU, with both kernel sets.
TEST(CudaDeviceSteps, ASteadyStepAllocatesNothingAndNeverDrainsTheDevice) {
  std::string why;
  if (!gpu_or_skip(8 << 20, &why)) GTEST_SKIP() << "no GPU: " << why;
  const std::string json = R"({"model": {"n_layer": 2, "n_head": 2, "d_model": 32, "vocab_size": 256, "seq_len": 32},
      "train": {"steps": 6, "eval_interval": 0, "eval_batches": 2, "seed": 7},
      "device": {"type": "cuda", "memory_budget": "1GiB"}, "bf16": {"enabled": true},
      "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "steps_per_print": 1,
      "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}}, "gradient_clipping": 1.0})";
  struct Placement {
    const char* name;
    std::vector<std::string> set;
  };
  const std::vector<Placement> placements = {
      {"resident", {"zero_optimization.stage=0"}},
      {"optimizer on the cpu", {"zero_optimization.stage=2", "zero_optimization.offload_optimizer.device=cpu"}},
      {"optimizer and parameters on the cpu",
       {"zero_optimization.stage=3", "zero_optimization.offload_optimizer.device=cpu",
        "zero_optimization.offload_param.device=cpu"}},
  };
  for (const char* kernels : {"reference", "fast"}) {
    for (const Placement& pl : placements) {
      SCOPED_TRACE(std::string(pl.name) + ", " + kernels + " kernels");
      std::vector<std::string> set = pl.set;
      set.push_back(std::string("device.kernels=\"") + kernels + "\"");
      std::vector<cudax::ApiCounts> at;  // after each step's progress line
      TrainHooks hooks;
      hooks.log = [&](const std::string& line) {
        if (line.rfind("step ", 0) == 0 && line.find(" | loss ") != std::string::npos) at.push_back(cudax::api_counts());
      };
      train(parse_config(json, set), hooks);
      ASSERT_EQ(at.size(), 6u);
      const cudax::ApiCounts& a = at[2];
      const cudax::ApiCounts& b = at[5];
      SCOPED_TRACE("over steps 4-6: " + std::to_string(b.launches - a.launches) + " launches, " +
                   std::to_string(b.stream_syncs - a.stream_syncs) + " stream and " +
                   std::to_string(b.event_syncs - a.event_syncs) + " event synchronisations (host threads waiting)");
      EXPECT_GT(b.launches, a.launches) << "the steps ran kernels";
      EXPECT_EQ(b.device_allocs, a.device_allocs) << "cudaMalloc in a steady step";
      EXPECT_EQ(b.device_frees, a.device_frees) << "cudaFree in a steady step";
      EXPECT_EQ(b.pinned_allocs, a.pinned_allocs) << "pinned memory allocated or registered in a steady step";
      EXPECT_EQ(b.device_syncs, a.device_syncs) << "cudaDeviceSynchronize in a steady step";
      EXPECT_EQ(b.blocking_copies, a.blocking_copies) << "cudaMemcpy in a steady step";
      // At most the norm's partial sums, read back once a step when the optimizer is on the device.
      EXPECT_LE(b.pageable_copies - a.pageable_copies, 3u) << "copies through pageable memory in a steady step";
    }
  }
}
#endif

#if ZINF_CUDA_EXECUTOR && defined(__SANITIZE_ADDRESS__)
// On the executor under AddressSanitizer the caching allocator marks what no work may touch: a
// block's bytes past the request (the allocator rounds 100 bytes up to 512, where a GPU's memcheck
// sees nothing wrong) and a freed block waiting in the cache. Each case runs in a child process,
// whose report the parent reads.
TEST(CudaDeviceAsan, ACopyPastABuffersEndIsReported) {
  std::string why;
  auto dev = gpu_or_skip(8 << 20, &why);
  if (!dev) GTEST_SKIP() << "no GPU: " << why;
  if (std::getenv("ZINF_ASAN_CHILD")) {
    std::vector<unsigned char> src(104, 7);
    DeviceBuffer d(*dev, 100, "one hundred bytes");
    dev->copy_to_device(d.as<void>(), src.data(), src.size(), StreamRole::h2d);
    dev->synchronize(StreamRole::h2d);
    return;
  }
  const std::string out =
      testing_support::run_in_child("ZINF_ASAN_CHILD=1 ASAN_OPTIONS=detect_leaks=0", "CudaDeviceAsan.ACopyPast*");
  EXPECT_NE(out.find("AddressSanitizer: use-after-poison"), std::string::npos) << out;
}

TEST(CudaDeviceAsan, WorkStillQueuedOnAFreedBufferIsReported) {
  std::string why;
  auto dev = gpu_or_skip(8 << 20, &why);
  if (!dev) GTEST_SKIP() << "no GPU: " << why;
  if (std::getenv("ZINF_ASAN_CHILD")) {
    std::vector<float> src(1024, 1.0f);
    dev->register_host(src.data(), src.size() * 4);
    std::atomic<bool> go{false};
    {
      DeviceBuffer d(*dev, src.size() * 4, "freed too early");
      dev->launch(StreamRole::h2d, [&go] {
        while (!go.load()) std::this_thread::yield();
      });
      dev->copy_to_device(d.as<void>(), src.data(), src.size() * 4, StreamRole::h2d);
    }  // freed while the copy into it is still queued: the block may be handed out again at once
    go.store(true);
    dev->synchronize(StreamRole::h2d);
    dev->unregister_host(src.data());
    return;
  }
  const std::string out =
      testing_support::run_in_child("ZINF_ASAN_CHILD=1 ASAN_OPTIONS=detect_leaks=0", "CudaDeviceAsan.WorkStillQueued*");
  EXPECT_NE(out.find("AddressSanitizer: use-after-poison"), std::string::npos) << out;
}

TEST(CudaDeviceAsan, ABufferUsedWithinItsSizeAndLifeIsQuiet) {
  std::string why;
  auto dev = gpu_or_skip(8 << 20, &why);
  if (!dev) GTEST_SKIP() << "no GPU: " << why;
  std::vector<unsigned char> src(100, 7), back(100, 0);
  for (int round = 0; round < 2; ++round) {  // the second round takes the cached block again
    DeviceBuffer d(*dev, 100, "one hundred bytes");
    dev->copy_to_device(d.as<void>(), src.data(), src.size(), StreamRole::h2d);
    dev->copy_to_host(back.data(), d.as<void>(), back.size(), StreamRole::h2d);
    dev->synchronize(StreamRole::h2d);
    EXPECT_EQ(back, src);
  }
}
#endif

}  // namespace
}  // namespace zinf
