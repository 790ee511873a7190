// zinf/offload/placement.h — where every byte of the training state lives, before anything runs.
//
// The tier placement of docs/design.md ("States and tiers") as arithmetic: given the layer units' sizes, the
// precision and the two offload devices, it gives each state's bytes per tier (device, pinned host,
// pageable host, NVMe), the fixed-count buffers the dataflow needs, and a verdict against the
// capacities of a machine. The offload engine allocates from the same buffer list the plan sums
// (zinf/offload/buffer_specs.h), so `zinf plan` and a real run agree. Pure functions; thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "zinf/cpu_adam/adam.h"
#include "zinf/gradient_streaming.h"
#include "zinf/types.h"

namespace zinf::offload {

enum class Tier { device = 0, pinned = 1, host = 2, nvme = 3 };
constexpr int kTiers = 4;
const char* tier_name(Tier t);

using TierBytes = std::array<std::uint64_t, kTiers>;

// Data parallelism: rank r's shard of a unit of n elements among `world` ranks. Shards are
// contiguous and in rank order; every boundary is a multiple of kShardAlign elements (the global
// norm's block, so that shards sum their blocks exactly as one rank does), so a small unit may sit
// whole on the first ranks and leave the last ones empty.
constexpr std::uint64_t kShardAlign = std::uint64_t{1} << 16;
struct Shard {
  std::uint64_t lo = 0, hi = 0;
  std::uint64_t len() const { return hi - lo; }
};
Shard shard_of(std::uint64_t n, int world, int rank);

// How the engine overlaps its supernodes: exact streams GradOut/Reduce behind the backward, prefetches
// parameter windows, reads optimizer sub-groups ahead and writes behind; none runs every supernode
// inline, one after another. Both give the same bits.
enum class Overlap { exact, none };

// Every setting that decides where the states live and which buffers the engine has: the one input of
// the layout (buffer_specs.h), the plan and the engine (EngineConfig::plan). Nothing derived from these
// is stored beside them; the layout derives it once.
struct PlanInput {
  std::vector<std::int64_t> unit_params;  // per layer unit, forward order
  std::vector<bool> persistent;           // units kept on the device under param offload (empty: none)
  Precision precision = Precision::fp16;  // of the compute copy: 16-bit (fp16, bf16) or fp32
  int compute_bytes() const { return precision == Precision::fp32 ? 4 : 2; }
  OffloadDevice optimizer = OffloadDevice::none;
  OffloadDevice param = OffloadDevice::none;
  // How Adam's m and v are stored, on whichever tier holds them (the master stays fp32).
  cpu_adam::StateFormat optimizer_states = cpu_adam::StateFormat::fp32;
  std::int64_t grad_accum = 1;
  std::int64_t sub_group_size = 1'000'000'000;
  std::int64_t reduce_bucket_size = 500'000'000;
  int optimizer_buffer_count = 4;      // the swapper's buffers under Overlap::exact (one without overlap)
  int prefetch_depth = 1;              // parameter window: max(2, 1 + prefetch_depth) slots
  // The model's kernels are the reference ones, which compute on fp32 working weights of 16-bit
  // parameters (the fast kernels read the 16-bit compute copy itself).
  bool fp32_work = true;
  std::uint64_t activation_bytes = 0;  // device bytes for one micro batch (the caller's estimate)
  // With activation checkpointing, the checkpointed block inputs (the caller's estimate, beside
  // activation_bytes): on the device, and in pinned host memory (cpu_checkpointing; a pool of the
  // model's own, outside pinned_pool). Allocated by the model, not the engine. 0: no row.
  std::uint64_t checkpoint_device = 0, checkpoint_pinned = 0;
  // The device's allocator takes whole blocks (the CUDA device: cuda_block_bytes, zinf/device_memory.h):
  // every device buffer is counted as the block it takes. False: exact bytes (the CPU device).
  bool device_blocks = false;
  // Device blocks the model's ops allocate for themselves on first use (ops_scratch_blocks): the
  // caller's estimate, each as the ops ask for it; allocated by no one in the engine.
  std::vector<std::uint64_t> ops_scratch{};
  // Tokens per micro batch of the training loop's batch slots (app/train/batches.h: two slots of
  // tokens and targets, int32, each array on pinned pages of its own and in a device buffer of its
  // own); allocated by no one in the engine. 0: none (the engine's own plan).
  std::uint64_t batch_tokens = 0;
  int world = 1, rank = 0;                 // data-parallel ranks, and the rank this plan is for
  int stage = 0;                           // ZeRO stage (partitioning applies with world > 1)
  std::int64_t persistence_threshold = 0;  // stage 3, world > 1: units this small are not partitioned
  // The speculative Update (optimizer off the device, Overlap::exact; docs/offload-engine.md): NVMe
  // keeps two slots per sub-group; host memory keeps a backup of the old states of
  // `speculative_backup` elements (whole sub-groups; 0: half the sub-groups this rank keeps).
  bool speculative = false;
  std::int64_t speculative_backup = 0;
  bool device_grad_accum = false;  // EngineConfig::device_grad_accum
  // The layer-major order of gradient accumulation (GA > 1, the optimizer off the device): every
  // micro batch passes through a unit before the next unit, so each unit's gradient is complete after
  // its micro batches, one after another, and the Reduce sums them in host memory (or a streaming ring
  // slot) unit by unit. The model then keeps GA micro batches' checkpoints (the caller's
  // checkpoint_device / checkpoint_pinned count them) and each unit's weights are asked for once per
  // pass instead of once per micro batch. `head_unit`: the unit whose gradient the tied LM head and the
  // embedding share (its GA micro batches' gradients are open together: GA device buffers); -1: none.
  bool layer_major = false;
  int head_unit = -1;
  // Gradient streaming (docs/offload-engine.md, "Streaming gradients"): the host holds no model-sized
  // gradient; each unit's reduced gradient passes through a ring of pinned buffers to the speculative
  // Update (with `speculative`; the config reader turns it on with streaming unless told not to) and is
  // written to NVMe, from where the Update after the barrier reads what it still needs. Needs the optimizer on NVMe,
  // overlap exact, one rank and, with GA > 1, device_grad_accum or layer_major (streaming_refusal says
  // why not).
  bool gradient_streaming = false;
  // DeepSpeed's pin_memory: false leaves every staging buffer pageable (the pools allocate plain host
  // memory), so the plan counts what would be pinned in the host column (Plan::pinned_pool still
  // sizes the staging pool).
  bool pin_memory = true;
  Overlap overlap = Overlap::exact;
};

struct Row {
  std::string name;   // "param16", "master", "activations", "grad landing (pinned)", …
  std::string dtype;  // "fp16", "fp32", "" for buffers
  TierBytes bytes{};
  std::string note;
};

struct Plan {
  std::int64_t n_params = 0;
  std::int64_t largest_unit = 0;
  std::int64_t largest_windowed = 0;       // the largest unit that moves through the parameter window
  std::int64_t sub_group = 0, bucket = 0;  // effective sub-group and reduce-bucket sizes (elements)
  int window_slots = 0;                    // parameter window slots on the device (param offload)
  std::vector<Row> states;                 // param16, grad16, grad32, master, m, v
  std::vector<Row> buffers;                // activations, device windows, pinned pool parts
  TierBytes model_states{};                // sum of `states`
  TierBytes totals{};                      // states + buffers
  std::uint64_t pinned_pool = 0;           // staging buffers through the one bounded pool (excludes a pinned param16
                                           // home, the token batches' staging and the host activation checkpoints,
                                           // which have pools of their own); pageable with pin_memory false
  bool pinned = true;                      // PlanInput::pin_memory: false moves the pinned column into host
};

// The byte model of the offload engine: the buffer list it allocates from (buffer_specs.h), summed
// into rows, so the plan and a run agree: Engine holds exactly `totals` less `activation_bytes` on
// each tier, and its pinned pool is `pinned_pool`.
Plan make_plan(const PlanInput& in);

struct Capacity {
  std::uint64_t device = 0;    // device memory budget
  std::uint64_t host = 0;      // host memory available
  std::uint64_t pinnable = 0;  // min(RLIMIT_MEMLOCK, host) — what may be page-locked
  std::uint64_t nvme = 0;      // free space at the swap path(s)
  bool nvme_known = false;     // false when no NVMe path is configured or it does not exist
};

struct Verdict {
  bool fits = true;
  std::string limiting;               // the resource closest to running out: "device", "pinned", …
  double limiting_fraction = 0;       // its use / capacity
  std::vector<std::string> problems;  // one line per resource that runs out
};

Verdict judge(const Plan& plan, const Capacity& cap);

// DeepSpeed's published estimator (estimate_zero3_model_states_mem_needs), for comparison:
// returns {cpu bytes, gpu bytes} for one node and one GPU, with its additional_buffer_factor.
struct DeepSpeedEstimate {
  std::uint64_t cpu = 0, gpu = 0;
};
DeepSpeedEstimate deepspeed_zero3_estimate(std::int64_t total_params, std::int64_t largest_layer_params,
                                           bool offload_optimizer, bool offload_param, bool zero_init,
                                           double additional_buffer_factor = 1.5);

}  // namespace zinf::offload
