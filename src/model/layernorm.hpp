// LayerNorm over the last dimension (Ba et al. 2016), used pre-LN: y = (x - mean) * rstd * gain + bias.
#pragma once
#include <string>

#include "model/context.hpp"
#include "model/params.hpp"
#include "tensor/device.hpp"

namespace meshmoe {

template <typename T>
class LayerNorm {
 public:
  LayerNorm(int d_model, double eps) : M_(d_model), eps_(eps) {}

  // prefix.gain [M] (Ones), prefix.bias [M] (Zeros); neither gets weight decay.
  void declare(ParamStore<T>& store, const std::string& prefix);

  // x [N, M] -> y [N, M]
  void forward(const StepContext& ctx, const T* x, T* y, int N);
  // dy [N, M] -> dx [N, M] (+=), gain.g, bias.g (+=)
  void backward(const StepContext& ctx, const T* dy, T* dx, int N);

  // What backward reads of the last forward (activation_stash.hpp).
  template <class F>
  void saved_state(F&& f) {
    f(xhat_);
    f(rstd_);
  }

  ParamView<T> gain, bias;

 private:
  int M_;
  double eps_;
  Buffer<T> xhat_;  // [N, M]
  Buffer<T> rstd_;  // [N]
  Buffer<T> partials_;  // the parameter gradients' partial sums per row chunk [2, chunks, M]
};

}  // namespace meshmoe
