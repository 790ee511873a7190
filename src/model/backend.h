// backend.h — the seam between the model and a device's kernels: every op of the GPT-2 and Llama
// families, plus the copies and fills the model does on device memory, behind one interface. The ops
// are listed once, in op_list.h; the declarations below are generated from that list. The CPU
// backend's reference ops (src/backends/cpu/, whose headers give each op's shapes and semantics) and the
// CUDA backend's kernels (src/backends/cuda/) implement it; activations and weights pass as typed views
// (tensor.h).
#pragma once

#include <cstddef>

#include "model/op_list.h"
#include "model/tensor.h"

namespace zinf {

class OpsBackend {
 public:
  virtual ~OpsBackend() = default;

  // Every op of model/op_list.h, e.g.
  //   virtual void matmul_forward(TensorView out, ConstTensorView inp, ..., int OC) = 0;
  // A backend must have GPT-2's; the Llama family's raise the ConfigError of no_llama() unless it
  // overrides them (and has_llama_ops()).
#define ZINF_DECLARE_OP(name, info, params, args) virtual void name params = 0;
  ZINF_GPT_OPS(ZINF_DECLARE_OP)
#undef ZINF_DECLARE_OP
#define ZINF_DECLARE_LLAMA_OP(name, info, params, args) \
  virtual void name params {                            \
    ignore_args args;                                   \
    no_llama();                                         \
  }
  ZINF_LLAMA_OPS(ZINF_DECLARE_LLAMA_OP)
#undef ZINF_DECLARE_LLAMA_OP
  virtual bool has_llama_ops() const { return false; }

  // The dtype the model stores its activations (and activation gradients, the LM head's probs and
  // dlogits) in for this backend. LayerNorm mean/rstd, RMSNorm rstd, the attention state, row
  // losses and the rotary tables are fp32 whatever it is; weight gradients are fp32.
  virtual DType storage_dtype() const { return DType::fp32; }
  // Elements of the attention state `att` one attention op keeps for its backward: the [B,H,T,T]
  // probabilities of the reference kernels, or less (a backend that keeps each row's log-sum-exp).
  virtual std::size_t attention_state_elems(int B, int H, int T) const {
    return static_cast<std::size_t>(B) * static_cast<std::size_t>(H) * static_cast<std::size_t>(T) *
           static_cast<std::size_t>(T);
  }

  [[noreturn]] static void no_llama();  // the ConfigError a backend without llama kernels raises

 private:
  template <class... A>
  static void ignore_args(const A&...) {}
};

// A backend whose kernels take fp32 pointers: each op checks its views are fp32 (a zinf::Error
// naming `Impl::kName`, the op and the argument otherwise) and calls Impl::fp32_name with the same
// arguments, views as float pointers. Impl derives from Fp32Ops<Impl> and has every fp32_ op of the
// list (a missing one does not compile).
template <class Impl>
class Fp32Ops : public OpsBackend {
 public:
#define ZINF_FP32_OP(name, info, params, args)                                                         \
  void name params override {                                                                          \
    call_fp32(                                                                                         \
        Impl::kName, #name, #args, [this](auto... a) { static_cast<Impl*>(this)->fp32_##name(a...); }, \
        ZINF_OP_UNPAREN args);                                                                         \
  }
  ZINF_OPS(ZINF_FP32_OP)
#undef ZINF_FP32_OP
};

}  // namespace zinf
