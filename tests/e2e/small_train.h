// small_train.h — a tiny GPT run through `train()` with every offload path available (fp16, GA 2,
// small sub-groups and buckets so units split), for the numerics-contract tests.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "app/config/config.h"
#include "app/train/train.h"

namespace zinf::test {

inline std::string small_train_config(const std::string& swap_dir) {
  return R"({"model": {"n_layer": 3, "n_head": 2, "d_model": 32, "vocab_size": 256, "seq_len": 16},
             "train": {"steps": 4, "eval_interval": 0, "eval_batches": 2, "seed": 11},
             "device": {"type": "cpu", "memory_budget": "256MiB", "threads": 1},
             "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "steps_per_print": 1000,
             "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}},
             "fp16": {"enabled": true, "initial_scale_power": 12},
             "zero_optimization": {"stage": 3, "sub_group_size": 6000, "reduce_bucket_size": 5000,
               "offload_optimizer": {"nvme_path": ")" +
         swap_dir + R"("}, "offload_param": {"nvme_path": ")" + swap_dir + R"("}}})";
}

inline std::string small_train_digest(const std::string& swap_dir, const std::vector<std::string>& overrides) {
  return train(parse_config(small_train_config(swap_dir), overrides), TrainHooks{}).params_digest;
}

}  // namespace zinf::test
