// engine_config.cpp — see engine_config.h.
#include "app/config/engine_config.h"

#include <algorithm>

#include "app/config/device_choice.h"

namespace zinf {

nvme::StoreOptions store_options(const AioConfig& a, const std::string& nvme_path) {
  nvme::StoreOptions o;
  o.parent = nvme_path;
  o.io_kind = a.engine;
  o.io.block_size = static_cast<std::size_t>(a.block_size);
  o.io.queue_depth = a.queue_depth;
  o.io.threads = a.intra_op_parallelism;
  o.io.single_submit = a.single_submit;
  o.io.sqpoll = a.sqpoll;
  o.create_parent = true;  // DeepSpeed creates nvme_path
  return o;
}

int prefetch_depth(const Config& c, const ModelShape& s) {
  const std::int64_t block = std::max<std::int64_t>(1, block_params(s));
  // stage3_prefetch_bucket_size: how far ahead; stage3_max_live_parameters: the window (the unit in
  // use and those fetched ahead) never holds more.
  const std::int64_t ahead = std::min(c.zero.prefetch_bucket_size / block, c.zero.max_live_parameters / block - 1);
  return static_cast<int>(std::clamp<std::int64_t>(ahead, 1, 4));
}

bool pin_memory(const Config& c) {
  const bool device_update_writes_homes =
      c.zero.offload_optimizer.device == OffloadDevice::none && c.zero.offload_param.device != OffloadDevice::none;
  return (c.zero.offload_optimizer.pin_memory && c.zero.offload_param.pin_memory) || device_update_writes_homes;
}

offload::PlanInput plan_input(const Config& c, const ModelShape& shape, int world, int rank) {
  offload::PlanInput in;
  const auto units = layer_units(shape);
  for (std::size_t u = 0; u < units.size(); ++u) {
    in.unit_params.push_back(units[u].params);
    in.persistent.push_back(u == 0 || u + 1 == units.size());  // the embedding and the final LayerNorm
  }
  in.precision = c.precision();
  // The reference kernels compute on fp32 working weights; the fast kernels read the 16-bit copy.
  in.fp32_work = c.device.kernels == Kernels::reference;
  in.optimizer = c.zero.offload_optimizer.device;
  in.optimizer_states = c.zero.optimizer_states;
  in.param = c.zero.offload_param.device;
  in.grad_accum = c.gradient_accumulation_steps;
  in.sub_group_size = c.zero.sub_group_size;
  in.reduce_bucket_size = c.zero.reduce_bucket_size;
  in.optimizer_buffer_count = c.zero.offload_optimizer.buffer_count;
  in.speculative = c.zero.offload_optimizer.speculative;
  in.speculative_backup = c.zero.offload_optimizer.speculative_backup_size;
  in.device_grad_accum = c.zero.offload_optimizer.device_grad_accumulation;
  in.gradient_streaming = c.zero.offload_optimizer.gradient_streaming;
  in.layer_major = c.zero.offload_optimizer.layer_major;
  in.head_unit = shape.family == ModelFamily::llama && !shape.tie_embeddings ? -1 : 0;
  in.prefetch_depth = prefetch_depth(c, shape);
  in.world = world;
  in.rank = rank;
  in.stage = c.zero.stage;
  in.persistence_threshold = c.zero.param_persistence_threshold;
  in.pin_memory = pin_memory(c);
  in.overlap = c.train.overlap_none ? offload::Overlap::none : offload::Overlap::exact;
  in.device_blocks = run_device_type(c) == DeviceType::cuda;  // the device train makes (device_choice.h)
  return in;
}

offload::EngineConfig engine_config(const Config& c, int host_threads, int world, int rank) {
  offload::EngineConfig e;
  e.plan = plan_input(c, model_shape(c.model), world, rank);
  e.optimizer_store = store_options(c.aio, c.zero.offload_optimizer.nvme_path);
  e.param_store = store_options(c.aio, c.zero.offload_param.nvme_path);
  e.host_threads = host_threads;
  e.pin_threads = c.device.pin_threads;
  return e;
}

}  // namespace zinf
