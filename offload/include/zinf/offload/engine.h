// zinf/offload/engine.h — the offload engine: where every training state lives, how gradients
// leave the device, and how the host Update gets its inputs and puts the parameters back
// (docs/design.md, "States and tiers" and "The step as a dataflow"). Model-agnostic: it sees layer
// units (flat fp32 parameter ranges).
//
// Placement (from the config):
//   offload_optimizer none | cpu | nvme  → master, m, v on the device | in host memory | on NVMe
//                                          (NVMe: one tensor per sub-group holding master|m|v)
//   offload_param     none | cpu | nvme  → the compute copy of the parameters (param16, or fp32 in
//                                          fp32 runs) on the device | pinned host | NVMe; with
//                                          offload, the device holds the persistent units
//                                          (embedding, final LayerNorm) plus a window of block slots
//
// One step is a dataflow of supernodes — Fetch, the model's Forward and Backward, GradOut, Reduce,
// the norm barrier, SwapIn, Update, Upload or the home's write, SwapOut, Land, the checkpoint copies —
// each on one resource (the compute, h2d and d2h streams, the device's Update stream, the Reduce and
// Update workers, the NVMe queues). Which ones a placement has, the resource of each, and the handoff
// that orders every buffer one resource writes and another reads (an event, a host wait, a landing
// version, stream order within one queue) are one object: the step graph of the layout
// (zinf/offload/dataflow.h). `zinf plan --dataflow` prints it; tests/offload/dataflow_test.cpp walks
// it for every placement and fails on an edge between two queues that nothing orders. Each edge
// names the field or call in offload/ that makes its handoff.
//
// Exactness: every placement and both overlap modes run the same float operations on the same
// values in the same per-element order (the Update is elementwise; the norm is summed per unit over
// fixed 64 Ki blocks, units in order), so the parameters are bitwise identical whatever the tiers.
// Overlap::exact streams GradOut/Reduce behind the backward, prefetches parameter windows, reads
// optimizer sub-groups ahead and writes behind, and lets the next forward of unit u start as soon as
// u's update has landed; Overlap::none runs every supernode inline, one after another.
//
// Ordering: "compute" is the model's stream (its ops, when the device runs them as stream work, see
// Device::ops_stream_ordered); "trainer" is the trainer's thread. The host waits only where it
// touches a buffer itself. The step graph's edges are the contract; besides them, within one
// queue: GradOut's device staging buffer is reused in d2h order, and the device gradient sum of
// device_grad_accum is written and read on d2h.
//
// Memory: all device buffers are allocated up front (a plan that does not fit the device budget is
// refused before anything is allocated, with the numbers); host staging comes from one PinnedPool
// whose size is fixed and reported.
//
// Threading: the model-facing calls (weights/done_with/grads/grads_done, begin_*, step) come from one
// thread, the trainer's; the engine runs its own workers. Errors on any worker surface from the next
// model-facing call or step()/synchronize().
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "zinf/comm.h"
#include "zinf/cpu_adam/adam.h"
#include "zinf/device.h"
#include "zinf/nvme/store.h"
#include "zinf/offload/dataflow.h"
#include "zinf/offload/engine_kernels.h"
#include "zinf/offload/placement.h"
#include "zinf/types.h"

namespace zinf::offload {

struct EngineConfig {
  // Where every state lives, the sizes and the overlap (placement.h): the layout, the plan and the
  // engine's buffers all come from this one input. Among its settings:
  //   unit_params, persistent   the layer units in forward order; those always resident on the
  //                             device under param offload
  //   precision, fp32_work      the compute copy's type; the reference kernels' fp32 working weights
  //   optimizer, param          the tiers (offload_optimizer, offload_param)
  //   optimizer_states          how Adam's m and v are stored on the optimizer's tier (fp32, bf16 or
  //                             q8: 8-bit codes with a power-of-two scale per 256 elements)
  //   world, rank, stage        data parallelism: the communicators below must have world ranks, this
  //                             one being rank; the ZeRO stage (0 every rank keeps every state; 1 the
  //                             optimizer states are partitioned; 2 the reduced gradients too; 3 the
  //                             compute copy too, gathered into a window slot ahead of use), with
  //                             persistence_threshold (stage 3: units this small are kept whole)
  //   overlap                   Overlap::exact or none
  //   speculative               the speculative Update (docs/offload-engine.md): with the optimizer
  //                             off the device and overlap exact, each sub-group's Update of the last
  //                             micro batch starts once its gradient is reduced, assuming the step is
  //                             finite and unclipped (Engine::expect_step); a step that turns out
  //                             otherwise is rolled back and redone. Host memory keeps the old states
  //                             of at most speculative_backup elements (0: half).
  //   device_grad_accum         with the optimizer off the device, one rank and grad_accum > 1: the
  //                             micro batches' gradients are summed on the device and leave it once
  //                             per step in fp32 (the same sums in the same order: the same bits)
  //   device_blocks             the device's allocator takes whole blocks (the CUDA device)
  // The engine reads what it derives from these from its Layout, never a second copy.
  PlanInput plan;
  nvme::StoreOptions optimizer_store, param_store;
  int host_threads = 0;      // 0: physical cores
  bool pin_threads = false;  // bind the host workers to cores (hwloc)
  nvme::FaultPlan* optimizer_faults = nullptr;  // tests: fault injection on the optimizer store
  nvme::FaultPlan* gradient_faults = nullptr;   // tests: fault injection on the streamed gradients' store
  // Data parallelism: this rank's communicators (zinf/comm.h), `comm` for host-visible buffers and
  // `device_comm` for device memory (the CPU device: the same one; CUDA: NCCL). Null, or one rank:
  // no communication. The engine takes a dup() of each for every thread that runs collectives; a
  // stream-ordered `device_comm` (NCCL) gets every device collective from the thread that drives the
  // model, in one order on every rank (zinf/offload/collectives.h: CollectiveOrder).
  Comm* comm = nullptr;
  Comm* device_comm = nullptr;
  // The device's kernels for the engine's own work on device memory (required): the backend of the
  // device makes them (zinf/backends/backend.h).
  std::function<std::unique_ptr<EngineKernels>(Device&, cpu_adam::HostThreads&)> kernels;
  // Where the engine records its busy time as spans (zinf/trace.h): the host work on the track of the
  // thread that ran it (its workers are named "Reduce worker" and "Update worker"), each disk's busy
  // intervals. Null: nothing recorded. The device's streams are traced by the device (trace_to).
  Trace* trace = nullptr;
};

struct StepOptions {
  double loss_scale = 1;
  double gradient_clipping = 0;  // 0: off
  cpu_adam::AdamHyper hyper;     // lr already scheduled
  std::int64_t step = 1;         // optimizer step number (bias correction), from 1
};

struct StepOutcome {
  bool finite = true;
  double norm = 0;  // the unscaled global gradient norm (NaN/Inf when not finite)
};

// The speculative Update's counters since the engine was made (tests, diagnostics).
struct SpeculationCounts {
  std::int64_t updated = 0;    // sub-groups updated speculatively
  std::int64_t rollbacks = 0;  // as Engine::rollbacks()
  std::int64_t restored = 0;   // units whose compute copies were rebuilt after a skipped or abandoned step
  std::int64_t landed = 0;     // unit landings (each unit once per applied step; none on a skipped one)
};

class Engine {
 public:
  // `init(u, master)` fills unit u's fp32 master parameters (n floats) once at start.
  using InitFn = std::function<void(std::size_t unit, float* master)>;
  Engine(const EngineConfig& c, Device& dev, const InitFn& init);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Device bytes the engine will allocate for this config (the refusal check uses it).
  static std::size_t device_bytes(const EngineConfig& c);
  // Pinned bytes the engine will take from its pool.
  static std::size_t pinned_bytes(const EngineConfig& c);

  // ---- the model's side (see GptModel's UnitSource) -----------------------------------------------
  // The step the next step() is expected to be (its options, before the clip factor and the overflow
  // are known): what a speculative Update assumes. Called before the step's last forward (with the
  // states on NVMe the speculative SwapIn then reads ahead under it), at the latest before its last
  // backward; without it (or without EngineConfig::speculative) nothing is speculated.
  void expect_step(const StepOptions& o);
  void begin_micro_batch(std::int64_t micro);  // 0 … grad_accum−1
  // The layer-major order (PlanInput::layer_major): the step's micro batches all begin here, before
  // one forward and one backward over the units that take every micro batch through each unit;
  // micro_batch(m) says which micro batch the following grads / grads_done are for.
  void begin_micro_batches();
  void micro_batch(std::int64_t micro);
  void begin_forward();
  void begin_backward();
  // Unit u's weights on the device, valid until done_with(u): weights_precision() elements (fp32
  // working weights, or the fp32/16-bit compute copy itself), u's parameter count of them.
  const void* weights(std::size_t u);
  Precision weights_precision() const;
  void done_with(std::size_t u);
  float* grads(std::size_t u);
  void grads_done(std::size_t u);

  // ---- after the last micro batch ------------------------------------------------------------------
  // Waits for every gradient to be reduced, computes the global norm and, when finite, starts the
  // Update (which lands unit by unit; the next forward waits per unit). Returns before the Update
  // finishes under Overlap::exact.
  StepOutcome step(const StepOptions& o);
  // Waits for the Update in flight, rethrows its error. Between a step's last backward and step(),
  // a speculative Update in flight is abandoned: the states and compute copies are as before the
  // step, with no landing and no collective (so one rank may call it alone, as teardown does).
  void synchronize();
  void read_master(std::size_t u, float* dst);  // synchronizes, then copies unit u's fp32 master
  // Checkpoints: unit u's fp32 master, Adam m and v wherever they live (synchronizes first); and the
  // reverse, which also rebuilds the unit's compute copy in its home. Nothing may run meanwhile.
  // With optimizer states partitioned across ranks (ZeRO stage ≥ 1), read_states and read_master are
  // collective: every rank calls them for the same units in the same order, and each gets whole units.
  void read_states(std::size_t u, float* master, float* m, float* v);
  bool states_partitioned() const;
  void write_states(std::size_t u, const float* master, const float* m, const float* v);

  // Busy seconds per resource since the last call: h2d, d2h (and compute, when the model's ops are
  // stream work) as the device measured them on its streams; host from the engine's workers; NVMe
  // from the stores.
  BusyTimes take_times();
  // The trainer's host time in the model's ops, for a device whose ops run on the host.
  void add_compute_time(double s);
  std::size_t pinned_capacity() const;
  std::size_t pinned_peak() const;
  // What this engine holds on each tier, as the tiers count it: device memory the device handed out,
  // the pinned pool's blocks in use, host memory, NVMe extents reserved in its stores. Every buffer is
  // allocated at construction, so this is what it holds for its whole life — the totals of
  // make_plan(c.plan), which sums the same buffer specs (on a device that hands out what is
  // asked, and NVMe paths with the 4 KiB alignment the plan assumes).
  TierBytes held_bytes() const;
  // Speculative Updates discarded so far (steps that clipped or overflowed after something was
  // updated speculatively); counted when step() gives the verdict, so a step's report has its own.
  // A speculation abandoned (synchronize() mid-step, teardown) is undone but not counted.
  std::int64_t rollbacks() const;
  SpeculationCounts speculation_counts() const;
  std::string describe() const;  // one line: placement, pinned pool, NVMe engine
  // The step of this engine's placement (zinf/offload/dataflow.h). Each stage claims the edges it
  // hands over when it is made (a handoff missing from the graph stops the construction);
  // unclaimed_handoffs lists the graph's engine edges no stage claimed (empty when the graph and the
  // engine agree).
  const StepGraph& dataflow() const;
  std::vector<std::string> unclaimed_handoffs() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zinf::offload
