// Feed-forward activations shared by the dense MLP and the MoE experts: relu (GShard), gelu (exact
// erf form, = torch.nn.functional.gelu default), geglu (Switch / T5.1.1, Shazeer 2020) and swiglu
// (Shazeer 2020; Llama, Mixtral: w2(silu(w1 x) * w3 x)).
// Header-only, with the per-element bodies (and gelu itself) in model/activation_bodies.hpp and
// their GPU instantiations in model/activation.cu.
//
// Layout: the input projection produces `pre` rows of width in_width(act, H): H for relu/gelu, 2H for
// the gated ones (geglu, swiglu), whose first H columns (W1's) go through gelu or silu and multiply
// the last H columns (W3's, the linear gate):
//   h = gelu(pre[:, :H]) * pre[:, H:]   or   h = silu(pre[:, :H]) * pre[:, H:]
#pragma once
#include <cstdint>
#include <string>

#include "core/error.hpp"
#include "model/activation_bodies.hpp"
#include "tensor/launch.hpp"

namespace meshmoe {

// A gated activation: its input projection holds W1 and W3 side by side ([M, 2, H]).
inline bool activation_gated(Activation a) { return a == Activation::Geglu || a == Activation::Swiglu; }
// Width of the input projection's output for hidden width H.
inline int activation_in_width(Activation a, int H) { return activation_gated(a) ? 2 * H : H; }

// pre [N, in_width] -> h [N, H] (overwritten). Rows may be strided: ld_pre / ld_h >= their widths
// (0 = dense). h16 (optional): h's bf16 copy, written by the same kernel (ActivationForward).
template <typename T>
void activation_forward(Activation a, const T* pre, T* h, int N, int H, int ld_pre = 0, int ld_h = 0,
                        uint16_t* h16 = nullptr) {
  if (ld_pre == 0) ld_pre = activation_in_width(a, H);
  if (ld_h == 0) ld_h = H;
  switch (a) {
    case Activation::Relu:
      return for_each_index_2d(
          N, H, ActivationForward<T, Activation::Relu>{.pre = pre, .h = h, .H = H, .ld_pre = ld_pre, .ld_h = ld_h, .h16 = h16});
    case Activation::Gelu:
      return for_each_index_2d(
          N, H, ActivationForward<T, Activation::Gelu>{.pre = pre, .h = h, .H = H, .ld_pre = ld_pre, .ld_h = ld_h, .h16 = h16});
    case Activation::Geglu:
      return for_each_index_2d(
          N, H, ActivationForward<T, Activation::Geglu>{.pre = pre, .h = h, .H = H, .ld_pre = ld_pre, .ld_h = ld_h, .h16 = h16});
    case Activation::Swiglu:
      return for_each_index_2d(
          N, H, ActivationForward<T, Activation::Swiglu>{.pre = pre, .h = h, .H = H, .ld_pre = ld_pre, .ld_h = ld_h, .h16 = h16});
  }
}

// dh [N, H], pre [N, in_width] (what forward read) -> dpre [N, in_width] (OVERWRITTEN, not added:
// it feeds a gemm next). dpre may not alias pre.
template <typename T>
void activation_backward(Activation a, const T* pre, const T* dh, T* dpre, int N, int H, int ld_pre = 0,
                         int ld_h = 0) {
  if (ld_pre == 0) ld_pre = activation_in_width(a, H);
  if (ld_h == 0) ld_h = H;
  switch (a) {
    case Activation::Relu:
      return for_each_index_2d(N, H, ActivationBackward<T, Activation::Relu>{
                                         .pre = pre, .dh = dh, .dpre = dpre, .H = H, .ld_pre = ld_pre, .ld_h = ld_h});
    case Activation::Gelu:
      return for_each_index_2d(N, H, ActivationBackward<T, Activation::Gelu>{
                                         .pre = pre, .dh = dh, .dpre = dpre, .H = H, .ld_pre = ld_pre, .ld_h = ld_h});
    case Activation::Geglu:
      return for_each_index_2d(N, H, ActivationBackward<T, Activation::Geglu>{
                                         .pre = pre, .dh = dh, .dpre = dpre, .H = H, .ld_pre = ld_pre, .ld_h = ld_h});
    case Activation::Swiglu:
      return for_each_index_2d(N, H, ActivationBackward<T, Activation::Swiglu>{
                                         .pre = pre, .dh = dh, .dpre = dpre, .H = H, .ld_pre = ld_pre, .ld_h = ld_h});
  }
}

}  // namespace meshmoe
