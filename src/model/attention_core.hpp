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

#include "tensor/device.hpp"

namespace meshmoe {

struct AttentionPairs {
  int B = 0, heads_l = 0, D = 0, Tq = 0, Tk = 0;
  const int32_t* query_segment = nullptr;  // [B*Tq] or null
  const int32_t* key_segment = nullptr;    // [B*Tk] or null (both null or both set)
};

// P [B, heads_l, Tq, Tk] = masked softmax(q k^T / sqrt(D)); O [B*Tq, A_l] = P v (overwritten)
template <typename T>
void masked_attention_forward(const AttentionPairs& a, const T* q, const T* k, const T* v, T* P, T* O);

// From P and dO [B*Tq, A_l]: dq [B*Tq, A_l], dk, dv [B*Tk, A_l] (overwritten); dP [B, heads_l, Tq, Tk] scratch.
template <typename T>
void masked_attention_backward(const AttentionPairs& a, const T* q, const T* k, const T* v, const T* P, const T* dO,
                               T* dP, T* dq, T* dk, T* dv);

// The input gradient of head-sharded projections: dx [N, M] += sum over (d, W) of d [N, A_l] W^T, W [M, A_l].
// With the heads split over the tensor axis (tensor_allreduce set) the sum is partial: it is formed in
// `scratch` and summed over the axis before it joins dx, which may already hold the residual's gradient.
template <typename T>
void add_projection_input_grads(std::initializer_list<std::pair<const T*, const T*>> d_and_w, T* dx, int N, int M,
                                int A_l, const std::function<void(T*, size_t)>& tensor_allreduce, bool sharded,
                                Buffer<T>& scratch);

}  // namespace meshmoe
