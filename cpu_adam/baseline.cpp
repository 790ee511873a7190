// baseline.cpp — Adam as one would write it without thinking about the machine: a plain loop over
// the arrays, std::sqrt, scalar half conversions, no ISA flags beyond the default x86-64. It is the
// "what you'd write" baseline of `zinf bench adam` — a benchmark reference, not a spec (adam.h is).
#include <cmath>

#include "zinf/cpu_adam/adam.h"
#include "zinf/cpu_adam/convert.h"
#include "zinf/error.h"

namespace zinf::cpu_adam {

void adam_update_naive(const AdamHyper& h, std::int64_t step, float grad_scale, const UpdateChunk& c) {
  const float bc1 = 1.0f - std::pow(h.beta1, static_cast<float>(step));
  const float bc2 = 1.0f - std::pow(h.beta2, static_cast<float>(step));
  const auto* g16 = static_cast<const std::uint16_t*>(c.grad);
  const auto* g32 = static_cast<const float*>(c.grad);
  auto* out = static_cast<std::uint16_t*>(c.param16);
  ZINF_CHECK(c.states == StateFormat::fp32);  // the baseline is the plain fp32 loop
  auto* cm = static_cast<float*>(c.m);
  auto* cv = static_cast<float*>(c.v);
  for (std::size_t i = 0; i < c.n; ++i) {
    float g = c.grad_type == GradType::fp32   ? g32[i]
              : c.grad_type == GradType::fp16 ? fp16_to_fp32_reference(g16[i])
                                              : bf16_to_fp32_reference(g16[i]);
    g *= grad_scale;
    if (!h.decoupled) g += h.weight_decay * c.master[i];
    cm[i] = h.beta1 * cm[i] + (1.0f - h.beta1) * g;
    cv[i] = h.beta2 * cv[i] + (1.0f - h.beta2) * g * g;
    const float mhat = cm[i] / bc1, vhat = cv[i] / bc2;
    if (h.decoupled) c.master[i] -= h.lr * h.weight_decay * c.master[i];
    c.master[i] -= h.lr * mhat / (std::sqrt(vhat) + h.eps);
    if (out)
      out[i] =
          c.param16_type == HalfType::fp16 ? fp32_to_fp16_reference(c.master[i]) : fp32_to_bf16_reference(c.master[i]);
  }
}

}  // namespace zinf::cpu_adam
