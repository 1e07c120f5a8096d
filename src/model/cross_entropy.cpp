#include "model/cross_entropy.hpp"

#include <algorithm>
#include <string>

#include "core/error.hpp"
#include "model/cross_entropy_bodies.hpp"
#include "tensor/launch.hpp"

namespace meshmoe {

// logits [N, V], targets [N], mask [N] -> scalar
template <typename T>
double CrossEntropy<T>::forward(const StepContext& ctx, const T* logits, const int32_t* targets, const T* mask,
                                int N, int V, double weight, const T* soft, double alpha) {
  V_ = V;
  weight_ = weight;
  count_ = 0;
  loss_.resize(N);
  lse_.resize(std::max<size_t>(lse_.size(), N));
  mask_.assign(N, T(1));
  if (mask) std::copy(mask, mask + N, mask_.begin());
  targets_.assign(targets, targets + N);
  for (int n = 0; n < N; ++n) {
    const int32_t t = targets_[n];
    if (mask_[n] != T(0) && (t < 0 || t >= V))
      throw Error("target token " + std::to_string(t) + " outside the vocabulary [0, " + std::to_string(V) +
                  "): the data file does not match model.vocab_size");
  }
  alpha_ = alpha;
  if (soft) {
    soft_.assign(soft, soft + size_t(N) * V);
    psum_.resize(N);
    soft_loss_.resize(N);
    mixed_.resize(N);
    for_each_index(N, SoftTargetForwardRow<T>{logits, mask_.data(), soft_.data(), targets_.data(), lse_.data(), psum_.data(),
                                              mixed_.data(), loss_.data(), soft_loss_.data(), T(alpha), V},
                   3 * int64_t(V));
  } else {
    soft_.clear();
    soft_loss_.clear();
    for_each_index(N, CrossEntropyForwardRow<T>{logits, mask_.data(), targets_.data(), lse_.data(), loss_.data(), V}, V);
  }
  const Buffer<double>& objective = soft ? mixed_ : loss_;
  // The sum over tokens stays on the host, in token order.
  double total = 0;
  for (int n = 0; n < N; ++n) {
    if (mask_[n] == T(0)) continue;
    count_ += double(mask_[n]);
    total += double(mask_[n]) * objective[n];
  }
  return weight * total;
}

// -> dlogits [N, V]
template <typename T>
void CrossEntropy<T>::backward(const StepContext& ctx, const T* logits, T* dlogits, int N) {
  const bool soft = !soft_.empty();
  for_each_index_2d(N, V_, CrossEntropyBackwardElement<T>{logits, lse_.data(), mask_.data(), targets_.data(), dlogits,
                                                          T(weight_), V_, soft ? soft_.data() : nullptr,
                                                          soft ? psum_.data() : nullptr, T(alpha_)});
}

template class CrossEntropy<float>;
template class CrossEntropy<double>;

}  // namespace meshmoe
