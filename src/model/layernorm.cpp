#include "model/layernorm.hpp"

#include <cmath>

namespace meshmoe {

template <typename T>
void LayerNorm<T>::declare(ParamStore<T>& store, const std::string& prefix) {
  store.add(prefix + ".gain", {M_}, InitKind::Ones, 1, &gain).no_weight_decay = true;
  store.add(prefix + ".bias", {M_}, InitKind::Zeros, 1, &bias).no_weight_decay = true;
}

// x [N, M] -> y [N, M]
template <typename T>
void LayerNorm<T>::forward(const StepContext& ctx, const T* x, T* y, int N) {
  if (xhat_.size() < size_t(N) * M_) xhat_.resize(size_t(N) * M_);
  if (rstd_.size() < size_t(N)) rstd_.resize(N);
  for (int n = 0; n < N; ++n) {
    const T* xr = x + size_t(n) * M_;
    // Two passes (mean, then centred variance) avoid the cancellation of E[x^2] - E[x]^2.
    T mean = 0;
    for (int m = 0; m < M_; ++m) mean += xr[m];
    mean /= T(M_);
    T var = 0;
    for (int m = 0; m < M_; ++m) var += (xr[m] - mean) * (xr[m] - mean);
    var /= T(M_);
    const T rstd = T(1) / std::sqrt(var + T(eps_));
    rstd_[n] = rstd;
    T* xh = xhat_.data() + size_t(n) * M_;
    T* yr = y + size_t(n) * M_;
    for (int m = 0; m < M_; ++m) {
      xh[m] = (xr[m] - mean) * rstd;
      yr[m] = xh[m] * gain.w[m] + bias.w[m];
    }
  }
}

// dy [N, M] -> dx [N, M] (+=); with g = dy * gain:
// dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
template <typename T>
void LayerNorm<T>::backward(const StepContext& ctx, const T* dy, T* dx, int N) {
  for (int n = 0; n < N; ++n) {
    const T* d = dy + size_t(n) * M_;
    const T* xh = xhat_.data() + size_t(n) * M_;
    T* o = dx + size_t(n) * M_;
    T mean_g = 0, mean_gx = 0;
    for (int m = 0; m < M_; ++m) {
      const T g = d[m] * gain.w[m];
      mean_g += g;
      mean_gx += g * xh[m];
      gain.g[m] += d[m] * xh[m];
      bias.g[m] += d[m];
    }
    mean_g /= T(M_);
    mean_gx /= T(M_);
    const T rstd = rstd_[n];
    for (int m = 0; m < M_; ++m) o[m] += rstd * (d[m] * gain.w[m] - mean_g - xh[m] * mean_gx);
  }
}

template class LayerNorm<float>;
template class LayerNorm<double>;

}  // namespace meshmoe
