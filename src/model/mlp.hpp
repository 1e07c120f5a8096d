// Dense feed-forward: y = dropout(act(x W_in) W_out), no biases (T5/Switch).
// w_in [M, H] for relu/gelu; for geglu its logical shape is [M, 2, H] (the same row-major bytes as
// [M, 2H]: columns [0, H) go through gelu, [H, 2H) are the linear gate, see activation.hpp), so that
// a tensor-parallel block of hidden units [h0, h0+H_l) is one contiguous block [M, 2, H_l].
// w_out [H, M].
//
// Tensor parallelism (Megatron): a rank may hold hidden units [hidden_offset, hidden_offset +
// local_hidden); the output and the input gradient are then partial sums that go through
// `tensor_allreduce` (see attention.hpp). With all hidden units local the hook is never called.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "model/activation.hpp"
#include "model/context.hpp"
#include "model/dropout.hpp"
#include "model/layer_shapes.hpp"
#include "model/params.hpp"
#include "tensor/device.hpp"

namespace meshmoe {

template <typename T>
class MLP {
 public:
  // local_hidden < 0 means all H hidden units. layer_id keys the dropout stream.
  MLP(int d_model, int d_ff, Activation act, double dropout, uint32_t layer_id, int hidden_offset = 0,
      int local_hidden = -1);
  // The hidden units of `shape` (layer_shapes.hpp).
  MLP(const FfnShape& shape, double dropout, uint32_t layer_id);

  // prefix.w_in, prefix.w_out (mlp_params, layer_shapes.hpp)
  void declare(ParamStore<T>& store, const std::string& prefix);

  // x [N, M] -> y [N, M]. x16 (optional): x's bf16 copy (bf16_bits) written by its producer (the
  // LayerNorm before: LayerNorm::output16), which the bf16 GEMMs read instead of rounding x.
  void forward(const StepContext& ctx, const T* x, T* y, int N, const uint16_t* x16 = nullptr);
  // dy [N, M] -> dx [N, M] (+=), w_in.g, w_out.g (+=); x16: the forward's
  void backward(const StepContext& ctx, const T* dy, T* dx, int N, const uint16_t* x16 = nullptr);

  // What backward reads of the last forward (activation_stash.hpp).
  template <class F>
  void saved_state(F&& f) {
    f(x_);
    f(pre_);
    f(h_);
    f(h16_);
    dropout_.saved_state(f);
  }

  ParamView<T> w_in, w_out;
  std::function<void(T*, size_t)> tensor_allreduce;  // sum over the tensor axis, in place

  bool sharded() const { return H_l_ != H_; }

 private:
  int M_, H_, h0_, H_l_, W_;  // W_ = local input-projection width (H_l or 2 H_l)
  Activation act_;
  Dropout<T> dropout_;
  Buffer<T> x_;    // [N, M]
  Buffer<T> pre_;  // [N, W]
  Buffer<T> h_;    // [N, H_l]
  // h's bf16 copy [N, H_l], written by the activation's kernel, read by the two GEMMs that read h
  // (tensor/blas.hpp bf16_operand_copies; empty otherwise)
  Buffer<uint16_t> h16_;
  Buffer<T> dy_, dh_, dpre_, dxs_;
  // bf16 copies of dy, then of dpre, for the two GEMMs that read each (tensor/blas.hpp
  // bf16_operand_copies) [N, max(M, W)]
  Buffer<uint16_t> bf16_;
};

}  // namespace meshmoe
