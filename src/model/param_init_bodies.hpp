// The parameters' initialisation as a loop body (tensor/launch.hpp): on a GPU the weights are made
// where they live, and on the host the loop runs on the BLAS threads.
#pragma once
#include <cstdint>

#include "core/hd.hpp"
#include "core/philox.hpp"

namespace meshmoe {

// The row-major index in the unsharded parameter (logical_shape) of element `local` of the block
// local_shape that starts at `offset`.
MESHMOE_HD inline uint64_t logical_element_index(int dims, const int64_t* local_shape, const int64_t* offset,
                                                 const int64_t* logical_shape, int64_t local) {
  uint64_t logical = 0, stride = 1, rem = uint64_t(local);
  for (int d = dims - 1; d >= 0; --d) {
    const uint64_t coord = rem % uint64_t(local_shape[d]) + uint64_t(offset[d]);
    rem /= uint64_t(local_shape[d]);
    logical += coord * stride;
    stride *= uint64_t(logical_shape[d]);
  }
  return logical;
}

// w[local] = std * truncated_normal(logical index of local element `local`): the element's index in
// the unsharded parameter, so that any block of it, on any rank, gets the unsharded values.
template <typename T>
struct TruncatedNormalInit {
  static constexpr int kMaxDims = 4;
  T* w;
  Rng rng;
  double std;
  int dims;
  int64_t local_shape[kMaxDims], offset[kMaxDims], logical_shape[kMaxDims];

  MESHMOE_HD void operator()(int64_t local) const {
    w[local] = T(std * rng.truncated_normal(logical_element_index(dims, local_shape, offset, logical_shape, local)));
  }
};

}  // namespace meshmoe
