#include "model/cross_entropy.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <type_traits>
#include <string>

#include "core/error.hpp"
#include "model/cross_entropy_bodies.hpp"
#include "tensor/launch.hpp"
#include "tensor/launch_rows.hpp"
#include "tensor/step_scalars.hpp"

namespace meshmoe {

// logits [N, V], targets [N], mask [N] -> scalar
template <typename T>
double CrossEntropy<T>::forward(const StepContext& ctx, const T* logits, const int32_t* targets, const T* mask,
                                int N, int V, double weight, const T* soft, double alpha) {
  return run_forward(logits, targets, mask, N, V, weight, soft, alpha, nullptr);
}

// logits [N, V] -> scalar; logits <- dlogits [N, V]
template <typename T>
double CrossEntropy<T>::forward_with_gradient(const StepContext& ctx, T* logits, const int32_t* targets,
                                              const T* mask, int N, int V, double weight, const T* soft,
                                              double alpha) {
  return run_forward(logits, targets, mask, N, V, weight, soft, alpha, logits);
}

template <typename T>
double CrossEntropy<T>::run_forward(const T* logits, const int32_t* targets, const T* mask, int N, int V,
                                    double weight, const T* soft, double alpha, T* dlogits) {
  V_ = V;
  weight_ = weight;
  gradient_done_ = dlogits != nullptr;
  lse_.resize(std::max<size_t>(lse_.size(), N));
  // Transfer points: the host checks the targets and uploads them and the mask.
  host_mask_.assign(size_t(N), T(1));
  if (mask) std::copy(mask, mask + N, host_mask_.begin());
  upload(mask_, host_mask_.data(), size_t(N));
  upload(targets_, targets, size_t(N));
  for (int n = 0; n < N; ++n) {
    const int32_t t = targets[n];
    if (host_mask_[size_t(n)] != T(0) && (t < 0 || t >= V))
      throw Error("target token " + std::to_string(t) + " outside the vocabulary [0, " + std::to_string(V) +
                  "): the data file does not match model.vocab_size");
  }
  alpha_ = alpha;
  // Each row body alone, or followed by its row of dlogits.
  const auto run_rows = [&](const auto& row, int64_t work) {
    if (dlogits)
      for_each_row(N, CrossEntropyWithGradientRow<std::decay_t<decltype(row)>, T>{row, backward_body(logits, dlogits)},
                   work + 2 * int64_t(V));
    else
      for_each_row(N, row, work);
  };
  if (soft) {
    soft_.resize(size_t(N) * V);  // a copy on the device (the teacher's probabilities are device work)
    copy_buffer_bytes(soft_.data(), soft, soft_.size() * sizeof(T));
    psum_.resize(N);
    losses_.resize(3 * size_t(N));
    double* const hard = losses_.data();
    run_rows(SoftTargetForwardRow<T>{.logits = logits,
                                     .mask = mask_.data(),
                                     .soft = soft_.data(),
                                     .targets = targets_.data(),
                                     .lse = lse_.data(),
                                     .psum = psum_.data(),
                                     .loss = hard + 2 * N,
                                     .hard = hard,
                                     .soft_loss = hard + N,
                                     .alpha = T(alpha),
                                     .V = V},
             3 * int64_t(V));
  } else {
    soft_.clear();
    losses_.resize(N);
    run_rows(CrossEntropyForwardRow<T>{.logits = logits,
                                       .mask = mask_.data(),
                                       .targets = targets_.data(),
                                       .lse = lse_.data(),
                                       .loss = losses_.data(),
                                       .V = V},
             V);
  }
  // The sum over tokens stays on the host, in token order (a transfer point: the per-token losses,
  // one copy; while a training step collects its scalars, at their one read: StepScalars).
  sum_ = std::numeric_limits<double>::quiet_NaN();
  const int rows = soft ? 3 : 1;
  step_scalars().defer(losses_.data(), losses_.size() * sizeof(double),
                       [this, mask = host_mask_, rows, N, weight](const void* host) {
                         const double* losses = static_cast<const double*>(host);
                         host_losses_.assign(losses, losses + size_t(rows) * N);
                         loss_rows_ = rows;
                         const std::span<const double> objective = host_losses(rows == 3 ? 2 : 0);
                         double total = 0;
                         count_ = 0;
                         for (int n = 0; n < N; ++n) {
                           const T m = mask[size_t(n)];
                           if (m == T(0)) continue;
                           count_ += double(m);
                           total += double(m) * objective[size_t(n)];
                         }
                         sum_ = weight * total;
                       });
  return sum_;
}

template <typename T>
std::span<const double> CrossEntropy<T>::host_losses(int row) const {
  const size_t n = host_losses_.size() / size_t(loss_rows_);
  return {host_losses_.data() + size_t(row) * n, n};
}

// The gradient body of the last forward's state (plain or soft targets).
template <typename T>
CrossEntropyBackwardElement<T> CrossEntropy<T>::backward_body(const T* logits, T* dlogits) const {
  const bool soft = !soft_.empty();
  return CrossEntropyBackwardElement<T>{.logits = logits,
                                        .lse = lse_.data(),
                                        .mask = mask_.data(),
                                        .targets = targets_.data(),
                                        .dlogits = dlogits,
                                        .weight = T(weight_),
                                        .V = V_,
                                        .soft = soft ? soft_.data() : nullptr,
                                        .psum = soft ? psum_.data() : nullptr,
                                        .alpha = T(alpha_)};
}

// -> dlogits [N, V]
template <typename T>
void CrossEntropy<T>::backward(const StepContext& ctx, const T* logits, T* dlogits, int N) {
  if (gradient_done_) {
    if (dlogits != logits) throw std::logic_error("CrossEntropy::backward after forward_with_gradient: dlogits must be the logits it overwrote");
    return;
  }
  for_each_index_2d(N, V_, backward_body(logits, dlogits));
}

template class CrossEntropy<float>;
template class CrossEntropy<double>;

}  // namespace meshmoe
