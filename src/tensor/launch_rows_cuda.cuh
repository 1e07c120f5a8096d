// The CUDA half of for_each_row (tensor/launch_rows.hpp): one warp per row, 8 rows per block of
// 256 threads, grid-stride over the rows (llm.c's warp-per-row LayerNorm kernels are the model),
// queued on the stream as launch_on_cuda's kernels are. Include from a .cu file and instantiate each row
// body there:
//   MESHMOE_CUDA_ROW_BODY(LayerNormForwardRow<float>)
//   MESHMOE_CUDA_ROW_BODY_FD(LayerNormForwardRow)   // <float> and <double>
#pragma once
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <typeinfo>

#include "tensor/cuda_check.hpp"
#include "tensor/cuda_profile.hpp"
#include "tensor/launch_rows.hpp"

namespace meshmoe {

constexpr int kWarpLanes = 32;

// The partial of lane ^ offset.
struct WarpShuffle {
  template <typename T>
  __device__ T operator()(T partial, int offset) const {
    return __shfl_xor_sync(~0u, partial, offset);
  }
};

// Lane `first` of the warp that owns a row; the reductions in butterfly's order
// (tensor/launch_rows.hpp) by warp shuffles.
struct WarpLanes {
  int first;
  static constexpr int step = kWarpLanes;
  template <typename T>
  __device__ T sum(T partial) const {
    return butterfly<kWarpLanes>(partial, WarpShuffle{}, RowSum{});
  }
  template <typename T>
  __device__ T max(T partial) const {
    return butterfly<kWarpLanes>(partial, WarpShuffle{}, RowMax{});
  }
  __device__ bool leader() const { return first == 0; }
  __device__ void sync() const { __syncwarp(); }
};

// Warp w of the grid takes rows w, w + warps, ...; the loop bound is the same for the whole warp,
// so every lane reaches each shuffle.
template <class Body>
__global__ void for_each_row_kernel(int64_t rows, Body body) {
  const int warps_per_block = int(blockDim.x) / kWarpLanes;
  const int64_t warps = int64_t(warps_per_block) * gridDim.x;
  const WarpLanes lanes{int(threadIdx.x) % kWarpLanes};
  for (int64_t n = int64_t(blockIdx.x) * warps_per_block + threadIdx.x / kWarpLanes; n < rows; n += warps)
    body(n, lanes);
}

template <class Body>
void launch_rows_on_cuda(int64_t rows, const Body& body) {
  if (rows <= 0) return;
  before_device_work();
  constexpr int kThreads = 256, kRowsPerBlock = kThreads / kWarpLanes;
  const int64_t blocks = std::min<int64_t>((rows + kRowsPerBlock - 1) / kRowsPerBlock, int64_t(1) << 16);
  profiled(
      [&] {
        for_each_row_kernel<Body><<<unsigned(blocks), kThreads, 0, cuda_stream()>>>(rows, body);
        cuda_check(cudaGetLastError(), "row kernel launch");
      },
      [] { return typeid(Body).name(); });
}

}  // namespace meshmoe

#define MESHMOE_CUDA_ROW_BODY(...) \
  template void meshmoe::launch_rows_on_cuda<__VA_ARGS__>(int64_t, const __VA_ARGS__&);
#define MESHMOE_CUDA_ROW_BODY_FD(B) \
  MESHMOE_CUDA_ROW_BODY(B<float>)   \
  MESHMOE_CUDA_ROW_BODY(B<double>)
