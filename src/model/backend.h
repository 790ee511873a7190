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
#include "zinf/types.h"

namespace zinf {

// How a backend lays out the rows of the LM head's logits buffers — probs and dlogits, R rows of V
// classes, which lm_head_forward and lm_head_backward read and write:
//   packed: row r at element r·V (the CPU reference, the CPU twin, the CUDA reference kernels);
//   padded: row r at element r·Vp, Vp = V rounded up to a multiple of kLogitsRowMultiple, and the
//           buffer itself starting kLogitsAlignBytes-aligned (the CUDA fast kernels). In 16-bit
//           storage every row then starts on a 128-byte boundary, so the LM head's three GEMMs (the
//           logits with ldc = Vp, dx and dwte reading dlogits with ld = Vp) get leading dimensions
//           and pointers that cuBLASLt's fast kernels accept; with ld = V and an odd V (GPT-2's
//           50257) every row after the first is misaligned and cuBLASLt falls back to slower kernels.
// The Vp − V pad columns of a row are outside every op: no kernel writes or reads them, so they hold
// whatever the memory held (the softmax, the loss, dlogits and the GEMMs see the V classes only).
// The weights stay [V, C] and everything outside the two buffers (exports, checkpoints, losses) is
// the same under either layout.
enum class LogitsRows { packed, padded };
inline constexpr int kLogitsRowMultiple = 64;
inline constexpr std::size_t kLogitsAlignBytes = 256;

// The one rule for which kernels pad: the CUDA fast kernels; every other backend keeps V. The
// backends report it (OpsBackend::logits_rows) and `zinf plan` counts the device memory with it.
constexpr LogitsRows logits_rows_of(DeviceType device, Kernels kernels) {
  return device == DeviceType::cuda && kernels == Kernels::fast ? LogitsRows::padded : LogitsRows::packed;
}
// The row stride of the logits buffers, in elements.
constexpr int logits_row_stride(int V, LogitsRows rows) {
  return rows == LogitsRows::padded ? (V + kLogitsRowMultiple - 1) / kLogitsRowMultiple * kLogitsRowMultiple : V;
}

class OpsBackend {
 public:
  virtual ~OpsBackend() = default;

  // Every op of model/op_list.h, e.g.
  //   virtual void matmul_forward(TensorView out, ConstTensorView inp, ..., int OC) = 0;
  // Every backend has every op of the list, GPT-2's and the Llama family's alike.
#define ZINF_DECLARE_OP(name, info, params, args) virtual void name params = 0;
  ZINF_OPS(ZINF_DECLARE_OP)
#undef ZINF_DECLARE_OP

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
  // The layout of the probs and dlogits buffers this backend's LM head ops take (logits_rows_of):
  // views of R · logits_row_stride(V, logits_rows()) elements.
  virtual LogitsRows logits_rows() const { return LogitsRows::packed; }
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
