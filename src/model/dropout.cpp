#include "model/dropout.hpp"

#include <stdexcept>

#include "model/dropout_bodies.hpp"
#include "tensor/launch.hpp"

namespace meshmoe {

// x [N, C] -> x [N, C] (in place)
template <typename T>
void Dropout<T>::forward(const StepContext& ctx, T* x, int N, int C) {
  was_active_ = active(ctx);
  if (!was_active_) return;
  const Rng rng{ctx.seed, ctx.step, layer_, purpose_};
  const T scale = T(1.0 / (1.0 - rate_));
  const size_t NC = size_t(N) * size_t(C);
  if (keep_.size() < NC) keep_.resize(NC);
  const int per_token = (C + 3) / 4;
  for_each_index_2d(N, per_token,
                    DropoutForwardBlock<T>{.rng = rng,
                                           .token_offset = ctx.token_offset,
                                           .x = x,
                                           .keep = keep_.data(),
                                           .C = C,
                                           .per_token = per_token,
                                           .rate = rate_,
                                           .scale = scale});
}

// d [N, C] -> d [N, C] (in place)
template <typename T>
void Dropout<T>::backward(const StepContext& ctx, T* d, int N, int C) const {
  if (!was_active_) return;
  if (keep_.size() < size_t(N) * size_t(C)) throw std::logic_error("Dropout::backward without matching forward");
  const T scale = T(1.0 / (1.0 - rate_));
  for_each_index(int64_t(N) * C, DropoutBackwardElement<T>{keep_.data(), d, scale});
}

template class Dropout<float>;
template class Dropout<double>;

}  // namespace meshmoe
