#include "model/cross_attention.hpp"

#include <algorithm>
#include <stdexcept>

#include "core/error.hpp"
#include "model/attention_core.hpp"
#include "tensor/blas.hpp"
#include "tensor/elementwise.hpp"

namespace meshmoe {

template <typename T>
static void ensure(Buffer<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

template <typename T>
CrossAttention<T>::CrossAttention(const AttentionShape& s, double dropout, uint32_t layer_id)
    : M_(s.M), heads_(s.heads), D_(s.D), h0_(s.head0), heads_l_(s.heads_l), A_l_(s.A_l), dropout_(dropout, layer_id) {}

template <typename T>
void CrossAttention<T>::declare(ParamStore<T>& store, const std::string& prefix) {
  declare_params(store, attention_params(prefix, attention_shape(M_, heads_, {h0_, heads_l_})), {&wq, &wk, &wv, &wo});
}

// x [N, M], enc [B*Tk, M] -> y [N, M]
template <typename T>
void CrossAttention<T>::forward(const StepContext& ctx, const T* x, int Tq, const T* enc, int Tk,
                                const int32_t* enc_segment, T* y, int N, const uint16_t* x16,
                                const uint16_t* enc16_in) {
  if (Tq < 1 || Tk < 1 || N % Tq != 0)
    throw Error("CrossAttention: " + std::to_string(N) + " tokens are not whole sequences of " + std::to_string(Tq));
  Tq_ = Tq, Tk_ = Tk;
  const int B = N / Tq, A_l = A_l_;
  const size_t Nk = size_t(B) * Tk, N_A = size_t(N) * A_l;
  ensure(x_, size_t(N) * M_);
  ensure(enc_, Nk * M_);
  copy_from(x_.data(), x, size_t(N) * M_);
  copy_from(enc_.data(), enc, Nk * M_);
  ensure(q_, N_A);
  ensure(kv_, 2 * Nk * A_l);
  ensure(p_, size_t(B) * heads_l_ * Tq * Tk);
  ensure(att_, N_A);
  T* k = kv_.data();
  T* v = k + Nk * A_l;
  // q [N, A_l] = x wq; k, v [B*Tk, A_l] = enc wk, enc wv; the weights' bf16 copies (ParamView::w16)
  // where the store keeps them. enc's copy is its producer's (ln_enc on this stage), else rounded
  // here: only then does the forward take room (docs/ARCHITECTURE.md "Precision").
  const uint16_t* enc16 =
      enc16_in ? enc16_in : rounded_once(enc, Nk * M_, bf16_copy_room<T>(bf16_, Nk * M_));
  matmul(false, false, N, A_l, M_, x, wq.w, q_.data(), false, x16, wq.w16);
  matmul(false, false, int(Nk), A_l, M_, enc, wk.w, k, false, enc16, wk.w16);
  matmul(false, false, int(Nk), A_l, M_, enc, wv.w, v, false, enc16, wv.w16);
  const AttentionPairs a{.B = B, .heads_l = heads_l_, .D = D_, .Tq = Tq, .Tk = Tk,
                         .query_segment = ctx.segment, .key_segment = enc_segment};
  masked_attention_forward(a, q_.data(), k, v, p_.data(), att_.data());
  // y [N, M] = att [N, A_l] wo [A_l, M]  (partial over heads when sharded)
  matmul(false, false, N, M_, A_l, att_.data(), wo.w, y, false, nullptr, wo.w16);
  if (sharded() && tensor_allreduce) tensor_allreduce(y, size_t(N) * M_);
  dropout_.forward(ctx, y, N, M_);
}

// dy [N, M] -> dx [N, M] (+=), denc [B*Tk, M] (+=)
template <typename T>
void CrossAttention<T>::backward(const StepContext& ctx, const T* dy, T* dx, T* denc, int N, const uint16_t* x16,
                                 const uint16_t* enc16_in) {
  if (Tq_ == 0) throw std::logic_error("CrossAttention::backward before forward");
  const int B = N / Tq_, A_l = A_l_, Nk = B * Tk_;
  const size_t N_A = size_t(N) * A_l;
  ensure(dy_, size_t(N) * M_);
  ensure(datt_, N_A);
  ensure(dq_, N_A);
  ensure(dkv_, 2 * size_t(Nk) * A_l);
  ensure(dp_, size_t(B) * heads_l_ * Tq_ * Tk_);
  copy_from(dy_.data(), dy, size_t(N) * M_);
  dropout_.backward(ctx, dy_.data(), N, M_);
  uint16_t* room = bf16_copy_room<T>(bf16_, backward_copies_size(N, B, enc16_in != nullptr));
  // wo.g [A_l, M] += att^T dy; datt [N, A_l] = dy wo^T
  const uint16_t* dy16 = rounded_once(dy_.data(), size_t(N) * M_, room);
  matmul(true, false, A_l, M_, N, att_.data(), dy_.data(), wo.g, true, nullptr, dy16);
  matmul(false, true, N, A_l, M_, dy_.data(), wo.w, datt_.data(), false, dy16, wo.w16);
  const T* k = kv_.data();
  const T* v = k + size_t(Nk) * A_l;
  T* dk = dkv_.data();
  T* dv = dk + size_t(Nk) * A_l;
  // The backward does not read the segment ids: P is already zero across examples.
  const AttentionPairs a{.B = B, .heads_l = heads_l_, .D = D_, .Tq = Tq_, .Tk = Tk_};
  masked_attention_backward(a, q_.data(), k, v, p_.data(), datt_.data(), dp_.data(), dq_.data(), dk, dv);
  // Copies of dq, enc (unless its producer's) and dk, dv (one span), each read by two GEMMs below
  // (dy's are done).
  const size_t NkA = size_t(Nk) * A_l, NkM = size_t(Nk) * M_;
  const uint16_t* dq16 = rounded_once(dq_.data(), N_A, room);
  const uint16_t* enc16 = enc16_in ? enc16_in : rounded_once(enc_.data(), NkM, room ? room + N_A : nullptr);
  const uint16_t* dk16 = rounded_once(dkv_.data(), 2 * NkA, room ? room + N_A + (enc16_in ? 0 : NkM) : nullptr);
  const uint16_t* dv16 = dk16 ? dk16 + NkA : nullptr;
  // wq.g += x^T dq; wk.g, wv.g += enc^T dk, enc^T dv
  matmul(true, false, M_, A_l, N, x_.data(), dq_.data(), wq.g, true, x16, dq16);
  matmul(true, false, M_, A_l, Nk, enc_.data(), dk, wk.g, true, enc16, dk16);
  matmul(true, false, M_, A_l, Nk, enc_.data(), dv, wv.g, true, enc16, dv16);
  // dx += dq wq^T; denc += dk wk^T + dv wv^T
  add_projection_input_grads<T>({{.d = dq_.data(), .w = wq.w, .d16 = dq16, .w16 = wq.w16}}, dx, N, M_, A_l,
                                tensor_allreduce, sharded(), dxs_);
  add_projection_input_grads<T>({{.d = dk, .w = wk.w, .d16 = dk16, .w16 = wk.w16},
                                 {.d = dv, .w = wv.w, .d16 = dv16, .w16 = wv.w16}},
                                denc, Nk, M_, A_l, tensor_allreduce, sharded(), dxs_);
}

// The backward's room: dy, then dq, enc (unless its producer's copy) and dk, dv; the shape table
// plans the same.
template <typename T>
size_t CrossAttention<T>::backward_copies_size(int N, int B, bool enc_copy_given) const {
  const size_t Nk = size_t(B) * Tk_;
  return std::max(size_t(N) * M_, size_t(N) * A_l_ + Nk * ((enc_copy_given ? 0 : M_) + 2 * size_t(A_l_)));
}

template class CrossAttention<float>;
template class CrossAttention<double>;

}  // namespace meshmoe
