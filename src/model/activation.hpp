// Feed-forward activations shared by the dense MLP and the MoE experts: relu (GShard), gelu (exact
// erf form, = torch.nn.functional.gelu default) and geglu (Switch / T5.1.1, Shazeer 2020).
// Header-only so the experts need nothing else to link.
//
// Layout: the input projection produces `pre` rows of width in_width(act, H): H for relu/gelu, 2H for
// geglu, whose first H columns go through gelu and multiply the last H columns:
//   h = gelu(pre[:, :H]) * pre[:, H:]
#pragma once
#include <cmath>
#include <string>

#include "core/error.hpp"

namespace meshmoe {

enum class Activation { Relu, Gelu, Geglu };

// Deck spelling -> enum. The schema already restricts model.activation; this guards other callers.
inline Activation parse_activation(const std::string& name) {
  if (name == "relu") return Activation::Relu;
  if (name == "gelu") return Activation::Gelu;
  if (name == "geglu") return Activation::Geglu;
  throw InputError("unknown activation '" + name + "': expected relu, gelu or geglu");
}
inline const char* activation_name(Activation a) {
  return a == Activation::Relu ? "relu" : a == Activation::Gelu ? "gelu" : "geglu";
}

// Width of the input projection's output for hidden width H.
inline int activation_in_width(Activation a, int H) { return a == Activation::Geglu ? 2 * H : H; }

template <typename T>
inline T gelu(T x) {
  return T(0.5) * x * (T(1) + std::erf(x * T(M_SQRT1_2)));
}
// d gelu / dx = Phi(x) + x phi(x)
template <typename T>
inline T gelu_grad(T x) {
  const T cdf = T(0.5) * (T(1) + std::erf(x * T(M_SQRT1_2)));
  const T pdf = std::exp(T(-0.5) * x * x) * T(0.5 * M_2_SQRTPI * M_SQRT1_2);  // 1/sqrt(2 pi)
  return cdf + x * pdf;
}

// pre [N, in_width] -> h [N, H] (overwritten). Rows may be strided: ld_pre / ld_h >= their widths
// (0 = dense).
template <typename T>
void activation_forward(Activation a, const T* pre, T* h, int N, int H, int ld_pre = 0, int ld_h = 0) {
  if (ld_pre == 0) ld_pre = activation_in_width(a, H);
  if (ld_h == 0) ld_h = H;
  for (int n = 0; n < N; ++n) {
    const T* p = pre + size_t(n) * ld_pre;
    T* o = h + size_t(n) * ld_h;
    switch (a) {
      case Activation::Relu:
        for (int j = 0; j < H; ++j) o[j] = p[j] > T(0) ? p[j] : T(0);
        break;
      case Activation::Gelu:
        for (int j = 0; j < H; ++j) o[j] = gelu(p[j]);
        break;
      case Activation::Geglu:
        for (int j = 0; j < H; ++j) o[j] = gelu(p[j]) * p[H + j];
        break;
    }
  }
}

// dh [N, H], pre [N, in_width] (what forward read) -> dpre [N, in_width] (OVERWRITTEN, not added:
// it feeds a gemm next). dpre may not alias pre.
template <typename T>
void activation_backward(Activation a, const T* pre, const T* dh, T* dpre, int N, int H, int ld_pre = 0,
                         int ld_h = 0) {
  if (ld_pre == 0) ld_pre = activation_in_width(a, H);
  if (ld_h == 0) ld_h = H;
  for (int n = 0; n < N; ++n) {
    const T* p = pre + size_t(n) * ld_pre;
    const T* d = dh + size_t(n) * ld_h;
    T* o = dpre + size_t(n) * ld_pre;
    switch (a) {
      case Activation::Relu:
        for (int j = 0; j < H; ++j) o[j] = p[j] > T(0) ? d[j] : T(0);
        break;
      case Activation::Gelu:
        for (int j = 0; j < H; ++j) o[j] = d[j] * gelu_grad(p[j]);
        break;
      case Activation::Geglu:
        for (int j = 0; j < H; ++j) {
          o[j] = d[j] * gelu_grad(p[j]) * p[H + j];
          o[H + j] = d[j] * gelu(p[j]);
        }
        break;
    }
  }
}

}  // namespace meshmoe
