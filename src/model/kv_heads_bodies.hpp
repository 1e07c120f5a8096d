// Grouped-query attention's loop bodies (model/kv_heads.hpp) for for_each_index_2d
// (tensor/launch.hpp): one index (n, c) per element of row n.
#pragma once
#include <cstdint>

#include "core/hd.hpp"

namespace meshmoe {

// Query head h of this rank (global head0 + h) reads key/value head (head0 + h) / group, column
// ((head0 + h) / group - kv0) x D of the rank's key/value heads.
//   dst [N, A_l] column c = h D + d  <-  src [N, KV_l] column ((head0 + h) / group - kv0) D + d
template <typename T>
struct RepeatKvHeads {
  const T* src;  // [N, KV_l]
  T* dst;        // [N, A_l]
  int D, A_l, KV_l, head0, group, kv0;
  MESHMOE_HD void operator()(int64_t n, int64_t c) const {
    const int h = int(c / D), d = int(c % D);
    dst[n * A_l + c] = src[n * KV_l + int64_t((head0 + h) / group - kv0) * D + d];
  }
};

// The transpose: dst [N, KV_l] column c = g D + d is the sum, in ascending head order, of src
// [N, A_l] over this rank's query heads of key/value head kv0 + g (none: 0, a replicated key/value
// head whose query heads are on other tensor ranks).
template <typename T>
struct SumKvHeadGroups {
  const T* src;  // [N, A_l]
  T* dst;        // [N, KV_l]
  int D, A_l, KV_l, head0, heads_l, group, kv0;
  MESHMOE_HD void operator()(int64_t n, int64_t c) const {
    const int g = int(c / D), d = int(c % D);
    const int first = (kv0 + g) * group - head0, end = first + group;
    T sum = 0;
    for (int h = first < 0 ? 0 : first; h < end && h < heads_l; ++h) sum += src[n * A_l + int64_t(h) * D + d];
    dst[n * KV_l + c] = sum;
  }
};

}  // namespace meshmoe
