// dst[i] = ((ops[0][i] + ops[1][i]) + ops[2][i]) + ... : the fixed order of the shared-memory and
// the hierarchical sums (docs/ARCHITECTURE.md "Shared-memory collectives").
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <vector>

namespace meshmoe {

// For i < len, at least two operands; dst may be one of ops. Summed through a block on the stack
// so that the compiler vectorises without alias checks.
template <class T>
void sum_in_rank_order(T* dst, const std::vector<const T*>& ops, size_t len) {
  constexpr size_t kBlock = 2048;
  T acc[kBlock];
  for (size_t b = 0; b < len; b += kBlock) {
    const size_t m = std::min(kBlock, len - b);
    const T* a0 = ops[0] + b;
    const T* a1 = ops[1] + b;
    for (size_t i = 0; i < m; ++i) acc[i] = a0[i] + a1[i];
    for (size_t k = 2; k < ops.size(); ++k) {
      const T* ak = ops[k] + b;
      for (size_t i = 0; i < m; ++i) acc[i] += ak[i];
    }
    std::memcpy(dst + b, acc, m * sizeof(T));
  }
}

}  // namespace meshmoe
