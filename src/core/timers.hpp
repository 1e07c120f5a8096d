// Wall-clock time per named phase (attention, gate, dispatch, expert, combine, ...), accumulated
// over a logging interval; the trainer reduces the totals with max over ranks and writes them to
// metrics.h5 as /time/<phase> (GShard figure 8, Pipeline-MoE tables 1 and 3).
#pragma once
#include <chrono>
#include <map>
#include <string>

namespace meshmoe {

class PhaseTimers {
 public:
  void add(const std::string& phase, double seconds) { totals_[phase] += seconds; }
  // Called at each phase's start and end when set (run.phase_sync: the device's wait), so that
  // a phase's time is its own queued device work, not what the next waiting phase inherits.
  void set_fence(void (*fence)()) { fence_ = fence; }
  void fence() const {
    if (fence_) fence_();
  }
  const std::map<std::string, double>& totals() const { return totals_; }
  void reset() {
    for (auto& [_, s] : totals_) s = 0;
  }

 private:
  std::map<std::string, double> totals_;
  void (*fence_)() = nullptr;
};

inline double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Adds the lifetime of the scope to `phase`; does nothing when timers is null (tests).
class ScopedPhase {
 public:
  ScopedPhase(PhaseTimers* timers, const char* phase) : timers_(timers), phase_(phase), start_(start(timers)) {}
  ~ScopedPhase() {
    if (!timers_) return;
    timers_->fence();
    timers_->add(phase_, wall_seconds() - start_);
  }
  ScopedPhase(const ScopedPhase&) = delete;
  ScopedPhase& operator=(const ScopedPhase&) = delete;

 private:
  static double start(const PhaseTimers* timers) {
    if (!timers) return 0;
    timers->fence();
    return wall_seconds();
  }
  PhaseTimers* timers_;
  const char* phase_;
  double start_;
};

}  // namespace meshmoe
