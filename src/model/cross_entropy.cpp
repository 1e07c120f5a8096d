#include "model/cross_entropy.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.hpp"

namespace meshmoe {

// logits [N, V], targets [N], mask [N] -> scalar
template <typename T>
double CrossEntropy<T>::forward(const StepContext& ctx, const T* logits, const int32_t* targets, const T* mask,
                                int N, int V, double weight) {
  V_ = V;
  weight_ = weight;
  count_ = 0;
  loss_.assign(N, 0.0);
  lse_.resize(std::max<size_t>(lse_.size(), N));
  mask_.assign(N, T(1));
  if (mask) std::copy(mask, mask + N, mask_.begin());
  targets_.assign(targets, targets + N);
  double total = 0;
  for (int n = 0; n < N; ++n) {
    const T* row = logits + size_t(n) * V;
    // logsumexp shifted by the row maximum: stable for any logit scale
    const T mx = *std::max_element(row, row + V);
    T sum = 0;
    for (int v = 0; v < V; ++v) sum += std::exp(row[v] - mx);
    lse_[n] = mx + std::log(sum);
    if (mask_[n] == T(0)) continue;
    const int32_t t = targets[n];
    if (t < 0 || t >= V)
      throw Error("target token " + std::to_string(t) + " outside the vocabulary [0, " + std::to_string(V) +
                  "): the data file does not match model.vocab_size");
    loss_[n] = double(lse_[n] - row[t]);
    count_ += double(mask_[n]);
    total += double(mask_[n]) * loss_[n];
  }
  return weight * total;
}

// -> dlogits [N, V]
template <typename T>
void CrossEntropy<T>::backward(const StepContext& ctx, const T* logits, T* dlogits, int N) {
  const int V = V_;
  for (int n = 0; n < N; ++n) {
    const T* row = logits + size_t(n) * V;
    T* d = dlogits + size_t(n) * V;
    const T scale = T(weight_) * mask_[n];
    if (scale == T(0)) {
      std::fill(d, d + V, T(0));
      continue;
    }
    const T lse = lse_[n];
    for (int v = 0; v < V; ++v) d[v] = scale * std::exp(row[v] - lse);
    d[targets_[n]] -= scale;
  }
}

template class CrossEntropy<float>;
template class CrossEntropy<double>;

}  // namespace meshmoe
