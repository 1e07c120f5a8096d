// The CUDA half of for_each_index and for_each_index_2d (tensor/launch.hpp): a grid-stride
// kernel over the indices, queued on the stream (the host reads its results after
// device_synchronize, tensor/device.hpp). Include from a .cu file and instantiate each body there:
//   MESHMOE_CUDA_BODY(LayerNormForwardRow<float>)
//   MESHMOE_CUDA_BODY_FD(LayerNormForwardRow)   // <float> and <double>
#pragma once
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <typeinfo>

#include "tensor/cuda_check.hpp"
#include "tensor/cuda_profile.hpp"
#include "tensor/launch.hpp"

namespace meshmoe {

// One thread per element of [0, rows * cols); a 2-D body (for_each_index_2d) gets (row, column),
// a 1-D body (for_each_index, cols = 1) the flat index.
template <class Body>
__global__ void for_each_index_kernel(int64_t rows, int64_t cols, Body body) {
  const int64_t n = rows * cols, stride = int64_t(blockDim.x) * gridDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    if constexpr (std::is_invocable_v<const Body&, int64_t, int64_t>)
      body(i / cols, i % cols);
    else
      body(i);
  }
}

template <class Body>
void launch_on_cuda(int64_t rows, int64_t cols, const Body& body) {
  const int64_t n = rows * cols;
  if (n <= 0) return;
  before_device_work();
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, int64_t(1) << 16);
  profiled(
      [&] {
        for_each_index_kernel<Body><<<unsigned(blocks), kThreads, 0, cuda_stream()>>>(rows, cols, body);
        cuda_check(cudaGetLastError(), "kernel launch");
      },
      [] { return typeid(Body).name(); });
}

}  // namespace meshmoe

#define MESHMOE_CUDA_BODY(...) \
  template void meshmoe::launch_on_cuda<__VA_ARGS__>(int64_t, int64_t, const __VA_ARGS__&);
#define MESHMOE_CUDA_BODY_FD(B) \
  MESHMOE_CUDA_BODY(B<float>)   \
  MESHMOE_CUDA_BODY(B<double>)
