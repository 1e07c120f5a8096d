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

  // Whether a GEMM reads the output (an attention's input projections, a dense feed-forward's
  // w_in, the head): then, where the layers keep bf16 copies of GEMM operands (tensor/blas.hpp
  // bf16_operand_copies), the forward also writes output16(), and those GEMMs read it instead of
  // rounding y themselves. Off until set.
  void set_feeds_gemms(bool on) { feeds_gemms_ = on; }
  bool feeds_gemms() const { return feeds_gemms_; }

  // x [N, M] -> y [N, M]
  void forward(const StepContext& ctx, const T* x, T* y, int N);
  // dy [N, M] -> dx [N, M] (+=), gain.g, bias.g (+=; layernorm)
  void backward(const StepContext& ctx, const T* dy, T* dx, int N);

  // What backward reads of the last forward (activation_stash.hpp).
  template <class F>
  void saved_state(F&& f) {
    f(xhat_);
    f(rstd_);
    f(y16_);
  }

  // The last forward's y rounded to bf16 (bf16_bits) [N, M], written by its rows; null where it
  // keeps no copy (set_feeds_gemms).
  const uint16_t* output16() const { return y16_.empty() ? nullptr : y16_.data(); }
  size_t output16_bytes() const { return y16_.size() * sizeof(uint16_t); }

  ParamView<T> gain, bias;  // bias: layernorm only
  NormKind kind() const { return kind_; }

 private:
  int M_;
  double eps_;
  NormKind kind_;
  bool feeds_gemms_ = false;
  Buffer<T> xhat_;  // [N, M]
  Buffer<uint16_t> y16_;  // output16(), or empty
  Buffer<T> rstd_;  // [N]
  Buffer<T> partials_;  // the parameter gradients' partial sums per row chunk [2, chunks, M] ([chunks, M]: rmsnorm)
};

}  // namespace meshmoe
