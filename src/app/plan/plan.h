// plan.h — `zinf plan`: the model's training state placed on this machine's tiers.
//
// Joins the config (model shape, precision, ZeRO offload settings) with the machine (device budget,
// host memory, memlock limit, NVMe free space) through offload::make_plan, and answers: where does
// every byte live, does it fit, what runs out first, and how large a model of the same shape would fit
// under each offload setting.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "app/config/config.h"
#include "app/config/device_choice.h"
#include "model/shape.h"
#include "zinf/offload/placement.h"
#include "zinf/backends/sysinfo.h"

namespace zinf {

// Activation memory for one micro batch of B sequences of length T on the device, in bytes.
// Reference kernels: without checkpointing each block keeps T·B·C·(34 + 5·H·T/C) two-byte units
// (Korthikanti et al. 2022), scaled to the compute dtype; with it, each block keeps its input and one
// block is recomputed at a time. The logits (B·T·V, compute dtype) and their fp32 gradient are added
// in both cases.
// Fast kernels (device.kernels: fast) store activations in the run's precision (`compute_bytes`):
// each block keeps 17·T·B·C stored elements (34 two-byte units), its norms' statistics in fp32
// (4·B·T floats) and the attention state as one fp32 log-sum-exp per row and head (B·H·T floats,
// not B·H·T·T); the head keeps probs and dlogits in the storage dtype and the row losses in fp32. On
// the CUDA device (`device`) their rows are V rounded up to a multiple of 64 elements apart
// (model/backend.h, logits_rows_of): the padded bytes are counted.
std::uint64_t estimate_activation_bytes(const ModelShape& s, std::int64_t micro_batch, int compute_bytes,
                                        bool checkpointing, Kernels kernels = Kernels::reference,
                                        DeviceType device = DeviceType::cpu);

// Of those, with checkpointing, the checkpointed block inputs (the embedding output and each block's
// output, one [B·T, C] activation each): all on the device, or with cpu_checkpointing two on the
// device and the rest in pinned host memory (model/lm.h, Checkpoints). Zero without checkpointing.
struct CheckpointBytes {
  std::uint64_t device = 0, host = 0;
};
CheckpointBytes estimate_checkpoint_bytes(const ModelShape& s, std::int64_t micro_batch, int compute_bytes,
                                          bool checkpointing, bool cpu_checkpointing,
                                          Kernels kernels = Kernels::reference);

// The device blocks the model's ops allocate for themselves on the CUDA device (zinf/device_memory.h,
// ops_scratch_blocks) for one micro batch of this shape; none on the CPU device.
std::vector<std::uint64_t> estimate_ops_scratch(const Config& c, const ModelShape& shape);

// The engine's plan input for this config and shape, with the activation and ops scratch estimates;
// on the CUDA device (device.type cuda) every device buffer counts as its allocator block.
offload::PlanInput make_plan_input(const Config& c, const ModelShape& shape);
// The machine's capacities for the device device.type resolves to (app/config/device_choice.h, from
// m.gpus, as `zinf train` resolves it); device.memory_budget auto on the CUDA device is the free memory
// of this process's GPU (m.own_gpu) less the reserve of cuda_auto_budget (cuBLAS, NCCL, module images),
// as the CUDA device takes it, and 0 where that GPU is not visible; on the CPU device, half of the
// available host memory, taken out of the host's.
offload::Capacity machine_capacity(const Config& c, const MachineInfo& m);

struct LargestFit {
  std::string setting;  // "optimizer=cpu param=none", "optimizer=nvme param=nvme streaming"
  OffloadDevice optimizer = OffloadDevice::none, param = OffloadDevice::none;
  // gradient_streaming without the speculative Update (and with GA > 1 the layer-major order, or on
  // one rank without checkpointing device_grad_accumulation): no model-sized gradient on the host.
  bool streaming = false;
  int n_layer = 0;  // 0: not even one block fits
  std::int64_t params = 0;
  std::string largest_preset;  // the largest llama-family preset that fits ("" when none does)
};

// One ZeRO stage of this run's placement, per rank (rank 0, which holds the largest shards).
struct StagePlan {
  int stage = 0;
  bool valid = true;  // the config's offload settings are allowed at this stage
  offload::TierBytes model_states{}, totals{};
  std::uint64_t zero_paper = 0;  // the ZeRO paper's model states per GPU, mixed-precision Adam, no offload
};

// The ZeRO paper's per-GPU model-state bytes for Ψ parameters, mixed-precision Adam (K = 12) over
// Nd ranks: stage 0 (2+2+K)Ψ, 1 (2+2)Ψ + KΨ/Nd, 2 2Ψ + (2+K)Ψ/Nd, 3 (2+2+K)Ψ/Nd.
std::uint64_t zero_paper_bytes(std::int64_t params, int stage, int world);

// Bytes per parameter of a plan on each tier, and of host memory (host + pinned), with the optimizer
// states in one format (zero_optimization.optimizer_states): fp32 (master, m, v: 12 bytes per
// parameter), bf16 (8) or 8bit (6 + 8/256).
struct PerParam {
  cpu_adam::StateFormat states = cpu_adam::StateFormat::fp32;
  std::array<double, offload::kTiers> tier{};
  double host_pinned = 0;
};
PerParam per_param(const offload::Plan& p, cpu_adam::StateFormat states);

// The plan of `in` with its optimizer states in `states` (the byte model of buffer_specs.h).
offload::Plan plan_with_states(offload::PlanInput in, cpu_adam::StateFormat states);
constexpr cpu_adam::StateFormat kStateFormats[] = {cpu_adam::StateFormat::fp32, cpu_adam::StateFormat::bf16,
                                                   cpu_adam::StateFormat::q8};

// The host memory of a `zinf train` process: its predicted peak resident set, part by part. The
// engine's host and pinned buffers; on the CPU device also every device byte (its memory is host
// memory); the largest short-lived buffer; the data set; and the program itself.
struct HostFootprint {
  std::uint64_t host = 0, pinned = 0;
  std::uint64_t device = 0;     // the CPU device: the plan's device total (0 on a GPU)
  std::uint64_t transient = 0;  // the largest short-lived buffer (see transient_note)
  std::string transient_note;
  std::uint64_t data = 0;     // the data set in memory (data_memory_bytes)
  std::uint64_t runtime = 0;  // code and libraries as loaded, thread stacks and allocator arenas
  std::uint64_t total() const { return host + pinned + device + transient + data + runtime; }
};
// The program's own resident memory beside its buffers (docs/offload-engine.md, "Host memory"): the
// program as loaded (startup_resident_bytes: its code and libraries — about 8 MiB for a CPU-only
// build, over 200 MiB when the CUDA libraries are linked), or kLoadedBytes when that was not
// recorded, plus kRuntimeExtraBytes for thread stacks, allocator arenas and the model's
// bookkeeping, measured on the CPU device.
constexpr std::uint64_t kLoadedBytes = std::uint64_t{8} << 20;
constexpr std::uint64_t kRuntimeExtraBytes = std::uint64_t{16} << 20;
HostFootprint host_footprint(const Config& c, const offload::Plan& p, const ModelShape& shape);

struct RunPlan {
  DeviceChoice device;  // device.type resolved on this machine, and why
  ModelShape shape;
  int world = 1;                  // data-parallel ranks the plan is for
  std::vector<StagePlan> stages;  // stages 0–3 with this placement
  offload::Plan plan;
  offload::Capacity capacity;
  offload::Verdict verdict;
  std::uint64_t activations_plain = 0, activations_checkpointed = 0;
  std::uint64_t activations_cpu_checkpointed = 0;  // on the device, checkpoints in host memory (cpu_checkpointing)
  offload::DeepSpeedEstimate deepspeed;            // estimate_zero3_model_states_mem_needs for this model
  std::vector<LargestFit> largest;
  std::vector<std::string> notes;    // e.g. "nvme_path does not exist"
  PerParam per_param;                // this plan, per parameter
  std::vector<PerParam> per_states;  // the same line in each state format (config without optimizer_states)
  HostFootprint footprint;           // the host memory of `zinf train` with this config
};

// The plan of `c` on machine `m`, with device.type resolved from m.gpus.
RunPlan plan_run(const Config& c, const MachineInfo& m);
// The largest model of this width, and the largest llama-family preset, that fit `capacity` (its NVMe
// space as given) under each offload setting: none, optimizer cpu, optimizer and parameters cpu,
// optimizer nvme with parameters cpu, both nvme, and both nvme with gradient streaming.
std::vector<LargestFit> largest_fits(const Config& c, const ModelShape& shape, const offload::Capacity& capacity);

// One filesystem that holds NVMe stores of a run: the swap paths on it (config keys and folders),
// the bytes the plan's NVMe column puts there, and what the run can have there. The parameters'
// store (param16) lives in offload_param.nvme_path; the optimizer's states and, with
// gradient_streaming, the gradient store in offload_optimizer.nvme_path. Two paths on one
// filesystem share its free space.
struct NvmeSpace {
  std::vector<std::string> keys, paths;  // e.g. "zero_optimization.offload_optimizer.nvme_path", its folder
  std::string probed;                    // the folder measured: the path, or its nearest existing parent
  std::uint64_t needed = 0;              // the plan's NVMe bytes there
  std::uint64_t free = 0;                // statvfs's f_bavail × f_frsize: what this user may still write
  // Leftover swap folders of runs that are gone, which the stores remove at start
  // (zinf/nvme/store.h, clean_stale_swap_dirs): their blocks count as free.
  std::uint64_t reclaimable = 0;
  bool missing = false;  // the first path does not exist yet: `probed` is where it will be created
};
// The filesystems of `c`'s NVMe swap paths with the bytes `p` needs on each, measured now (nothing
// created); empty when nothing swaps to NVMe. A path that cannot be measured or written (its nearest
// existing folder is not writable, statvfs fails or reports no blocks, as /proc does) is left out:
// creating it fails with its own error.
std::vector<NvmeSpace> nvme_space(const Config& c, const offload::Plan& p);
// One line refusing the first filesystem whose needed bytes exceed free + reclaimable, naming its
// path(s) and the bytes needed and free in GiB; "" when every one has room.
std::string nvme_space_problem(const std::vector<NvmeSpace>& spaces);

}  // namespace zinf
