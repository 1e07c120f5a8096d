// Multi-head self-attention (Vaswani et al. 2017), no biases, output dropout: causal (the decoder's)
// or, with causal = false, bidirectional within each packed example (the encoder's: every token sees
// every token of its example; attention_core.hpp).
// wq, wk, wv [M, M]: column = head*D + d; wo [M, M]: row = head*D + d; D = M / num_heads.
//
// Tensor parallelism (Megatron): a rank may hold the contiguous block of heads
// [head_offset, head_offset + local_heads): its wq/wk/wv block is [M, A_l] and its wo block [A_l, M]
// with A_l = local_heads*D (logical shapes stay [M, M]). The output projection then yields a partial
// sum over heads, and the input gradient a partial sum too; both go through `tensor_allreduce`
// (set by the parallel code to the tensor axis' all-reduce) before dropout / before being added
// to dx. With all heads local the hook is never called.
//
// Grouped-query attention (model.kv_heads < num_heads, kv_heads.hpp): wk, wv [M, kv_heads*D], this
// rank's block [M, KV_l]; the projected keys and values are repeated for the query heads
// (repeat_kv), and dk, dv summed back over each group. Key/value heads replicated over tensor
// (layer_shapes.hpp) get the sum over tensor of their dk, dv (through `tensor_allreduce`) before
// their weight gradients, so every tensor rank adds the same gradient to its copy.
//
// The core, softmax(q k^T / sqrt(D)) v of every (sequence, local head) pair, runs as [B, heads_l, T, T]
// matrices (AttentionKernel::Plain) or as the fused tiles of model/fused_attention.hpp (Fused: no
// [T, T] buffer; the forward saves each row's log-sum-exp instead of P). Rope and grouped-query
// heads are applied around the core either way.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "deck/options.hpp"
#include "model/context.hpp"
#include "model/dropout.hpp"
#include "model/fused_attention.hpp"
#include "model/layer_shapes.hpp"
#include "model/params.hpp"
#include "tensor/device.hpp"

namespace meshmoe {

template <typename T>
class CausalSelfAttention {
 public:
  // local_heads < 0 means all heads. layer_id keys the dropout stream (unique per dropout site).
  CausalSelfAttention(int d_model, int num_heads, double dropout, uint32_t layer_id, int head_offset = 0,
                      int local_heads = -1, bool causal = true);
  // The heads of `shape` (layer_shapes.hpp). rope_base > 0: rotary positions on the queries and keys
  // (model.position = rope, rope.hpp), at ctx.position (n % T_seq when null).
  CausalSelfAttention(const AttentionShape& shape, double dropout, uint32_t layer_id, bool causal = true,
                      double rope_base = 0);

  // model.attention_kernel; Plain until set (before the first forward).
  void set_kernel(AttentionKernel kernel) { kernel_ = kernel; }
  AttentionKernel kernel() const { return kernel_; }

  // prefix.wq, .wk, .wv, .wo (attention_params, layer_shapes.hpp).
  void declare(ParamStore<T>& store, const std::string& prefix);

  // x [N, M] -> y [N, M]; N = B*T tokens, B sequences of T_seq tokens each, contiguous. A query
  // attends to the keys j <= i (causal) or to all keys (bidirectional) of its own packed example
  // (ctx.segment; the whole sequence when null). x16 (optional): x's bf16 copy (bf16_bits) written
  // by its producer (the LayerNorm before: LayerNorm::output16), which the bf16 GEMMs read instead
  // of a copy rounded here; the backward then gets the same copy.
  void forward(const StepContext& ctx, const T* x, T* y, int N, int T_seq, const uint16_t* x16 = nullptr);
  // dy [N, M] -> dx [N, M] (+=), wq/wk/wv/wo .g (+=); x16: the forward's
  void backward(const StepContext& ctx, const T* dy, T* dx, int N, const uint16_t* x16 = nullptr);

  // What backward reads of the last forward (activation_stash.hpp).
  template <class F>
  void saved_state(F&& f) {
    f(seq_len_);
    f(x_);
    f(qkv_);
    f(p_);
    f(p16_);
    f(att_);
    f(lse_);
    f(segment_);
    f(rope_position_);
    dropout_.saved_state(f);
  }

  ParamView<T> wq, wk, wv, wo;
  std::function<void(T*, size_t)> tensor_allreduce;  // sum over the tensor axis, in place

  int num_heads() const { return heads_; }
  const AttentionShape& shape() const { return shape_; }
  int local_heads() const { return heads_l_; }
  bool sharded() const { return heads_l_ != heads_; }
  // Tests only: whether it attends causally (the decoder's) or within the packed example.
  bool causal() const { return causal_; }
  double rope_base() const { return rope_base_; }  // 0: no rotary positions

 private:
  void causal_attention_forward(const StepContext& ctx, const T* q, const T* k, const T* v, int B, int Tq);
  void causal_attention_backward(const T* q, const T* k, const T* v, T* dq, T* dk, T* dv, int B, int Tq);
  // x^T d into wq/wk/wv .g, and dx += the input gradient (add_projection_input_grads)
  void accumulate_input_grads(T* dx, int N, uint16_t* room, const uint16_t* x16);
  // grouped: dk, dv [N, A_l] of the repeated heads -> dkv_ [N, KV_l] each (+ their sum over tensor
  // when replicated, in dkv_sum_)
  void sum_kv_grads(int N);
  size_t backward_copies_size(int N, bool x_copy_given) const;  // bf16_'s room in the backward
  bool fused() const { return kernel_ == AttentionKernel::Fused; }
  FusedAttentionShape fused_shape(const int32_t* segment, int B) const;

  AttentionShape shape_;
  int M_, heads_, D_, h0_, heads_l_, A_l_;  // M, heads, D, head0, heads_l, A_l (layer_shapes.hpp)
  int seq_len_ = 0;
  bool causal_ = true;
  double rope_base_ = 0;
  AttentionKernel kernel_ = AttentionKernel::Plain;
  Dropout<T> dropout_;
  // saved by forward
  Buffer<T> x_;    // [N, M]
  Buffer<T> qkv_;  // q, k, v each [N, A_l] (grouped: k, v repeated for the query heads)
  Buffer<T> kv_;   // grouped: the k, v projections [N, KV_l] each, forward only
  Buffer<T> p_;    // softmax probabilities [B, heads_l, T, T] (zero above the diagonal when causal, zero across examples)
  // P and dS rounded to bf16 by their softmax rows, for the bf16 GEMMs on a device (causal mode;
  // empty otherwise: tensor/blas.hpp bf16_operand_copies)
  Buffer<uint16_t> p16_;  // [B, heads_l, T, T]
  Buffer<uint16_t> ds16_;  // [B, heads_l, T, T], backward scratch
  Buffer<T> att_;  // attention output before wo [N, A_l]
  Buffer<T> lse_;  // fused: each query row's log-sum-exp [B, heads_l, T] (instead of p_)
  // fused: the forward's segment ids [N] (ctx.segment; empty without), whose masks the backward
  // recomputes (the Transformer's copy may hold another micro-batch's by then)
  Buffer<int32_t> segment_;
  Buffer<int32_t> rope_position_;  // rope: the tokens' positions [N], for the backward's rotation
  // backward scratch
  Buffer<T> dy_, datt_, dqkv_, dxs_;
  Buffer<T> dkv_, dkv_sum_;  // grouped: dk, dv [N, KV_l] each; replicated over tensor: their sum over tensor
  Buffer<T> dp_;  // dP, then dS, of every (b, h) pair [B, heads_l, T, T]
  Buffer<T> delta_;  // fused: each query row's dO . O [B, heads_l, T]
  // bf16 copies of the operands that several GEMMs read (tensor/blas.hpp bf16_operand_copies), in
  // one pass at a time: the forward's copy of x where no producer gave one [N, M], the backward's
  // [backward_copies_size(N, ...)]
  Buffer<uint16_t> bf16_;
};

}  // namespace meshmoe
