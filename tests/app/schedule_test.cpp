// schedule_test.cpp — the dynamic loss scaler driven through a scripted overflow sequence, step by
// step against DeepSpeed's documented behaviour, and the LR schedules at chosen steps against their
// closed forms.
#include <gtest/gtest.h>

#include <cmath>

#include "app/config/config.h"
#include "app/train/train.h"
#include "zinf/error.h"

namespace zinf {
namespace {

Fp16Config fp16(int power, int window, int hysteresis, double min_scale, bool consecutive = false) {
  Fp16Config c;
  c.enabled = true;
  c.initial_scale_power = power;
  c.loss_scale_window = window;
  c.hysteresis = hysteresis;
  c.min_loss_scale = min_scale;
  c.consecutive_hysteresis = consecutive;
  return c;
}

TEST(LossScaler, ScriptedSequenceMatchesDeepSpeed) {
  // initial 2^4, window 3, hysteresis 2, min 1.
  LossScaler s(fp16(4, 3, 2, 1.0));
  ASSERT_TRUE(s.dynamic());
  struct Step {
    bool overflow;
    double scale_after;
    int hysteresis_after;
  };
  const Step script[] = {
      {false, 16, 2},  // iter 0: stable = 0 → no growth
      {false, 16, 2},  // iter 1: stable = 1
      {false, 16, 2},  // iter 2: stable = 2
      {false, 32, 2},  // iter 3: stable = 3 = window → ×2
      {true, 32, 1},   // iter 4: overflow, hysteresis 2 → 1, scale kept
      {true, 16, 1},   // iter 5: overflow with hysteresis 1 → halve (hysteresis not refilled)
      {true, 8, 1},    // iter 6: again → halve
      {false, 8, 1},   // iter 7: stable = 0
      {false, 8, 1},   // iter 8
      {false, 8, 1},   // iter 9
      {false, 16, 2},  // iter 10: stable = 3 → ×2 and hysteresis refilled
  };
  for (std::size_t i = 0; i < std::size(script); ++i) {
    s.update(script[i].overflow);
    EXPECT_EQ(s.scale(), script[i].scale_after) << "iter " << i;
    EXPECT_EQ(s.cur_hysteresis, script[i].hysteresis_after) << "iter " << i;
  }
  EXPECT_EQ(s.cur_iter, 11);
  EXPECT_EQ(s.last_overflow_iter, 6);
}

TEST(LossScaler, ConsecutiveHysteresisRefillsOnEveryCleanStep) {
  LossScaler s(fp16(4, 100, 2, 1.0, /*consecutive=*/true));
  s.update(true);
  EXPECT_EQ(s.cur_hysteresis, 1);
  EXPECT_EQ(s.scale(), 16);
  s.update(false);
  EXPECT_EQ(s.cur_hysteresis, 2);
  s.update(true);
  EXPECT_EQ(s.scale(), 16);  // hysteresis absorbed it again
}

TEST(LossScaler, OverflowAtMinimumScaleRaisesDeepSpeedsError) {
  LossScaler s(fp16(1, 1000, 1, 1.0));
  s.update(true);  // 2 → 1
  EXPECT_EQ(s.scale(), 1);
  try {
    s.update(true);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Current loss scale already at minimum"), std::string::npos);
  }
}

TEST(LossScaler, StaticAndDisabled) {
  Fp16Config st = fp16(16, 1000, 2, 1.0);
  st.loss_scale = 128;
  LossScaler s(st);
  EXPECT_FALSE(s.dynamic());
  s.update(true);
  EXPECT_EQ(s.scale(), 128);
  LossScaler off(Fp16Config{});
  EXPECT_EQ(off.scale(), 1);
}

SchedulerConfig sched(SchedulerType t, WarmupType w) {
  return SchedulerConfig{.type = t,
                         .warmup_min_lr = 0.1,
                         .warmup_max_lr = 1.1,
                         .warmup_num_steps = 10,
                         .warmup_type = w,
                         .total_num_steps = 30,
                         .warmup_min_ratio = 0.2,
                         .cos_min_ratio = 0.05};
}

TEST(LrSchedule, WarmupLRLogAndLinear) {
  auto s = sched(SchedulerType::warmup_lr, WarmupType::log);
  EXPECT_DOUBLE_EQ(lr_at(s, 5, 0), 0.1);  // log(1) = 0
  EXPECT_DOUBLE_EQ(lr_at(s, 5, 4), 0.1 + 1.0 * std::log(5.0) / std::log(10.0));
  EXPECT_DOUBLE_EQ(lr_at(s, 5, 10), 1.1);
  EXPECT_DOUBLE_EQ(lr_at(s, 5, 1000), 1.1);
  s.warmup_type = WarmupType::linear;
  EXPECT_DOUBLE_EQ(lr_at(s, 5, 3), 0.1 + 1.0 * 3 / 10);
}

TEST(LrSchedule, WarmupDecayLR) {
  auto s = sched(SchedulerType::warmup_decay_lr, WarmupType::linear);
  EXPECT_DOUBLE_EQ(lr_at(s, 5, 5), 0.1 + 0.5);
  EXPECT_DOUBLE_EQ(lr_at(s, 5, 10), 0.1 + 1.0 * 20.0 / 20.0);
  EXPECT_DOUBLE_EQ(lr_at(s, 5, 20), 0.1 + 1.0 * 10.0 / 20.0);
  EXPECT_DOUBLE_EQ(lr_at(s, 5, 30), 0.1);
  EXPECT_DOUBLE_EQ(lr_at(s, 5, 40), 0.1);  // gamma clamps at 0
}

TEST(LrSchedule, WarmupCosineLRScalesTheBaseLr) {
  auto s = sched(SchedulerType::warmup_cosine_lr, WarmupType::linear);
  const double base = 2.0;
  EXPECT_DOUBLE_EQ(lr_at(s, base, 0), base * 0.2);
  EXPECT_DOUBLE_EQ(lr_at(s, base, 5), base * (0.2 + 0.5 * 0.8));
  const double p = 1.0 / 20.0;  // t = W: (t − W + 1) / (T − W)
  EXPECT_DOUBLE_EQ(lr_at(s, base, 10), base * (0.05 + 0.95 * (1 + std::cos(M_PI * p)) / 2));
  EXPECT_DOUBLE_EQ(lr_at(s, base, 29), base * 0.05);
  EXPECT_DOUBLE_EQ(lr_at(s, base, 100), base * 0.05);
}

TEST(LrSchedule, NoneIsTheOptimizerLr) { EXPECT_DOUBLE_EQ(lr_at(SchedulerConfig{}, 3e-4, 123), 3e-4); }

}  // namespace
}  // namespace zinf
