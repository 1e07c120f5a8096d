// The clock behind the step line's tok/s, MFU and ETA (docs/user-guide.md "Training"): evaluations
// (validation and translation scores) and checkpoint writes are timed apart, so that the logging
// interval's throughput counts training time only and the ETA adds the evaluations still to come.
#pragma once
#include <algorithm>
#include <cstdint>

namespace meshmoe {

// Evaluations due at the steps of [from, steps] every `every` steps (0: never): the multiples of
// `every` and the last step.
inline int64_t evaluations_due(int64_t every, int64_t from, int64_t steps) {
  if (every <= 0 || from > steps) return 0;
  const int64_t multiples = steps / every - (from - 1) / every;
  return multiples + (steps % every != 0 ? 1 : 0);
}

class RunClock {
 public:
  enum Kind { kValidation = 0, kTranslation = 1 };

  explicit RunClock(double now) : start_(now), interval_start_(now) {}

  double start() const { return start_; }

  // An evaluation of `kind` took `seconds`.
  void add_evaluation(Kind kind, double seconds) {
    eval_seconds_[kind] += seconds;
    evals_[kind] += 1;
    interval_eval_seconds_ += seconds;
  }

  // A checkpoint's write took `seconds`: out of the interval's tokens/s like an evaluation; the ETA
  // keeps it in the training seconds per step, as checkpoints recur with the steps.
  void add_checkpoint(double seconds) { interval_eval_seconds_ += seconds; }

  // Training tokens per second over the interval begun at the last start_interval (or the
  // clock's start), evaluations and checkpoint writes left out.
  double interval_tokens_per_s(double now, int64_t tokens) const {
    return double(tokens) / std::max(now - interval_start_ - interval_eval_seconds_, 1e-9);
  }
  // The next interval begins (after the step line is written: its own time is not training).
  void start_interval(double now) {
    interval_start_ = now;
    interval_eval_seconds_ = 0;
  }

  // Seconds left after `done` of `total` training steps run by this process: its training seconds
  // per step times the steps left, plus each evaluation still due (`left[kind]`) at the mean of this
  // process's evaluations of that kind; a kind not yet timed counts as `steps_estimate[kind]`
  // training steps.
  double eta(double now, int64_t done, int64_t total, const int64_t left[2], const double steps_estimate[2]) const {
    const double train = now - start_ - eval_seconds_[0] - eval_seconds_[1];
    const double per_step = done > 0 ? train / double(done) : 0;
    double eta = per_step * double(total - done);
    for (int k = 0; k < 2; ++k)
      eta += double(left[k]) * (evals_[k] > 0 ? eval_seconds_[k] / double(evals_[k]) : steps_estimate[k] * per_step);
    return eta;
  }

 private:
  double start_, interval_start_;
  double interval_eval_seconds_ = 0;  // evaluations and checkpoint writes of the interval
  double eval_seconds_[2] = {0, 0};
  int64_t evals_[2] = {0, 0};
};

}  // namespace meshmoe
