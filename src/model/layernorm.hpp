// LayerNorm over the last dimension (Ba et al. 2016), used pre-LN: y = (x - mean) * rstd * gain + bias;
// or, model.norm = rmsnorm (Zhang and Sennrich 2019; Llama, Mixtral), RMSNorm: y = x * rstd * gain with
// rstd = 1 / sqrt(mean(x^2) + eps), and no bias.
#pragma once
#include <string>

#include "deck/options.hpp"
#include "model/context.hpp"
#include "model/params.hpp"
#include "tensor/device.hpp"

namespace meshmoe {

template <typename T>
class LayerNorm {
 public:
  LayerNorm(int d_model, double eps, NormKind kind = NormKind::LayerNorm) : M_(d_model), eps_(eps), kind_(kind) {}

  // prefix.gain [M] (Ones), and with layernorm prefix.bias [M] (Zeros); neither gets weight decay.
  void declare(ParamStore<T>& store, const std::string& prefix);

  // x [N, M] -> y [N, M]
  void forward(const StepContext& ctx, const T* x, T* y, int N);
  // dy [N, M] -> dx [N, M] (+=), gain.g, bias.g (+=; layernorm)
  void backward(const StepContext& ctx, const T* dy, T* dx, int N);

  // What backward reads of the last forward (activation_stash.hpp).
  template <class F>
  void saved_state(F&& f) {
    f(xhat_);
    f(rstd_);
  }

  ParamView<T> gain, bias;  // bias: layernorm only
  NormKind kind() const { return kind_; }

 private:
  int M_;
  double eps_;
  NormKind kind_;
  Buffer<T> xhat_;  // [N, M]
  Buffer<T> rstd_;  // [N]
  Buffer<T> partials_;  // the parameter gradients' partial sums per row chunk [2, chunks, M] ([chunks, M]: rmsnorm)
};

}  // namespace meshmoe
