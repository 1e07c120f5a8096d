// Inverted dropout (Srivastava et al. 2014) keyed by the global token index: element (token g,
// column c) is kept when Rng{seed, step, layer, purpose}.uniform_double(g * ceil(C/4) + c/4, lane c%4) >= rate,
// so a sharded run drops exactly the elements the single-rank run drops (docs/ARCHITECTURE.md "Principles" 1).
// Active only when ctx.training and rate > 0.
#pragma once
#include <cstdint>

#include "core/philox.hpp"
#include "model/context.hpp"
#include "tensor/device.hpp"

namespace meshmoe {

template <typename T>
class Dropout {
 public:
  Dropout() = default;
  // layer_id must be unique per dropout site (it keys the random stream).
  Dropout(double rate, uint32_t layer_id, RngPurpose purpose = RngPurpose::Dropout)
      : rate_(rate), layer_(layer_id), purpose_(purpose) {}

  bool active(const StepContext& ctx) const { return ctx.training && rate_ > 0; }

  // x [N, C] in place: x = x * keep / (1 - rate). Saves the keep mask for backward.
  void forward(const StepContext& ctx, T* x, int N, int C);
  // d [N, C] in place: d = d * keep / (1 - rate), with the mask of the last forward.
  void backward(const StepContext& ctx, T* d, int N, int C) const;

  // What backward reads of the last forward (activation_stash.hpp).
  template <class F>
  void saved_state(F&& f) {
    f(was_active_);
    f(keep_);
  }

 private:
  double rate_ = 0;
  uint32_t layer_ = 0;
  RngPurpose purpose_ = RngPurpose::Dropout;
  bool was_active_ = false;
  Buffer<uint8_t> keep_;  // [N, C]
};

}  // namespace meshmoe
