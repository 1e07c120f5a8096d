// Segment-masked attention without a causal mask: the shared core of bidirectional self-attention
// (attention.hpp with causal = false, the encoder's) and cross-attention (cross_attention.hpp).
// B sequence pairs; queries q [B*Tq, A_l] and keys k, values v [B*Tk, A_l], A_l = heads_l*D with head h in
// columns [h*D, (h+1)*D). A query of example s sees every key of example s on the other side
// (docs/ARCHITECTURE.md "Packed sequences"); with null segments it sees all Tk keys.
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <utility>

#include "tensor/blas.hpp"
#include "tensor/device.hpp"

namespace meshmoe {

struct AttentionPairs {
  int B = 0, heads_l = 0, D = 0, Tq = 0, Tk = 0;
  const int32_t* query_segment = nullptr;  // [B*Tq] or null
  const int32_t* key_segment = nullptr;    // [B*Tk] or null (both null or both set)
};

// The (b, h) pairs' matrices for gemm_batched (tensor/blas.hpp): head h of sequence b in a
// token-major [B * rows, A_l] buffer (rows = Tq on the query side, Tk on the key side), and pair
// bh's [Tq, Tk] scores in [B, heads_l, Tq, Tk].
template <typename T>
BatchedOperand<T> heads_of(T* p, const AttentionPairs& a, int rows) {
  const int A_l = a.heads_l * a.D;
  return {p, A_l, int64_t(rows) * A_l, a.D};
}
template <typename T>
BatchedOperand<T> scores_of(T* p, const AttentionPairs& a, const uint16_t* bf16 = nullptr) {
  return {p, a.Tk, int64_t(a.heads_l) * a.Tq * a.Tk, int64_t(a.Tq) * a.Tk, bf16};
}

// P [B, heads_l, Tq, Tk] = masked softmax(q k^T / sqrt(D)); O [B*Tq, A_l] = P v (overwritten)
template <typename T>
void masked_attention_forward(const AttentionPairs& a, const T* q, const T* k, const T* v, T* P, T* O);

// From P and dO [B*Tq, A_l]: dq [B*Tq, A_l], dk, dv [B*Tk, A_l] (overwritten); dP [B, heads_l, Tq, Tk] scratch.
template <typename T>
void masked_attention_backward(const AttentionPairs& a, const T* q, const T* k, const T* v, const T* P, const T* dO,
                               T* dP, T* dq, T* dk, T* dv);

// One projection's output gradient d [N, A_l] and weight W [M, A_l]; d16: d's bf16 copy, or null
// (tensor/blas.hpp rounded_once).
template <typename T>
struct ProjectionGrad {
  const T* d;
  const T* w;
  const uint16_t* d16 = nullptr;
  int width = 0;  // d's and W's columns when not A_l (grouped-query k, v: KV_l)
  const uint16_t* w16 = nullptr;  // W's bf16 copy (ParamView::w16), or null
};

// The input gradient of head-sharded projections: dx [N, M] += sum over (d, W) of d [N, A_l] W^T, W [M, A_l]
// (or d [N, width] W [M, width]).
// With the heads split over the tensor axis (tensor_allreduce set) the sum is partial: it is formed in
// `scratch` and summed over the axis before it joins dx, which may already hold the residual's gradient.
template <typename T>
void add_projection_input_grads(std::initializer_list<ProjectionGrad<T>> grads, T* dx, int N, int M, int A_l,
                                const std::function<void(T*, size_t)>& tensor_allreduce, bool sharded,
                                Buffer<T>& scratch);

}  // namespace meshmoe
