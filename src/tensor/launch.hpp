// for_each_index(n, body): body(i) for every i in [0, n), as a host loop or, with run.device =
// "cuda", as a CUDA kernel with one thread per index. for_each_index_2d(rows, cols, body):
// body(r, c) over a rows x cols grid (row-major), for element-wise work on matrices: the host runs
// two nested loops (no division per element), the GPU one thread per element. A body is a small struct of raw pointers
// and sizes with a `MESHMOE_HD void operator()(int64_t i) const` (named for what it computes, next
// to the layer that uses it); it must write only what index i owns, so the order of the indices
// never matters. The host loop can run backwards (set_host_loop_reversed) so that a test can
// prove that: any body that reads what another index writes changes the result.
//
// A body used on the GPU is instantiated in the layer's .cu file with MESHMOE_CUDA_BODY (see
// tensor/launch_cuda.cuh); a missing one is a link error in a CUDA build.
#pragma once
#include <cstdint>
#include <stdexcept>

#include "core/hd.hpp"
#include "tensor/device.hpp"

namespace meshmoe {

bool host_loop_reversed();
void set_host_loop_reversed(bool reversed);

#ifdef MESHMOE_CUDA
template <class Body>
void launch_on_cuda(int64_t rows, int64_t cols, const Body& body);  // tensor/launch_cuda.cuh
#endif

template <class Body>
void for_each_index(int64_t n, const Body& body) {
  if (current_device() == Device::Cuda) {
#ifdef MESHMOE_CUDA
    launch_on_cuda(n, 1, body);
    return;
#else
    throw std::logic_error("for_each_index on Device::Cuda in a build without CUDA");
#endif
  }
  if (host_loop_reversed())
    for (int64_t i = n; i-- > 0;) body(i);
  else
    for (int64_t i = 0; i < n; ++i) body(i);
}

template <class Body>
void for_each_index_2d(int64_t rows, int64_t cols, const Body& body) {
  if (current_device() == Device::Cuda) {
#ifdef MESHMOE_CUDA
    launch_on_cuda(rows, cols, body);
    return;
#else
    throw std::logic_error("for_each_index_2d on Device::Cuda in a build without CUDA");
#endif
  }
  if (host_loop_reversed()) {
    for (int64_t r = rows; r-- > 0;)
      for (int64_t c = cols; c-- > 0;) body(r, c);
  } else {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) body(r, c);
  }
}

}  // namespace meshmoe
