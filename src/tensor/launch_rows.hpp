// for_each_row(rows, body, row_len): body(n, lanes) for every row n in [0, rows), for the bodies
// that walk a whole row and reduce over it (LayerNorm, the attention softmax, the cross-entropy).
// A row body is written once, generic over its lanes: its element loops go
//   for (int m = lanes.first; m < M; m += lanes.step)
// and a row reduction is lanes.sum(partial) / lanes.max(partial), whose result every lane gets.
//
// - On the host a row has one lane (HostLanes: first 0, step 1, sum and max the identity), so the
//   loops are the plain sequential ones: the same arithmetic, in the same order, as a body of
//   for_each_index. The rows are threaded like for_each_index's indices (tensor/launch.hpp), and
//   run backwards under set_host_loop_reversed.
// - On the GPU (tensor/launch_rows_cuda.cuh) a row has one warp, 32 lanes: lane l takes elements
//   l, l + 32, ... (adjacent lanes read adjacent elements) and the reductions are a butterfly of
//   warp shuffles, a fixed order, so two runs are bitwise equal.
//
// A lane may read an element another lane wrote only after lanes.sync() (__syncwarp() on the
// GPU, nothing on the host); a value the row writes once (a row's statistics) is written by the
// lane with lanes.leader(). A body used on the GPU is instantiated in the layer's .cu file with
// MESHMOE_CUDA_ROW_BODY.
#pragma once
#include <cstdint>
#include <stdexcept>

#include "core/hd.hpp"
#include "tensor/launch.hpp"

namespace meshmoe {

// The host's single lane of a row.
struct HostLanes {
  static constexpr int first = 0;
  static constexpr int step = 1;
  template <typename T>
  MESHMOE_HD T sum(T partial) const {
    return partial;
  }
  template <typename T>
  MESHMOE_HD T max(T partial) const {
    return partial;
  }
  MESHMOE_HD bool leader() const { return true; }
  MESHMOE_HD void sync() const {}
};

// A warp's reduction order (WarpLanes in tensor/launch_rows_cuda.cuh, and the host emulation of
// the tests): each lane combines its partial with the partial of lane ^ 16, then ^ 8, 4, 2, 1
// (exchange(partial, offset) returns the other lane's). Every lane combines the same pairs, only
// commuted, so every lane ends with the bitwise same sum, and the same maximum (only a zero
// maximum may differ in its sign between lanes, which no difference or exp of it can see).
template <int kLanes, typename T, class Exchange, class Combine>
MESHMOE_HD T butterfly(T partial, const Exchange& exchange, const Combine& combine) {
  for (int offset = kLanes / 2; offset > 0; offset /= 2) partial = combine(partial, exchange(partial, offset));
  return partial;
}

struct RowSum {
  template <typename T>
  MESHMOE_HD T operator()(T a, T b) const {
    return a + b;
  }
};

struct RowMax {
  template <typename T>
  MESHMOE_HD T operator()(T a, T b) const {
    return b > a ? b : a;
  }
};

#ifdef MESHMOE_CUDA
template <class Body>
void launch_rows_on_cuda(int64_t rows, const Body& body);  // tensor/launch_rows_cuda.cuh
#endif

template <class Body>
void for_each_row(int64_t rows, const Body& body, int64_t row_len) {
  if (current_device() == Device::Cuda) {
#ifdef MESHMOE_CUDA
    launch_rows_on_cuda(rows, body);
    return;
#else
    throw std::logic_error("for_each_row on Device::Cuda in a build without CUDA");
#endif
  }
  run_host_indices(rows, rows * row_len, [body](int64_t n) { body(n, HostLanes{}); });
}

}  // namespace meshmoe
