// The step line's clock (src/train/run_clock.hpp): tokens/s without the evaluations, an ETA with
// the evaluations still due. Times are given, not measured, so every figure is exact.
#include <catch2/catch.hpp>

#include "train/run_clock.hpp"

using namespace meshmoe;

TEST_CASE("run clock: evaluations due in [from, steps], the multiples and the last step", "[monitor]") {
  CHECK(evaluations_due(0, 1, 100) == 0);
  CHECK(evaluations_due(10, 1, 100) == 10);   // 10, 20, ..., 100
  CHECK(evaluations_due(10, 10, 100) == 10);  // step 10's own evaluation comes after its log line
  CHECK(evaluations_due(10, 11, 100) == 9);
  CHECK(evaluations_due(10, 1, 95) == 10);    // 10, ..., 90 and the last step 95
  CHECK(evaluations_due(10, 95, 95) == 1);
  CHECK(evaluations_due(10, 96, 95) == 0);
  CHECK(evaluations_due(1, 5, 7) == 3);
  // brute force over small cases
  for (int64_t every = 1; every <= 7; ++every)
    for (int64_t steps = 1; steps <= 20; ++steps)
      for (int64_t from = 1; from <= steps + 1; ++from) {
        int64_t n = 0;
        for (int64_t s = from; s <= steps; ++s) n += (s % every == 0 || s == steps);
        INFO("every " << every << " steps " << steps << " from " << from);
        CHECK(evaluations_due(every, from, steps) == n);
      }
}

TEST_CASE("run clock: an evaluation is out of the interval's tokens/s and in the ETA", "[monitor]") {
  // 10 s of training per 10-step interval, 1000 tokens a step; an evaluation of 40 s after step 10.
  RunClock clock(100.0);
  CHECK(clock.interval_tokens_per_s(110.0, 10000) == 1000.0);
  clock.start_interval(110.0);
  clock.add_evaluation(RunClock::kValidation, 40.0);
  // Steps 11-20 end at 160: 50 s of wall time, 40 of them the evaluation.
  CHECK(clock.interval_tokens_per_s(160.0, 10000) == 1000.0);
  clock.start_interval(160.0);
  CHECK(clock.interval_tokens_per_s(170.0, 10000) == 1000.0);  // the next interval has no evaluation left over
  // At step 30 of 100 (70 s elapsed, 40 of them evaluating): 1 s per step x 70 steps, plus the
  // evaluations at 30, 40, ..., 100 at 40 s each.
  const int64_t left[2] = {evaluations_due(10, 30, 100), 0};
  const double estimate[2] = {0.5, 0.0};
  CHECK(clock.eta(170.0, 30, 100, left, estimate) == 70.0 + 8 * 40.0);
  // Translation scores timed too: their own mean.
  clock.add_evaluation(RunClock::kTranslation, 6.0);
  clock.add_evaluation(RunClock::kTranslation, 2.0);
  const int64_t left2[2] = {0, 3};
  CHECK(clock.eta(178.0, 30, 100, left2, estimate) == 70.0 + 3 * 4.0);
}

TEST_CASE("run clock: a checkpoint's write is out of the interval's tokens/s, in the ETA's steps", "[monitor]") {
  // 10 s of training per 10-step interval, 1000 tokens a step; a checkpoint of 30 s after step 10.
  RunClock clock(100.0);
  clock.start_interval(110.0);
  clock.add_checkpoint(30.0);
  CHECK(clock.interval_tokens_per_s(150.0, 10000) == 1000.0);  // steps 11-20: 40 s, 30 of them the write
  clock.start_interval(150.0);
  CHECK(clock.interval_tokens_per_s(160.0, 10000) == 1000.0);  // nothing left over
  // At step 30 of 100: 60 s for 30 steps (checkpoints recur: they stay in the seconds per step).
  const int64_t none[2] = {0, 0};
  const double estimate[2] = {0.0, 0.0};
  CHECK(clock.eta(160.0, 30, 100, none, estimate) == 70 * 2.0);
}

TEST_CASE("run clock: an evaluation not yet timed counts at its estimate in training steps", "[monitor]") {
  RunClock clock(0.0);
  // 20 steps in 10 s: 0.5 s a step; 4 validations to come, each estimated as 6 training steps.
  const int64_t left[2] = {4, 2};
  const double estimate[2] = {6.0, 0.0};
  CHECK(clock.eta(10.0, 20, 100, left, estimate) == 80 * 0.5 + 4 * 6 * 0.5);
}
