#include "model/dropout.hpp"

#include <stdexcept>

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
  const uint64_t per_token = (uint64_t(C) + 3) / 4;
  for (int n = 0; n < N; ++n) {
    const uint64_t g = ctx.token_offset + uint64_t(n);
    uint8_t* k = keep_.data() + size_t(n) * C;
    T* xr = x + size_t(n) * C;
    // One Philox block gives the four lanes of columns 4q .. 4q+3 (same as keep()).
    for (int q = 0; q < int(per_token); ++q) {
      const auto bits = rng.bits(g * per_token + uint64_t(q));
      for (int lane = 0; lane < 4 && 4 * q + lane < C; ++lane) {
        const double u = double(bits[lane] >> 8) * (1.0 / 16777216.0);
        const int c = 4 * q + lane;
        k[c] = u >= rate_;
        xr[c] = k[c] ? xr[c] * scale : T(0);
      }
    }
  }
}

// d [N, C] -> d [N, C] (in place)
template <typename T>
void Dropout<T>::backward(const StepContext& ctx, T* d, int N, int C) const {
  if (!was_active_) return;
  if (keep_.size() < size_t(N) * size_t(C)) throw std::logic_error("Dropout::backward without matching forward");
  const T scale = T(1.0 / (1.0 - rate_));
  const size_t NC = size_t(N) * size_t(C);
  for (size_t i = 0; i < NC; ++i) d[i] = keep_[i] ? d[i] * scale : T(0);
}

template class Dropout<float>;
template class Dropout<double>;

}  // namespace meshmoe
