// Grouped-query attention (Ainslie et al. 2023; model.kv_heads), as the Hugging Face Llama and
// Mixtral code computes it: the k and v projections have kv_heads heads, and `repeat_kv` gives each
// query head its group's key/value head before the attention, so the attention itself is multi-head
// attention over repeated keys and values. The backward sums the repeated heads' gradients back
// onto their key/value head. The bodies are in model/kv_heads_bodies.hpp, their GPU instantiation
// in model/kv_heads.cu.
#pragma once
#include <cstdint>

#include "model/kv_heads_bodies.hpp"
#include "model/layer_shapes.hpp"
#include "tensor/launch.hpp"

namespace meshmoe {

// dst [N, A_l] = the key/value heads src [N, KV_l] repeated for this rank's query heads of `s`.
template <typename T>
void repeat_kv_heads(const AttentionShape& s, const T* src, T* dst, int N) {
  if (N == 0) return;
  for_each_index_2d(N, s.A_l,
                    RepeatKvHeads<T>{.src = src, .dst = dst, .D = s.D, .A_l = s.A_l, .KV_l = s.KV_l,
                                     .head0 = s.head0, .group = s.group(), .kv0 = s.kv0});
}

// dst [N, KV_l] = src [N, A_l] summed over the query heads of each key/value head (repeat_kv_heads' transpose).
template <typename T>
void sum_kv_head_groups(const AttentionShape& s, const T* src, T* dst, int N) {
  if (N == 0) return;
  for_each_index_2d(N, s.KV_l,
                    SumKvHeadGroups<T>{.src = src, .dst = dst, .D = s.D, .A_l = s.A_l, .KV_l = s.KV_l,
                                       .head0 = s.head0, .heads_l = s.heads_l, .group = s.group(), .kv0 = s.kv0});
}

}  // namespace meshmoe
