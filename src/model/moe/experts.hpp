// The experts of one MoE layer: E_local position-wise feed-forward networks without biases,
// FFN_e(x) = act(x W_in[e]) W_out[e] (GShard Algorithm 2 lines 4-6) over each expert's buffer rows,
// each GEMM role one grouped call over the local experts (tensor/blas.hpp gemm_grouped;
// docs/ARCHITECTURE.md "MoE launches"). Expert dropout (Switch section 2.4) on the hidden layer.
//
// Holds experts [e0, e0 + E_local) of the layer's E and hidden units [h0, h0 + H_local) of each
// (Switch section 5.5 expert + model parallelism: H split over the tensor axis, like the dense MLP);
// the weights are registered as that block of the logical tensors (ParamStore::add_block), so a
// sharded layer initialises and checkpoints exactly as the unsharded one:
//   w_in  [E, M, H] (relu, gelu) or [E, M, 2, H] (geglu: the same bytes as [E, M, 2H], see mlp.hpp),
//   w_out [E, H, M].
// With the hidden units split, the output and the input gradient are partial sums over the tensor
// ranks: one all-reduce each over `tensor` (Switch Figure 6 / Megatron's f and g).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "mesh/comm.hpp"
#include "model/context.hpp"
#include "model/layer_shapes.hpp"
#include "model/moe/moe_options.hpp"
#include "model/params.hpp"
#include "tensor/device.hpp"

namespace meshmoe {

// Every expert and hidden unit of the layer on this rank (the single-rank layer).
inline ExpertShape all_experts(const MoeOptions& opt) {
  return {opt.num_experts, 0, opt.num_experts, ffn_shape(opt.d_model, opt.d_ff, opt.activation, whole(opt.d_ff)),
          kShardNone};
}

// The rows the local experts run on in one forward, as a token dispatcher hands them over
// (token_dispatcher.hpp): the rows of local expert 0, then of expert 1, ..., in the dispatcher's
// buffers.
template <typename T>
struct ExpertRows {
  const T* x = nullptr;            // [rows, M] input
  T* y = nullptr;                  // [rows, M] room for the output (overwritten)
  std::span<const int> count;      // [E_local] rows of each local expert
  const int64_t* token = nullptr;  // [rows] global token of each row, -1 for an empty slot
  // Rows of the full [E_local, sources x G x C] layout, that the buffers keep room for (capacity
  // routing, MoeLayer's reserve; 0 until a capacity-routed pass).
  size_t room = 0;
  // [rows, M] x's bf16 copy (bf16_bits), written by the dispatcher's gather where the experts'
  // GEMMs read copies (tensor/blas.hpp bf16_operand_copies); null otherwise.
  const uint16_t* x16 = nullptr;
};

// The experts' rows of one backward, in the forward's row order: the gradient of their output and
// of their input (zeroed by the dispatcher, added to).
template <typename T>
struct ExpertGradRows {
  const T* dy = nullptr;  // [rows, M]
  T* dx = nullptr;        // [rows, M]
};

template <typename T>
class Experts {
 public:
  // Tests only: the expert-side input rows of the last forward (kept for backward).
  const Buffer<T>& input() const { return x_; }
  // This rank's experts and hidden units (layer_shapes.hpp; the default: all of them). tensor: sums
  // the partial outputs when the hidden units are split (required then).
  explicit Experts(const MoeOptions& opt, const ExpertShape& shape = {}, Comm* tensor = nullptr);

  // prefix.w_in, prefix.w_out (expert_params, layer_shapes.hpp).
  void declare(ParamStore<T>& store, const std::string& prefix);

  // x [rows, M] -> y [rows, M] (overwritten), the rows of local expert el being the rows[el] rows
  // after those of experts < el (rows.size() == E_local).
  // row_token [sum rows]: global index of the token in each row, -1 for an empty row (keys the
  // expert dropout, so sharding cannot change it). x16 (optional): x's bf16 copy, which the first
  // GEMM reads and the backward's copy of x takes; where the GEMMs read copies and none is given,
  // the experts round x as they keep it.
  void forward(const StepContext& ctx, const T* x, T* y, std::span<const int> rows, const int64_t* row_token,
               const uint16_t* x16 = nullptr);
  // The rows a token dispatcher hands over: their room reserved (when the dispatcher keeps one),
  // then forward(ctx, rows.x, rows.y, rows.count, rows.token, rows.x16).
  void forward(const StepContext& ctx, const ExpertRows<T>& rows);
  // The same with R rows for every expert (x [E_local, R, M]).
  void forward(const StepContext& ctx, const T* x, T* y, int R, const int64_t* row_token);
  // Room for `rows` input rows in the buffers of forward and (from the next backward on) backward,
  // so that a step below it does not reallocate.
  void reserve(size_t rows);
  // dy [rows, M] -> dx [rows, M] (added), w_in.g, w_out.g (added); the row layout of the last forward.
  void backward(const StepContext& ctx, const T* dy, T* dx);
  void backward(const StepContext& ctx, const ExpertGradRows<T>& rows) { backward(ctx, rows.dy, rows.dx); }

  // What backward reads of the last forward (activation_stash.hpp).
  template <class F>
  void saved_state(F&& f) {
    f(start_);
    f(x_);
    f(x16_);
    f(pre_);
    f(h_);
    f(h16_);
    f(mask_);
  }

  // Tests only: this rank's first expert and its number of experts (e0, E_l).
  int e0() const { return e0_; }
  int e_local() const { return e_local_; }
  bool hidden_split() const { return H_l_ != opt_.d_ff; }
  ParamView<T> w_in, w_out;

 private:
  MoeOptions opt_;
  ExpertShape shape_;
  int e0_, e_local_, h0_, H_l_, W_;  // shape_'s e0, E_l, h0, H_l, W_l (H_l or 2 H_l)
  Comm* tensor_;
  std::vector<size_t> start_;  // [E_local + 1] first row of each local expert
  Buffer<T> x_;     // [rows, M] input
  Buffer<T> pre_;   // [rows, W] pre-activation
  Buffer<T> h_;     // [rows, H_l] activation after dropout; backward overwrites it with dh
  Buffer<T> mask_;  // [rows, H_l] dropout scale: 0 or 1/(1-p) (empty without dropout)
  Buffer<T> dxs_;   // [rows, M] partial input gradient (hidden split only)
  Buffer<T> dpre_;  // backward scratch: [rows, W]
  // bf16 copies of the GEMM operands where the GEMMs read copies (tensor/blas.hpp
  // bf16_operand_copies; empty otherwise): x's [rows, M] (kept with x) and h's [rows, H_l] (written
  // by the activation's kernel, or by the dropout scale's after it), saved; the backward's dy, then
  // dpre, in one room [rows, max(M, W)], scratch. The weights' are the store's (ParamView::w16).
  Buffer<uint16_t> x16_, h16_, bf16_;
  size_t reserve_rows_ = 0;
};

}  // namespace meshmoe
