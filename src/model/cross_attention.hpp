// Multi-head cross-attention (Vaswani et al. 2017 section 3.2.3, "encoder-decoder attention"), no
// biases, output dropout: queries from the decoder stream x [N, M], keys and values from the encoder
// output enc [N_enc, M]. Row b of the batch is one decoder sequence of Tq tokens and one encoder
// sequence of Tk tokens; a decoder token of packed example s attends to every encoder token of
// example s in the same row (segment ids of both sides; docs/ARCHITECTURE.md "Encoder-decoder").
// The weights, their layout and the tensor parallelism by heads are those of CausalSelfAttention
// (attention.hpp, attention_params): wq, wk, wv [M, M], wo [M, M]; with a block of heads the output
// and both input gradients are partial sums that go through `tensor_allreduce`.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "model/context.hpp"
#include "model/dropout.hpp"
#include "model/layer_shapes.hpp"
#include "model/params.hpp"
#include "tensor/device.hpp"

namespace meshmoe {

template <typename T>
class CrossAttention {
 public:
  // layer_id keys the dropout stream (unique per dropout site).
  CrossAttention(const AttentionShape& shape, double dropout, uint32_t layer_id);

  // prefix.wq, .wk, .wv, .wo (attention_params, layer_shapes.hpp).
  void declare(ParamStore<T>& store, const std::string& prefix);

  // x [N, M]: B = N / Tq decoder sequences, segment ids ctx.segment; enc [B*Tk, M]: the encoder
  // output, segment ids enc_segment [B*Tk] (both null: every query sees its whole row) -> y [N, M].
  // x16, enc16 (optional): x's and enc's bf16 copies (bf16_bits) written by their producers (the
  // LayerNorms before: LayerNorm::output16), which the bf16 GEMMs read instead of rounding x, or a
  // copy of enc rounded here; the backward then gets the same copies.
  void forward(const StepContext& ctx, const T* x, int Tq, const T* enc, int Tk, const int32_t* enc_segment, T* y,
               int N, const uint16_t* x16 = nullptr, const uint16_t* enc16 = nullptr);
  // dy [N, M] -> dx [N, M] (+=), denc [B*Tk, M] (+=), wq/wk/wv/wo .g (+=); x16, enc16: the forward's
  void backward(const StepContext& ctx, const T* dy, T* dx, T* denc, int N, const uint16_t* x16 = nullptr,
                const uint16_t* enc16 = nullptr);

  // What backward reads of the last forward (activation_stash.hpp).
  template <class F>
  void saved_state(F&& f) {
    f(Tq_);
    f(Tk_);
    f(x_);
    f(enc_);
    f(q_);
    f(kv_);
    f(p_);
    f(att_);
    dropout_.saved_state(f);
  }

  ParamView<T> wq, wk, wv, wo;
  std::function<void(T*, size_t)> tensor_allreduce;  // sum over the tensor axis, in place

  int num_heads() const { return heads_; }
  int local_heads() const { return heads_l_; }
  bool sharded() const { return heads_l_ != heads_; }

 private:
  size_t backward_copies_size(int N, int B, bool enc_copy_given) const;  // bf16_'s room in the backward

  int M_, heads_, D_, h0_, heads_l_, A_l_;  // M, heads, D, head0, heads_l, A_l (layer_shapes.hpp)
  int Tq_ = 0, Tk_ = 0;
  Dropout<T> dropout_;
  // saved by forward
  Buffer<T> x_;    // [N, M]
  Buffer<T> enc_;  // [B*Tk, M]
  Buffer<T> q_;    // [N, A_l]
  Buffer<T> kv_;   // k, v each [B*Tk, A_l]
  Buffer<T> p_;    // softmax probabilities [B, heads_l, Tq, Tk] (zero across examples)
  Buffer<T> att_;  // attention output before wo [N, A_l]
  // backward scratch
  Buffer<T> dy_, datt_, dq_, dkv_, dp_, dxs_;
  // bf16 copies of the operands that several GEMMs read (tensor/blas.hpp bf16_operand_copies), in
  // one pass at a time: the forward's copy of enc where no producer gave one [B*Tk, M], the
  // backward's [backward_copies_size(N, B, ...)]
  Buffer<uint16_t> bf16_;
};

}  // namespace meshmoe
