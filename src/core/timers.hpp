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
  const std::map<std::string, double>& totals() const { return totals_; }
  void reset() {
    for (auto& [_, s] : totals_) s = 0;
  }

 private:
  std::map<std::string, double> totals_;
};

inline double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Adds the lifetime of the scope to `phase`; does nothing when timers is null (tests).
class ScopedPhase {
 public:
  ScopedPhase(PhaseTimers* timers, const char* phase) : timers_(timers), phase_(phase), start_(timers ? wall_seconds() : 0) {}
  ~ScopedPhase() {
    if (timers_) timers_->add(phase_, wall_seconds() - start_);
  }
  ScopedPhase(const ScopedPhase&) = delete;
  ScopedPhase& operator=(const ScopedPhase&) = delete;

 private:
  PhaseTimers* timers_;
  const char* phase_;
  double start_;
};

}  // namespace meshmoe
