// cpu_ops.h — the CPU backend's OpsBackend: every op of model/op_list.h calls its reference
// implementation (ops_gpt.h, ops_llama.h).
#pragma once

#include "cpu/ops_gpt.h"
#include "cpu/ops_llama.h"
#include "model/backend.h"

namespace zinf {

// The CPU device's backend: the reference ops (ops::name of ops_gpt.h / ops_llama.h), parallel over
// fixed chunks. It computes in fp32; a view of another type is refused with a zinf::Error.
class CpuOps : public OpsBackend {
 public:
  explicit CpuOps(ops::ChunkPool& par) : pool_(par) {}

#define ZINF_CPU_OP(name, info, params, args)                                                      \
  void name params override {                                                                      \
    call_fp32(                                                                                     \
        "CPU", #name, #args, [this](auto... a) { ops::name(pool_, a...); }, ZINF_OP_UNPAREN args); \
  }
  ZINF_OPS(ZINF_CPU_OP)
#undef ZINF_CPU_OP

 private:
  ops::ChunkPool& pool_;
};

}  // namespace zinf
