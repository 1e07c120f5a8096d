// Learning-rate schedules: a pure function of the 1-based update number t (the first update is
// t = 1), so a resumed run needs only t.
//   warm-up (t <= W, W = optim.warmup_steps > 0):  lr * t / W
//   then, by optim.schedule:
//     constant:  lr
//     rsqrt:     lr * sqrt(W' / t), W' = max(W, 1)   (GShard A.2: "square root decay"; equals lr
//                                                      at t = W, so no jump after warm-up)
//     cosine:    lr_min + (lr - lr_min) * (1 + cos(pi * p)) / 2,   lr_min = min_lr_ratio * lr,
//                p = (t - W) / (T - W) clamped to [0, 1], T = run.steps (p = 1 when T <= W);
//                reaches lr_min at t = T and stays there
#pragma once
#include <cstdint>
#include <string>

#include "deck/config.hpp"

namespace meshmoe {

struct Schedule {
  ScheduleKind kind = ScheduleKind::Rsqrt;
  double lr = 1e-3;
  int64_t warmup_steps = 0;
  double min_lr_ratio = 0.1;
  int64_t total_steps = 0;  // run.steps (cosine only)

  // From cfg.optim.{schedule, lr, warmup_steps, min_lr_ratio} and cfg.run.steps; throws
  // InputError naming the key for a value out of range.
  static Schedule from_config(const Config& cfg);
  // Learning rate of update t >= 1 (throws std::logic_error for t < 1).
  double operator()(int64_t t) const;
};

}  // namespace meshmoe
