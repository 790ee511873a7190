// ops_forward.cpp — see ops_forward.h. Each op of model/op_list.h becomes, e.g.
//   void ForwardingOps::gelu_forward(TensorView out, ConstTensorView inp, std::size_t n) {
//     run(kind_info(OpKind::elementwise, false), [=, this] { in_->gelu_forward(out, inp, n); });
//   }
// with the entry's info (kind and FLOPs, op_list.h). The closure captures the views by value: the
// pointers, not the data they point to.
#include "model/ops_forward.h"

namespace zinf {

#define ZINF_FORWARD_OP(name, info, params, args) \
  void ForwardingOps::name params {               \
    run(info, [=, this] { in_->name args; });     \
  }
ZINF_OPS(ZINF_FORWARD_OP)
#undef ZINF_FORWARD_OP

}  // namespace zinf
