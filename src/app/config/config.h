// app/config/config.h — the run configuration: a DeepSpeed ds_config.json plus zinf's own sections.
//
// A user's existing ds_config.json must load. zinf reads DeepSpeed's keys with DeepSpeed's meaning
// and defaults, and adds `model`, `data`, `train` and `device`. The parser is strict: an unknown key
// in a section zinf reads is an error naming its JSON path and the nearest valid key; a DeepSpeed key
// that has no meaning on one box is accepted with one note. Every default lives in one place
// (src/app/config/config.cpp), and the resolved config (every key, defaults filled in) is kept as JSON text.
//
// Thread-safety: a Config is a plain value; parse it once and share it read-only.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "io/data.h"
#include "model/shape.h"
#include "zinf/cpu_adam/adam.h"
#include "zinf/nvme/async_io.h"
#include "zinf/types.h"

namespace zinf {

enum class OptimizerType { adam, adamw };
enum class SchedulerType { none, warmup_lr, warmup_decay_lr, warmup_cosine_lr };
enum class WarmupType { log, linear };
using nvme::AsyncIoKind;  // aio.engine: auto, uring, posix (the NVMe tier's back ends)

struct OptimizerConfig {
  OptimizerType type = OptimizerType::adamw;
  double lr = 0;
  double beta1 = 0, beta2 = 0;
  double eps = 0;
  double weight_decay = 0;
  bool bias_correction = true;
  // DeepSpeed: "AdamW" always decouples; "Adam" decouples too unless params.adam_w_mode is false.
  bool decoupled_weight_decay = true;
};

struct SchedulerConfig {
  SchedulerType type = SchedulerType::none;
  double warmup_min_lr = 0;
  double warmup_max_lr = 0;
  std::int64_t warmup_num_steps = 0;
  WarmupType warmup_type = WarmupType::log;
  std::int64_t total_num_steps = 0;
  double warmup_min_ratio = 0;  // WarmupCosineLR
  double cos_min_ratio = 0;     // WarmupCosineLR
};

struct Fp16Config {
  bool enabled = false;
  double loss_scale = 0;  // 0 = dynamic
  int initial_scale_power = 0;
  int loss_scale_window = 0;
  int hysteresis = 0;
  bool consecutive_hysteresis = false;
  double min_loss_scale = 0;
};

struct Bf16Config {
  bool enabled = false;
  bool check_grad_overflow = true;
};

// DeepSpeed's offload_optimizer and offload_param sections share most of their keys; the two structs
// mirror the two sections as ds_config.json spells them.
struct OffloadOptimizerConfig {
  OffloadDevice device = OffloadDevice::none;
  std::string nvme_path;
  int buffer_count = 0;
  bool pin_memory = true;
  bool pipeline_read = false;
  bool pipeline_write = false;
  bool fast_init = false;
  // zinf extensions: the speculative Update (docs/offload-engine.md), and its host backup in
  // elements (0: half the sub-groups).
  bool speculative = false;
  std::int64_t speculative_backup_size = 0;
  // zinf extension: sum the micro batches' gradients on the device, once per step to the host.
  bool device_grad_accumulation = false;
  // zinf extension: the layer-major order of gradient accumulation (every micro batch through a unit
  // before the next unit).
  bool layer_major = false;
  // zinf extension: stream the gradient to the Update through a ring of pinned buffers and NVMe
  // instead of holding it whole on the host (implies speculative).
  bool gradient_streaming = false;
};

struct OffloadParamConfig {
  OffloadDevice device = OffloadDevice::none;
  std::string nvme_path;
  int buffer_count = 0;
  std::int64_t buffer_size = 0;  // elements
  std::int64_t max_in_cpu = 0;   // elements
  bool pin_memory = true;
};

struct ZeroConfig {
  int stage = 0;
  OffloadOptimizerConfig offload_optimizer;
  // zinf extension: how Adam's m and v are stored on whichever tier holds them ("fp32", "bf16", "8bit").
  cpu_adam::StateFormat optimizer_states = cpu_adam::StateFormat::fp32;
  bool optimizer_states_given = false;  // the config names it (`zinf plan` then shows that format alone)
  OffloadParamConfig offload_param;
  std::int64_t sub_group_size = 0;      // elements
  std::int64_t reduce_bucket_size = 0;  // elements
  bool overlap_comm = false;
  bool contiguous_gradients = true;
  std::int64_t prefetch_bucket_size = 0;         // elements
  std::int64_t max_live_parameters = 0;          // elements
  std::int64_t max_reuse_distance = 0;           // elements
  std::int64_t param_persistence_threshold = 0;  // elements
};

struct AioConfig {
  std::int64_t block_size = 0;  // bytes per request
  int queue_depth = 0;
  int intra_op_parallelism = 0;  // I/O threads (DeepSpeed's docs call it thread_count)
  bool single_submit = false;
  bool overlap_events = true;
  bool use_gds = false;
  AsyncIoKind engine = AsyncIoKind::automatic;  // zinf extension
  bool sqpoll = false;                          // zinf extension: kernel-side submission polling
};

struct ModelConfig {
  std::string preset;  // empty when the shape is given explicitly
  int n_layer = 0, n_head = 0, d_model = 0, vocab_size = 0, seq_len = 0;
  bool activation_checkpointing = false;
  // activation_checkpointing.cpu_checkpointing (DeepSpeed's section): the checkpointed block inputs
  // live in pinned host memory, two on the device at a time.
  bool cpu_checkpointing = false;
  std::string init_from;  // a GPT-2 safetensors file or a Hugging Face folder to start from ("" = random init)
  // The architecture: "gpt2", or "llama" (RMSNorm, rotary positions, SwiGLU, grouped-query heads).
  ModelFamily family = ModelFamily::gpt2;
  int n_kv_head = 0;           // llama: key/value heads (0 = n_head)
  int d_ff = 0;                // llama: MLP hidden width (intermediate_size)
  bool tie_embeddings = true;  // llama: the LM head is the token embedding
  bool qkv_bias = false;       // llama: biases on the q, k, v projections (Qwen2)
  double rope_theta = 10000, norm_eps = 1e-5;
  double rope_factor = 1, rope_low_freq_factor = 1, rope_high_freq_factor = 4, rope_original_max = 8192;
  int max_positions = 0;  // llama: max_position_embeddings (0 = seq_len)
  // llama: the rotary scaling type and its parameters, the attention window and where the model
  // came from (model/shape.h); set from a Hugging Face folder, or "llama3" with model.rope_scaling.
  RopeParams rope{};
  int sliding_window = 0, window_from = 0;
  HfOrigin hf{};
  // Whether the config names the model (preset, init_from or any shape key other than seq_len),
  // and whether it names seq_len: `zinf eval --checkpoint` takes the shape from the checkpoint when
  // it does not.
  bool shape_given = false, seq_len_given = false;
};

// The shape a run config's `model` section describes (the one way to get it from a config).
ModelShape model_shape(const ModelConfig& m);
// Writes shape `s` into the model section (the inverse of model_shape(); the preset is left alone).
void set_model_shape(ModelConfig& m, const ModelShape& s);

struct TrainConfig {
  std::int64_t steps = 0;
  std::uint64_t seed = 0;
  std::string checkpoint_dir;
  std::int64_t checkpoint_interval = 0;
  int keep_last = 0;
  // A run that is not a resume may replace the checkpoints already in checkpoint_dir (and a resume
  // from an older checkpoint those newer than it); without it such a run is refused.
  bool overwrite_checkpoints = false;
  std::string metrics_file;
  // A Chrome-trace / Perfetto timeline of the first trace_steps steps (docs/trace.md); "" = off.
  std::string trace_file;
  std::int64_t trace_steps = 0;
  std::int64_t eval_interval = 0;
  int eval_batches = 0;
  bool overlap_none = false;  // train.overlap: "exact" (default) or "none" (every supernode in turn)
};

struct DeviceConfig {
  // auto|cpu|cuda as read; resolve_device (app/config/device_choice.h) turns auto into cpu or cuda, the
  // one place that decides what auto means, and says why in type_reason.
  DeviceType type = DeviceType::automatic;
  std::string type_reason;               // "" until resolved
  std::uint64_t memory_budget = 0;       // bytes; 0 = automatic (free GPU memory less a reserve, or half of host RAM)
  int threads = 0;                       // 0 = physical cores
  bool pin_threads = false;              // bind host workers to cores (hwloc)
  std::string simd;                      // auto|avx512|avx2|scalar: caps cpu_adam's runtime dispatch
  bool async = false;                    // CPU device: the model's ops run as compute-stream work
  std::uint64_t jitter_seed = 0;         // CPU device: seeded delays before every stream/worker job; 0 = off
  int jitter_us = 200;                   // the longest such delay, microseconds
  Kernels kernels = Kernels::reference;  // reference (fp32 oracle kernels) | fast (storage in the run's precision)
  // auto|cudnn|wmma|reference: the CUDA kernels' attention (resolve_attention in zinf/types.h says what
  // auto means); cudnn and wmma belong to the fast kernels, reference to the reference kernels.
  Attention attention = Attention::automatic;
  std::string comm = "auto";  // data-parallel transport: auto (nccl on CUDA, mpi on the CPU device) | mpi | nccl
};

// Where the run's scalars go (app/train/monitor.h): DeepSpeed's tensorboard and csv_monitor sections
// (the folder output_path/job_name), or zinf's monitor section naming the folders. "" = off.
struct MonitorConfig {
  std::string tensorboard_dir;
  std::string csv_dir;
};

// DeepSpeed's flops_profiler section: the per-op table of one step.
struct FlopsProfilerConfig {
  bool enabled = false;
  std::int64_t profile_step = 1;  // as DeepSpeed counts: after this many completed steps (zinf's step profile_step + 1)
  std::string output_file;        // "": the table goes to the log
};

struct Config {
  std::int64_t train_batch_size = 0;
  std::int64_t micro_batch_size = 0;  // train_micro_batch_size_per_gpu
  std::int64_t gradient_accumulation_steps = 0;
  int world_size = 1;  // data-parallel ranks the batch rule was resolved for
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  Fp16Config fp16;
  Bf16Config bf16;
  double gradient_clipping = 0;
  std::int64_t steps_per_print = 0;
  bool wall_clock_breakdown = false;
  ZeroConfig zero;
  AioConfig aio;
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  DeviceConfig device;
  MonitorConfig monitor;
  FlopsProfilerConfig flops_profiler;

  std::string source;              // file name, or "<string>"
  std::vector<std::string> notes;  // one line each: keys accepted but not applicable, deprecations
  std::string resolved_json;       // every key zinf reads, defaults filled, "auto" resolved

  Precision precision() const {
    return fp16.enabled ? Precision::fp16 : bf16.enabled ? Precision::bf16 : Precision::fp32;
  }
};

// Parses `json_text` (from `source_name`), applying `overrides` ("dotted.path=value"; value parsed
// as JSON, or taken as a string when it is not JSON) before validation, so an override is checked
// exactly like the file. Throws ConfigError with one line: "<source>: <json.path>: <why>".
// `world_size`: the data-parallel ranks of this job (DeepSpeed's batch rule: train_batch_size =
// micro batch × gradient_accumulation_steps × world size).
Config parse_config(std::string_view json_text, const std::vector<std::string>& overrides = {},
                    std::string_view source_name = "<string>", int world_size = 1);

// Reads and parses a file; a missing or unreadable file is a ConfigError naming it.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {}, int world_size = 1);

// "8GiB", "512MB", "1.5G", "4096" → bytes. K/M/G/T and KiB/MiB/GiB/TiB are powers of 1024,
// KB/MB/GB/TB powers of 1000. Throws ConfigError naming `what` on a malformed or negative value.
std::uint64_t parse_bytes(std::string_view text, std::string_view what);

// Levenshtein edit distance (for "did you mean" suggestions).
std::size_t edit_distance(std::string_view a, std::string_view b);

}  // namespace zinf
