// The feed-forward activations (model/activation.hpp) as for_each_index_2d bodies
// (tensor/launch.hpp), one index (n, j) per hidden unit j of row n. Rows may be strided (ld_pre, ld_h).
#pragma once
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/hd.hpp"
#include "deck/options.hpp"
#include "tensor/bf16.hpp"

namespace meshmoe {

template <typename T>
MESHMOE_HD inline T gelu(T x) {
  return T(0.5) * x * (T(1) + std::erf(x * T(M_SQRT1_2)));
}
// d gelu / dx = Phi(x) + x phi(x)
template <typename T>
MESHMOE_HD inline T gelu_grad(T x) {
  const T cdf = T(0.5) * (T(1) + std::erf(x * T(M_SQRT1_2)));
  const T pdf = std::exp(T(-0.5) * x * x) * T(0.5 * M_2_SQRTPI * M_SQRT1_2);  // 1/sqrt(2 pi)
  return cdf + x * pdf;
}

// silu(x) = x sigmoid(x) (swish with beta 1: torch.nn.functional.silu).
template <typename T>
MESHMOE_HD inline T silu(T x) {
  return x / (T(1) + std::exp(-x));
}
// d silu / dx = s (1 + x (1 - s)), s = sigmoid(x)
template <typename T>
MESHMOE_HD inline T silu_grad(T x) {
  const T s = T(1) / (T(1) + std::exp(-x));
  return s * (T(1) + x * (T(1) - s));
}

// h[n, j] = relu(pre[n, j]), gelu(pre[n, j]), gelu(pre[n, j]) * pre[n, H + j] (geglu) or
// silu(pre[n, j]) * pre[n, H + j] (swiglu). h16 (optional, float): h's bf16 copy (bf16_bits, h's
// layout), written with it for the bf16 GEMMs that read h (tensor/blas.hpp bf16_operand_copies).
template <typename T, Activation A>
struct ActivationForward {
  const T* pre;
  T* h;
  int H, ld_pre, ld_h;
  uint16_t* h16 = nullptr;
  MESHMOE_HD void operator()(int64_t n, int64_t j) const {
    const T* p = pre + n * ld_pre;
    T out;
    if constexpr (A == Activation::Relu)
      out = p[j] > T(0) ? p[j] : T(0);
    else if constexpr (A == Activation::Gelu)
      out = gelu(p[j]);
    else if constexpr (A == Activation::Geglu)
      out = gelu(p[j]) * p[H + j];
    else
      out = silu(p[j]) * p[H + j];
    h[n * ld_h + j] = out;
    if constexpr (std::is_same_v<T, float>)
      if (h16) h16[n * ld_h + j] = bf16_bits(out);
  }
};

// dpre[n, j] = act'(pre[n, j]) dh[n, j]; geglu and swiglu also write the linear gate's half dpre[n, H + j],
// so index (n, j) owns both halves that hidden unit j reads.
template <typename T, Activation A>
struct ActivationBackward {
  const T *pre, *dh;
  T* dpre;
  int H, ld_pre, ld_h;
  MESHMOE_HD void operator()(int64_t n, int64_t j) const {
    const T* p = pre + n * ld_pre;
    const T d = dh[n * ld_h + j];
    T* o = dpre + n * ld_pre;
    if constexpr (A == Activation::Relu) {
      o[j] = p[j] > T(0) ? d : T(0);
    } else if constexpr (A == Activation::Gelu) {
      o[j] = d * gelu_grad(p[j]);
    } else if constexpr (A == Activation::Geglu) {
      o[j] = d * gelu_grad(p[j]) * p[H + j];
      o[H + j] = d * gelu(p[j]);
    } else {
      o[j] = d * silu_grad(p[j]) * p[H + j];
      o[H + j] = d * silu(p[j]);
    }
  }
};

}  // namespace meshmoe
