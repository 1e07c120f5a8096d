#include "optim/schedule.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>
#include <vector>

#include "core/error.hpp"

namespace meshmoe {

Schedule Schedule::from_config(const Config& cfg) {
  Schedule s;
  std::vector<std::string> errors;
  s.kind = cfg.optim.schedule;
  if (!(cfg.optim.lr > 0)) errors.push_back("optim.lr = " + std::to_string(cfg.optim.lr) + " must be > 0");
  if (cfg.optim.warmup_steps < 0) errors.push_back("optim.warmup_steps = " + std::to_string(cfg.optim.warmup_steps) + " must be >= 0");
  if (!(cfg.optim.min_lr_ratio >= 0 && cfg.optim.min_lr_ratio <= 1))
    errors.push_back("optim.min_lr_ratio = " + std::to_string(cfg.optim.min_lr_ratio) + " must be in [0, 1]");
  if (!errors.empty()) throw InputError(errors);
  s.lr = cfg.optim.lr;
  s.warmup_steps = cfg.optim.warmup_steps;
  s.min_lr_ratio = cfg.optim.min_lr_ratio;
  s.total_steps = cfg.run.steps;
  return s;
}

double Schedule::operator()(int64_t t) const {
  if (t < 1) throw std::logic_error("Schedule: update number t must be >= 1, got " + std::to_string(t));
  const int64_t W = warmup_steps;
  if (t <= W) return lr * double(t) / double(W);
  switch (kind) {
    case ScheduleKind::Constant:
      return lr;
    case ScheduleKind::Rsqrt:
      return lr * std::sqrt(double(std::max<int64_t>(W, 1)) / double(t));
    case ScheduleKind::Cosine: {
      const double p = total_steps <= W ? 1.0 : std::clamp(double(t - W) / double(total_steps - W), 0.0, 1.0);
      const double lr_min = min_lr_ratio * lr;
      return lr_min + (lr - lr_min) * 0.5 * (1.0 + std::cos(std::numbers::pi * p));
    }
  }
  return lr;
}

}  // namespace meshmoe
