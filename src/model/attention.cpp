#include "model/attention.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <type_traits>

#include "core/error.hpp"
#include "model/attention_bodies.hpp"
#include "model/attention_core.hpp"
#include "model/fused_attention.hpp"
#include "model/kv_heads.hpp"
#include "model/rope.hpp"
#include "tensor/blas.hpp"
#include "tensor/elementwise.hpp"
#include "tensor/launch_rows.hpp"

namespace meshmoe {

template <typename T>
static void ensure(Buffer<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

// The copy at `offset` elements, or null without copies.
static const uint16_t* at(const uint16_t* copy, size_t offset) { return copy ? copy + offset : nullptr; }

// Rows of the causal [T, T] matrices per GEMM. A block's GEMMs stop at its last row's causal
// edge, skipping most of the zero upper triangle; on the GPU one batched GEMM over all rows is
// cheaper than more, smaller calls.
static int causal_block(int Tq) {
  constexpr int kHostBlock = 64;
  return current_device() == Device::Cuda ? Tq : kHostBlock;
}

template <typename T>
CausalSelfAttention<T>::CausalSelfAttention(int d_model, int num_heads, double dropout, uint32_t layer_id,
                                            int head_offset, int local_heads, bool causal)
    : CausalSelfAttention(attention_shape(d_model, num_heads, {head_offset, local_heads < 0 ? num_heads : local_heads}),
                          dropout, layer_id, causal) {}

template <typename T>
CausalSelfAttention<T>::CausalSelfAttention(const AttentionShape& s, double dropout, uint32_t layer_id, bool causal,
                                            double rope_base)
    : shape_(s), M_(s.M), heads_(s.heads), D_(s.D), h0_(s.head0), heads_l_(s.heads_l), A_l_(s.A_l), causal_(causal),
      rope_base_(rope_base), dropout_(dropout, layer_id) {
  if (rope_base_ > 0 && D_ % 2 != 0)
    throw InputError("model.position = \"rope\" needs an even head width d_model / num_heads, got " + std::to_string(D_));
}

template <typename T>
void CausalSelfAttention<T>::declare(ParamStore<T>& store, const std::string& prefix) {
  declare_params(store, attention_params(prefix, shape_), {&wq, &wk, &wv, &wo});
}

// x [N, M] -> y [N, M]
template <typename T>
void CausalSelfAttention<T>::forward(const StepContext& ctx, const T* x, T* y, int N, int T_seq,
                                     const uint16_t* x16_in) {
  if (T_seq < 1 || N % T_seq != 0)
    throw Error("CausalSelfAttention: " + std::to_string(N) + " tokens are not whole sequences of " +
                std::to_string(T_seq));
  seq_len_ = T_seq;
  const int B = N / seq_len_, Tq = seq_len_, A_l = A_l_, D = D_;
  const size_t N_A = size_t(N) * A_l;
  ensure(x_, size_t(N) * M_);
  copy_from(x_.data(), x, size_t(N) * M_);
  ensure(qkv_, 3 * N_A);
  if (!fused()) ensure(p_, size_t(B) * heads_l_ * Tq * Tq);
  ensure(att_, N_A);
  T* q = qkv_.data();
  T* k = q + N_A;
  T* v = k + N_A;
  // q, k, v [N, A_l] = x [N, M] W [M, A_l]; the weights' bf16 copies (ParamView::w16) where the store
  // keeps them. x's copy is its producer's (the Transformer's ln1), else rounded here: only then does
  // the forward take room (docs/ARCHITECTURE.md "Precision").
  const uint16_t* x16 =
      x16_in ? x16_in : rounded_once(x, size_t(N) * M_, bf16_copy_room<T>(bf16_, size_t(N) * M_));
  matmul(false, false, N, A_l, M_, x, wq.w, q, false, x16, wq.w16);
  if (!shape_.grouped()) {
    matmul(false, false, N, A_l, M_, x, wk.w, k, false, x16, wk.w16);
    matmul(false, false, N, A_l, M_, x, wv.w, v, false, x16, wv.w16);
  } else {  // k, v [N, KV_l] = x W [M, KV_l], then repeated for the query heads (repeat_kv)
    const int KV_l = shape_.KV_l;
    const size_t N_KV = size_t(N) * KV_l;
    ensure(kv_, 2 * N_KV);
    matmul(false, false, N, KV_l, M_, x, wk.w, kv_.data(), false, x16, wk.w16);
    matmul(false, false, N, KV_l, M_, x, wv.w, kv_.data() + N_KV, false, x16, wv.w16);
    repeat_kv_heads(shape_, kv_.data(), k, N);
    repeat_kv_heads(shape_, kv_.data() + N_KV, v, N);
  }
  if (rope_base_ > 0) {  // rotary positions on q and k (rope.hpp)
    ensure(rope_position_, size_t(N));
    rope_positions(ctx.position, rope_position_.data(), N, Tq);
    rope_rotate(q, N, heads_l_, D, A_l, rope_position_.data(), Tq, rope_base_, false);
    rope_rotate(k, N, heads_l_, D, A_l, rope_position_.data(), Tq, rope_base_, false);
  }
  if (fused()) {
    ensure(lse_, size_t(B) * heads_l_ * Tq);
    if (ctx.segment) {
      ensure(segment_, size_t(N));
      copy_from(segment_.data(), ctx.segment, size_t(N));
    } else {
      segment_ = Buffer<int32_t>();
    }
    fused_attention_forward(fused_shape(ctx.segment, B), q, k, v, att_.data(), lse_.data());
  } else if (!causal_) {
    const AttentionPairs a{.B = B, .heads_l = heads_l_, .D = D, .Tq = Tq, .Tk = Tq,
                           .query_segment = ctx.segment, .key_segment = ctx.segment};
    masked_attention_forward(a, q, k, v, p_.data(), att_.data());
  } else {
    causal_attention_forward(ctx, q, k, v, B, Tq);
  }
  // y [N, M] = att [N, A_l] wo [A_l, M]  (partial over heads when sharded)
  matmul(false, false, N, M_, A_l, att_.data(), wo.w, y, false, nullptr, wo.w16);
  if (sharded() && tensor_allreduce) tensor_allreduce(y, size_t(N) * M_);
  dropout_.forward(ctx, y, N, M_);
}

// The fused core's shape for B sequences of this layer (its masks; bf16 operands where the GEMMs round theirs).
template <typename T>
FusedAttentionShape CausalSelfAttention<T>::fused_shape(const int32_t* segment, int B) const {
  return {.B = B, .heads_l = heads_l_, .D = D_, .Tq = seq_len_, .causal = causal_, .segment = segment,
          .bf16 = std::is_same_v<T, float> && gemm_precision() == Precision::Bf16};
}

// P and att of the causal mode from q, k, v [N, A_l] (forward's core)
template <typename T>
void CausalSelfAttention<T>::causal_attention_forward(const StepContext& ctx, const T* q, const T* k, const T* v,
                                                      int B, int Tq) {
  const AttentionPairs a{.B = B, .heads_l = heads_l_, .D = D_, .Tq = Tq, .Tk = Tq};
  const T scale = T(1) / std::sqrt(T(D_));
  const int blk = causal_block(Tq);
  const int64_t A_l = A_l_;
  // S [T, T] = scale * Q_bh [T, D] K_bh^T for every (sequence b, local head h) pair at once, then
  // the causal softmax of all B * heads_l * T rows, then O_bh [T, D] = P [T, T] V_bh [T, D]. Each
  // GEMM stops at the causal edge of its row block. The softmax masks the keys of other packed
  // examples (ctx.segment), so their probabilities are exact zeros that the backward carries through.
  for (int i0 = 0; i0 < Tq; i0 += blk) {
    const int rows = std::min(blk, Tq - i0);
    gemm_batched(false, true, rows, i0 + rows, D_, scale, heads_of(q + i0 * A_l, a, Tq), heads_of(k, a, Tq), T(0),
                 scores_of(p_.data() + size_t(i0) * Tq, a), B, heads_l_);
  }
  // Where the layers keep bf16 copies of GEMM operands (tensor/blas.hpp bf16_operand_copies), P and
  // then dS are rounded once, by the softmax row that writes them, instead of by each GEMM that reads them.
  if (bf16_operand_copies<T>()) ensure(p16_, p_.size());
  else p16_ = Buffer<uint16_t>();
  uint16_t* P16 = p16_.empty() ? nullptr : p16_.data();
  for_each_row(int64_t(B) * heads_l_ * Tq,
               AttentionCausalSoftmaxRow<T>{.P = p_.data(), .segment = ctx.segment, .Tq = Tq, .heads_l = heads_l_,
                                            .P16 = P16},
               Tq);
  for (int i0 = 0; i0 < Tq; i0 += blk) {
    const int rows = std::min(blk, Tq - i0);
    const size_t d = size_t(i0) * Tq;
    gemm_batched(false, false, rows, D_, i0 + rows, T(1), scores_of<const T>(p_.data() + d, a, at(P16, d)),
                 heads_of(v, a, Tq), T(0), heads_of(att_.data() + i0 * A_l, a, Tq), B, heads_l_);
  }
}

// dy [N, M] -> dx [N, M] (+=)
template <typename T>
void CausalSelfAttention<T>::backward(const StepContext& ctx, const T* dy, T* dx, int N, const uint16_t* x16) {
  if (seq_len_ == 0) throw std::logic_error("CausalSelfAttention::backward before forward");
  const int B = N / seq_len_, Tq = seq_len_, A_l = A_l_, D = D_;
  const size_t N_A = size_t(N) * A_l;
  ensure(dy_, size_t(N) * M_);
  ensure(datt_, N_A);
  ensure(dqkv_, 3 * N_A);
  if (!fused()) ensure(dp_, size_t(B) * heads_l_ * Tq * Tq);
  copy_from(dy_.data(), dy, size_t(N) * M_);
  dropout_.backward(ctx, dy_.data(), N, M_);
  uint16_t* room = bf16_copy_room<T>(bf16_, backward_copies_size(N, x16 != nullptr));
  // wo.g [A_l, M] += att^T dy; datt [N, A_l] = dy wo^T
  const uint16_t* dy16 = rounded_once(dy_.data(), size_t(N) * M_, room);
  matmul(true, false, A_l, M_, N, att_.data(), dy_.data(), wo.g, true, nullptr, dy16);
  matmul(false, true, N, A_l, M_, dy_.data(), wo.w, datt_.data(), false, dy16, wo.w16);
  const T* q = qkv_.data();
  const T* k = q + N_A;
  const T* v = k + N_A;
  T* dq = dqkv_.data();
  T* dk = dq + N_A;
  T* dv = dk + N_A;
  if (fused()) {
    ensure(delta_, size_t(B) * heads_l_ * Tq);
    fused_attention_backward(fused_shape(segment_.empty() ? nullptr : segment_.data(), B), q, k, v, att_.data(), lse_.data(), datt_.data(), delta_.data(), dq,
                             dk, dv);
  } else if (!causal_) {
    const AttentionPairs a{.B = B, .heads_l = heads_l_, .D = D, .Tq = Tq, .Tk = Tq,
                           .query_segment = ctx.segment, .key_segment = ctx.segment};
    masked_attention_backward(a, q, k, v, p_.data(), datt_.data(), dp_.data(), dq, dk, dv);
  } else {
    causal_attention_backward(q, k, v, dq, dk, dv, B, Tq);
  }
  if (rope_base_ > 0) {  // back through the rotation: the gradients of the projections' outputs
    rope_rotate(dq, N, heads_l_, D, A_l, rope_position_.data(), Tq, rope_base_, true);
    rope_rotate(dk, N, heads_l_, D, A_l, rope_position_.data(), Tq, rope_base_, true);
  }
  if (shape_.grouped()) sum_kv_grads(N);
  accumulate_input_grads(dx, N, room, x16);
}

// dq, dk, dv [N, A_l] of the causal mode from datt_ (backward's core)
template <typename T>
void CausalSelfAttention<T>::causal_attention_backward(const T* q, const T* k, const T* v, T* dq, T* dk, T* dv, int B,
                                                       int Tq) {
  const AttentionPairs a{.B = B, .heads_l = heads_l_, .D = D_, .Tq = Tq, .Tk = Tq};
  const T scale = T(1) / std::sqrt(T(D_));
  const int blk = causal_block(Tq);
  const int64_t A_l = A_l_;
  const T* P = p_.data();
  T* dP = dp_.data();
  const T* dO = datt_.data();
  // The forward's choice (p16_ is saved state): copies of P, then of dS too.
  const uint16_t* P16 = p16_.empty() ? nullptr : p16_.data();
  if (P16) ensure(ds16_, p16_.size());
  uint16_t* dS16 = P16 ? ds16_.data() : nullptr;
  // Every (b, h) pair at once, in row blocks that stop at the causal edge: rows past a block's last
  // row are zero in P and dS (trailing zeros of dQ's and O's sums, leading zeros of dK's and dV's).
  for (int i0 = 0; i0 < Tq; i0 += blk) {
    const int rows = std::min(blk, Tq - i0);
    const size_t r = size_t(i0) * A_l, d = size_t(i0) * Tq;
    // dP [T, T] = dO V^T; dV [T, D] = P^T dO
    gemm_batched(false, true, rows, i0 + rows, D_, T(1), heads_of(dO + r, a, Tq), heads_of(v, a, Tq), T(0),
                 scores_of(dP + d, a), B, heads_l_);
    gemm_batched(true, false, rows, D_, Tq - i0, T(1), scores_of(P + d + i0, a, at(P16, d + i0)),
                 heads_of(dO + r, a, Tq), T(0), heads_of(dv + r, a, Tq), B, heads_l_);
  }
  // softmax backward of every row: dS = P * (dP - sum_j P dP); zero above the diagonal since P is
  for_each_row(int64_t(B) * heads_l_ * Tq,
               AttentionCausalSoftmaxBackwardRow<T>{.P = P, .dP = dP, .Tq = Tq, .dS16 = dS16}, Tq);
  for (int i0 = 0; i0 < Tq; i0 += blk) {
    const int rows = std::min(blk, Tq - i0);
    const size_t r = size_t(i0) * A_l, d = size_t(i0) * Tq;
    // dQ = scale dS K; dK = scale dS^T Q
    gemm_batched(false, false, rows, D_, i0 + rows, scale, scores_of<const T>(dP + d, a, at(dS16, d)),
                 heads_of(k, a, Tq), T(0), heads_of(dq + r, a, Tq), B, heads_l_);
    gemm_batched(true, false, rows, D_, Tq - i0, scale,
                 scores_of<const T>(dP + d + i0, a, at(dS16, d + i0)), heads_of(q + r, a, Tq), T(0),
                 heads_of(dk + r, a, Tq), B, heads_l_);
  }
}

template <typename T>
void CausalSelfAttention<T>::sum_kv_grads(int N) {
  const size_t N_A = size_t(N) * A_l_, N_KV = size_t(N) * shape_.KV_l;
  ensure(dkv_, 2 * N_KV);
  const T* dk = dqkv_.data() + N_A;
  sum_kv_head_groups(shape_, dk, dkv_.data(), N);
  sum_kv_head_groups(shape_, dk + N_A, dkv_.data() + N_KV, N);
  // Replicated key/value heads: each tensor rank summed only its own query heads; the weights'
  // gradient needs every rank's (the input gradient's partial sum is reduced with the others').
  if (shape_.kv_replicated() && tensor_allreduce) {
    ensure(dkv_sum_, 2 * N_KV);
    copy_from(dkv_sum_.data(), dkv_.data(), 2 * N_KV);
    tensor_allreduce(dkv_sum_.data(), 2 * N_KV);
  }
}

// From dq, dk, dv in dqkv_ (grouped: dk, dv in dkv_); room: the backward's bf16_copy_room (dy's copy
// is done with); x16: x's copy from its producer, or null (then rounded into the room).
template <typename T>
void CausalSelfAttention<T>::accumulate_input_grads(T* dx, int N, uint16_t* room, const uint16_t* x16_in) {
  const int A_l = A_l_;
  const size_t N_M = size_t(N) * M_, N_A = size_t(N) * A_l;
  // Copies of x (unless its producer's) and of dq, dk, dv (one span, after x's own), each read by two
  // or three GEMMs below.
  const uint16_t* x16 = x16_in ? x16_in : rounded_once(x_.data(), N_M, room);
  uint16_t* d_room = room && !x16_in ? room + N_M : room;
  if (shape_.grouped()) {
    const int KV_l = shape_.KV_l;
    const size_t N_KV = size_t(N) * KV_l;
    const T* dq = dqkv_.data();
    const T* dk = dkv_.data();
    const T* dv = dk + N_KV;
    const uint16_t* dq16 = rounded_once(dq, N_A, d_room);
    const uint16_t* dk16 = rounded_once(dk, 2 * N_KV, d_room ? d_room + N_A : nullptr);
    const uint16_t* dv16 = dk16 ? dk16 + N_KV : nullptr;
    // The weights' gradients read the sum over tensor of replicated heads (its bf16 rounding done by the GEMM).
    const bool summed = !dkv_sum_.empty() && shape_.kv_replicated() && tensor_allreduce;
    const T* dk_w = summed ? dkv_sum_.data() : dk;
    const T* dv_w = summed ? dkv_sum_.data() + N_KV : dv;
    matmul(true, false, M_, A_l, N, x_.data(), dq, wq.g, true, x16, dq16);
    matmul(true, false, M_, KV_l, N, x_.data(), dk_w, wk.g, true, x16, summed ? nullptr : dk16);
    matmul(true, false, M_, KV_l, N, x_.data(), dv_w, wv.g, true, x16, summed ? nullptr : dv16);
    add_projection_input_grads<T>({{.d = dq, .w = wq.w, .d16 = dq16, .width = A_l, .w16 = wq.w16},
                                   {.d = dk, .w = wk.w, .d16 = dk16, .width = KV_l, .w16 = wk.w16},
                                   {.d = dv, .w = wv.w, .d16 = dv16, .width = KV_l, .w16 = wv.w16}},
                                  dx, N, M_, A_l, tensor_allreduce, sharded(), dxs_);
    return;
  }
  const T* dq = dqkv_.data();
  const T* dk = dq + N_A;
  const T* dv = dk + N_A;
  const uint16_t* dq16 = rounded_once(dq, 3 * N_A, d_room);
  const uint16_t* dk16 = dq16 ? dq16 + N_A : nullptr;
  const uint16_t* dv16 = dk16 ? dk16 + N_A : nullptr;
  // W.g [M, A_l] += x^T dW-input; dx [N, M] += dq wq^T + dk wk^T + dv wv^T
  matmul(true, false, M_, A_l, N, x_.data(), dq, wq.g, true, x16, dq16);
  matmul(true, false, M_, A_l, N, x_.data(), dk, wk.g, true, x16, dk16);
  matmul(true, false, M_, A_l, N, x_.data(), dv, wv.g, true, x16, dv16);
  add_projection_input_grads<T>({{.d = dq, .w = wq.w, .d16 = dq16, .w16 = wq.w16},
                                 {.d = dk, .w = wk.w, .d16 = dk16, .w16 = wk.w16},
                                 {.d = dv, .w = wv.w, .d16 = dv16, .w16 = wv.w16}},
                                dx, N, M_, A_l, tensor_allreduce, sharded(), dxs_);
}

// The backward's room: dy, then x (unless its producer's copy) and dq, dk, dv (grouped: dk, dv
// [N, KV_l]); the shape table plans the same.
template <typename T>
size_t CausalSelfAttention<T>::backward_copies_size(int N, bool x_copy_given) const {
  const size_t grads = shape_.grouped() ? size_t(A_l_) + 2 * size_t(shape_.KV_l) : 3 * size_t(A_l_);
  return size_t(N) * std::max(size_t(M_), (x_copy_given ? 0 : size_t(M_)) + grads);
}

template class CausalSelfAttention<float>;
template class CausalSelfAttention<double>;

}  // namespace meshmoe
