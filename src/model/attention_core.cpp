#include "model/attention_core.hpp"

#include <cmath>
#include <stdexcept>

#include "model/attention_bodies.hpp"
#include "tensor/blas.hpp"
#include "tensor/elementwise.hpp"
#include "tensor/launch_rows.hpp"

namespace meshmoe {

namespace {
void check_segments(const AttentionPairs& a) {
  if ((a.query_segment == nullptr) != (a.key_segment == nullptr))
    throw std::logic_error("masked attention: segment ids on one side only");
}
}  // namespace

// Every (sequence b, local head h) pair at once: S_bh [Tq, Tk] = scale Q_bh K_bh^T, the masked
// softmax of all B * heads_l * Tq rows, O_bh [Tq, D] = P_bh V_bh.
template <typename T>
void masked_attention_forward(const AttentionPairs& a, const T* q, const T* k, const T* v, T* P, T* O) {
  check_segments(a);
  const T scale = T(1) / std::sqrt(T(a.D));
  gemm_batched(false, true, a.Tq, a.Tk, a.D, scale, heads_of(q, a, a.Tq), heads_of(k, a, a.Tk), T(0), scores_of(P, a),
               a.B, a.heads_l);
  for_each_row(int64_t(a.B) * a.heads_l * a.Tq,
               AttentionMaskedSoftmaxRow<T>{.P = P, .query_segment = a.query_segment, .key_segment = a.key_segment,
                                            .Tq = a.Tq, .Tk = a.Tk, .heads_l = a.heads_l},
               a.Tk);
  gemm_batched(false, false, a.Tq, a.D, a.Tk, T(1), scores_of<const T>(P, a), heads_of(v, a, a.Tk), T(0),
               heads_of(O, a, a.Tq), a.B, a.heads_l);
}

template <typename T>
void masked_attention_backward(const AttentionPairs& a, const T* q, const T* k, const T* v, const T* P, const T* dO,
                               T* dP, T* dq, T* dk, T* dv) {
  check_segments(a);
  const T scale = T(1) / std::sqrt(T(a.D));
  // dP [Tq, Tk] = dO V^T; dV [Tk, D] = P^T dO
  gemm_batched(false, true, a.Tq, a.Tk, a.D, T(1), heads_of(dO, a, a.Tq), heads_of(v, a, a.Tk), T(0), scores_of(dP, a),
               a.B, a.heads_l);
  gemm_batched(true, false, a.Tk, a.D, a.Tq, T(1), scores_of(P, a), heads_of(dO, a, a.Tq), T(0), heads_of(dv, a, a.Tk),
               a.B, a.heads_l);
  // softmax backward of every row: dS = P * (dP - sum_j P dP), zero where P is (masked keys)
  for_each_row(int64_t(a.B) * a.heads_l * a.Tq, AttentionSoftmaxBackwardRow<T>{P, dP, a.Tk}, a.Tk);
  // dQ = scale dS K; dK = scale dS^T Q
  gemm_batched(false, false, a.Tq, a.D, a.Tk, scale, scores_of<const T>(dP, a), heads_of(k, a, a.Tk), T(0),
               heads_of(dq, a, a.Tq), a.B, a.heads_l);
  gemm_batched(true, false, a.Tk, a.D, a.Tq, scale, scores_of<const T>(dP, a), heads_of(q, a, a.Tq), T(0),
               heads_of(dk, a, a.Tk), a.B, a.heads_l);
}

template <typename T>
void add_projection_input_grads(std::initializer_list<ProjectionGrad<T>> grads, T* dx, int N, int M, int A_l,
                                const std::function<void(T*, size_t)>& tensor_allreduce, bool sharded,
                                Buffer<T>& scratch) {
  if (sharded && tensor_allreduce) {
    if (scratch.size() < size_t(N) * M) scratch.resize(size_t(N) * M);
    bool first = true;
    for (const ProjectionGrad<T>& g : grads) {
      matmul(false, true, N, M, g.width > 0 ? g.width : A_l, g.d, g.w, scratch.data(), !first, g.d16, g.w16);
      first = false;
    }
    tensor_allreduce(scratch.data(), size_t(N) * M);
    add_into(dx, scratch.data(), size_t(N) * M);
  } else {
    for (const ProjectionGrad<T>& g : grads)
      matmul(false, true, N, M, g.width > 0 ? g.width : A_l, g.d, g.w, dx, true, g.d16, g.w16);
  }
}

#define MESHMOE_ATTENTION_CORE(T)                                                                               \
  template void masked_attention_forward<T>(const AttentionPairs&, const T*, const T*, const T*, T*, T*);       \
  template void masked_attention_backward<T>(const AttentionPairs&, const T*, const T*, const T*, const T*,     \
                                             const T*, T*, T*, T*, T*);                                          \
  template void add_projection_input_grads<T>(std::initializer_list<ProjectionGrad<T>>, T*, int, int, int,      \
                                              const std::function<void(T*, size_t)>&, bool, Buffer<T>&);
MESHMOE_ATTENTION_CORE(float)
MESHMOE_ATTENTION_CORE(double)
#undef MESHMOE_ATTENTION_CORE

}  // namespace meshmoe
