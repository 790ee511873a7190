// schedule.cpp — DeepSpeed's dynamic loss scaler and LR schedules, step for step (train.h).
#include <cmath>

#include "app/train/train.h"
#include "model/fixed_math.h"  // not libm: one learning rate on every x86-64 CPU
#include "zinf/error.h"

namespace zinf {

LossScaler::LossScaler(const Fp16Config& c) {
  if (!c.enabled) return;  // bf16 / fp32: scale 1, never changes
  if (c.loss_scale > 0) {  // static
    cur_scale_ = c.loss_scale;
    return;
  }
  dynamic_ = true;
  cur_scale_ = std::ldexp(1.0, c.initial_scale_power);
  min_scale_ = c.min_loss_scale;
  window_ = c.loss_scale_window;
  hysteresis_ = c.hysteresis;
  cur_hysteresis = c.hysteresis;
  consecutive_ = c.consecutive_hysteresis;
}

void LossScaler::update(bool overflow) {
  if (!dynamic_) return;
  if (overflow) {
    if (hysteresis_ == 1 || cur_hysteresis == 1) {
      if (cur_scale_ == min_scale_)
        throw Error("Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.",
                    "the fp16 gradients overflow at the minimum loss scale: lower the learning rate, or use bf16");
      cur_scale_ = std::max(cur_scale_ / 2.0, min_scale_);
    } else {
      --cur_hysteresis;
    }
    last_overflow_iter = cur_iter;
  } else {
    if (consecutive_) cur_hysteresis = hysteresis_;
    const std::int64_t stable = cur_iter - last_overflow_iter - 1;
    if (stable > 0 && stable % window_ == 0) {
      if (!consecutive_) cur_hysteresis = hysteresis_;
      cur_scale_ *= 2.0;
    }
  }
  ++cur_iter;
}

namespace {
double warmup_gamma(const SchedulerConfig& s, std::int64_t t) {
  const double W = static_cast<double>(s.warmup_num_steps);
  if (s.warmup_type == WarmupType::log) return fixed::log(static_cast<double>(t) + 1.0) / fixed::log(W);
  return static_cast<double>(t) / W;
}
}  // namespace

double lr_at(const SchedulerConfig& s, double base_lr, std::int64_t t) {
  switch (s.type) {
    case SchedulerType::none: return base_lr;
    case SchedulerType::warmup_lr: {
      const double g = t < s.warmup_num_steps ? warmup_gamma(s, t) : 1.0;
      return s.warmup_min_lr + (s.warmup_max_lr - s.warmup_min_lr) * g;
    }
    case SchedulerType::warmup_decay_lr: {
      double g;
      if (t < s.warmup_num_steps)
        g = warmup_gamma(s, t);
      else
        g = std::max(0.0, static_cast<double>(s.total_num_steps - t) /
                              std::max<double>(1.0, static_cast<double>(s.total_num_steps - s.warmup_num_steps)));
      return s.warmup_min_lr + (s.warmup_max_lr - s.warmup_min_lr) * g;
    }
    case SchedulerType::warmup_cosine_lr: {
      double ratio;
      if (t < s.warmup_num_steps) {
        ratio = s.warmup_min_ratio + warmup_gamma(s, t) * (1.0 - s.warmup_min_ratio);
      } else {
        const double p =
            std::min(1.0, static_cast<double>(t - s.warmup_num_steps + 1) /
                              std::max<double>(1.0, static_cast<double>(s.total_num_steps - s.warmup_num_steps)));
        ratio = s.cos_min_ratio + (1.0 - s.cos_min_ratio) * (1.0 + fixed::cos(M_PI * p)) / 2.0;
      }
      return base_lr * ratio;
    }
  }
  return base_lr;
}

std::uint64_t fnv1a64(const void* data, std::size_t n, std::uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace zinf
