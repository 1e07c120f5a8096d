#include "model/attention_core.hpp"

#include <cmath>
#include <stdexcept>

#include "model/attention_bodies.hpp"
#include "tensor/blas.hpp"
#include "tensor/elementwise.hpp"
#include "tensor/launch.hpp"

namespace meshmoe {

namespace {
// Offsets of pair bh = b * heads_l + h in the query-side and key-side [., A_l] buffers.
struct PairOffsets {
  size_t query, key, scores;
};
PairOffsets pair_offsets(const AttentionPairs& a, int64_t bh) {
  const int64_t A_l = int64_t(a.heads_l) * a.D, b = bh / a.heads_l, h = bh % a.heads_l;
  return {size_t(b * a.Tq * A_l + h * a.D), size_t(b * a.Tk * A_l + h * a.D), size_t(bh) * a.Tq * a.Tk};
}
void check_segments(const AttentionPairs& a) {
  if ((a.query_segment == nullptr) != (a.key_segment == nullptr))
    throw std::logic_error("masked attention: segment ids on one side only");
}
}  // namespace

template <typename T>
void masked_attention_forward(const AttentionPairs& a, const T* q, const T* k, const T* v, T* P, T* O) {
  check_segments(a);
  const int A_l = a.heads_l * a.D, Tq = a.Tq, Tk = a.Tk, D = a.D;
  const T scale = T(1) / std::sqrt(T(D));
  // S_bh [Tq, Tk] = scale Q_bh K_bh^T, one independent task per (sequence b, local head h)
  for_each_task(int64_t(a.B) * a.heads_l, [&](int64_t bh) {
    const PairOffsets o = pair_offsets(a, bh);
    gemm(false, true, Tq, Tk, D, scale, q + o.query, A_l, k + o.key, A_l, T(0), P + o.scores, Tk);
  });
  for_each_index(int64_t(a.B) * a.heads_l * Tq,
                 AttentionMaskedSoftmaxRow<T>{P, a.query_segment, a.key_segment, Tq, Tk, a.heads_l}, Tk);
  // O_bh [Tq, D] = P_bh [Tq, Tk] V_bh [Tk, D]
  for_each_task(int64_t(a.B) * a.heads_l, [&](int64_t bh) {
    const PairOffsets o = pair_offsets(a, bh);
    gemm(false, false, Tq, D, Tk, T(1), P + o.scores, Tk, v + o.key, A_l, T(0), O + o.query, A_l);
  });
}

template <typename T>
void masked_attention_backward(const AttentionPairs& a, const T* q, const T* k, const T* v, const T* P, const T* dO,
                               T* dP, T* dq, T* dk, T* dv) {
  check_segments(a);
  const int A_l = a.heads_l * a.D, Tq = a.Tq, Tk = a.Tk, D = a.D;
  const T scale = T(1) / std::sqrt(T(D));
  for_each_task(int64_t(a.B) * a.heads_l, [&](int64_t bh) {
    const PairOffsets o = pair_offsets(a, bh);
    T* dS = dP + o.scores;
    // dP [Tq, Tk] = dO V^T; dV [Tk, D] = P^T dO
    gemm(false, true, Tq, Tk, D, T(1), dO + o.query, A_l, v + o.key, A_l, T(0), dS, Tk);
    gemm(true, false, Tk, D, Tq, T(1), P + o.scores, Tk, dO + o.query, A_l, T(0), dv + o.key, A_l);
    // softmax backward: dS = P * (dP - sum_j P dP), zero where P is (masked keys)
    for_each_index(Tq, AttentionSoftmaxBackwardRow<T>{P + o.scores, dS, Tk}, Tk);
    // dQ = scale dS K; dK = scale dS^T Q
    gemm(false, false, Tq, D, Tk, scale, dS, Tk, k + o.key, A_l, T(0), dq + o.query, A_l);
    gemm(true, false, Tk, D, Tq, scale, dS, Tk, q + o.query, A_l, T(0), dk + o.key, A_l);
  });
}

template <typename T>
void add_projection_input_grads(std::initializer_list<std::pair<const T*, const T*>> d_and_w, T* dx, int N, int M,
                                int A_l, const std::function<void(T*, size_t)>& tensor_allreduce, bool sharded,
                                Buffer<T>& scratch) {
  if (sharded && tensor_allreduce) {
    if (scratch.size() < size_t(N) * M) scratch.resize(size_t(N) * M);
    bool first = true;
    for (const auto& [d, w] : d_and_w) {
      matmul(false, true, N, M, A_l, d, w, scratch.data(), !first);
      first = false;
    }
    tensor_allreduce(scratch.data(), size_t(N) * M);
    add_into(dx, scratch.data(), size_t(N) * M);
  } else {
    for (const auto& [d, w] : d_and_w) matmul(false, true, N, M, A_l, d, w, dx, true);
  }
}

#define MESHMOE_ATTENTION_CORE(T)                                                                               \
  template void masked_attention_forward<T>(const AttentionPairs&, const T*, const T*, const T*, T*, T*);       \
  template void masked_attention_backward<T>(const AttentionPairs&, const T*, const T*, const T*, const T*,     \
                                             const T*, T*, T*, T*, T*);                                          \
  template void add_projection_input_grads<T>(std::initializer_list<std::pair<const T*, const T*>>, T*, int, int, \
                                              int, const std::function<void(T*, size_t)>&, bool, Buffer<T>&);
MESHMOE_ATTENTION_CORE(float)
MESHMOE_ATTENTION_CORE(double)
#undef MESHMOE_ATTENTION_CORE

}  // namespace meshmoe
