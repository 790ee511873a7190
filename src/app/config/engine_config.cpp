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

offload::EngineConfig engine_config(const Config& c, int host_threads) {
  const ModelShape shape = model_shape(c.model);
  offload::EngineConfig e;
  const auto units = layer_units(shape);
  for (std::size_t u = 0; u < units.size(); ++u) {
    e.units.push_back(static_cast<std::size_t>(units[u].params));
    e.persistent.push_back(u == 0 || u + 1 == units.size());  // the embedding and the final LayerNorm
  }
  e.precision = c.precision();
  e.model_kernels = c.device.kernels;
  e.optimizer = c.zero.offload_optimizer.device;
  e.optimizer_states = c.zero.optimizer_states;
  e.param = c.zero.offload_param.device;
  e.grad_accum = c.gradient_accumulation_steps;
  e.sub_group_size = static_cast<std::size_t>(c.zero.sub_group_size);
  e.reduce_bucket_size = static_cast<std::size_t>(c.zero.reduce_bucket_size);
  e.optimizer_buffer_count = c.zero.offload_optimizer.buffer_count;
  e.speculative = c.zero.offload_optimizer.speculative;
  e.speculative_backup = static_cast<std::size_t>(c.zero.offload_optimizer.speculative_backup_size);
  e.device_grad_accum = c.zero.offload_optimizer.device_grad_accumulation;
  e.prefetch_depth = prefetch_depth(c, shape);
  e.stage = c.zero.stage;
  e.persistence_threshold = static_cast<std::size_t>(c.zero.param_persistence_threshold);
  e.optimizer_store = store_options(c.aio, c.zero.offload_optimizer.nvme_path);
  e.param_store = store_options(c.aio, c.zero.offload_param.nvme_path);
  e.pin_memory = pin_memory(c);
  e.host_threads = host_threads;
  e.pin_threads = c.device.pin_threads;
  e.overlap = c.train.overlap_none ? offload::Overlap::none : offload::Overlap::exact;
  e.device_blocks = run_device_type(c) == DeviceType::cuda;  // the device train makes (device_choice.h)
  return e;
}

}  // namespace zinf
