// The Router's loop bodies on the GPU (tensor/launch_cuda.cuh).
#include "model/moe/router_bodies.hpp"
#include "tensor/launch_cuda.cuh"

MESHMOE_CUDA_BODY_FD(meshmoe::RouterJitterElement)
MESHMOE_CUDA_BODY_FD(meshmoe::RouterSoftmaxRow)
MESHMOE_CUDA_BODY_FD(meshmoe::RouterSigmoidRow)
MESHMOE_CUDA_BODY_FD(meshmoe::RouterTopChoicesRow)
MESHMOE_CUDA_BODY_FD(meshmoe::RouterAssignGroup)
MESHMOE_CUDA_BODY_FD(meshmoe::RouterAssignRest)
MESHMOE_CUDA_BODY_FD(meshmoe::RouterExpertChoiceColumn)
MESHMOE_CUDA_BODY_FD(meshmoe::RouterBackwardRow)
MESHMOE_CUDA_BODY_FD(meshmoe::RouterJitterBackwardElement)
MESHMOE_CUDA_BODY_FD(meshmoe::RouterGroupTerms)
MESHMOE_CUDA_BODY(meshmoe::RouterTotals)

namespace meshmoe {

// A warp per (group, expert) column of RouterSlotsByScan; every lane of a warp takes the same
// columns, so the warp's ballots see all 32 lanes.
template <typename T>
__global__ void router_slots_by_scan_kernel(RouterSlotsByScan<T> body, int64_t columns) {
  const int lane = int(threadIdx.x % 32);
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t ge = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; ge < columns; ge += warps)
    body.warp(ge, lane);
}

template <typename T>
void launch_router_slots_by_scan(const RouterSlotsByScan<T>& body, int64_t columns) {
  if (columns <= 0) return;
  before_device_work();
  constexpr int kThreads = 256, kWarps = kThreads / 32;
  const int64_t blocks = std::min<int64_t>((columns + kWarps - 1) / kWarps, int64_t(1) << 16);
  profiled(
      [&] {
        router_slots_by_scan_kernel<T><<<unsigned(blocks), kThreads, 0, cuda_stream()>>>(body, columns);
        cuda_check(cudaGetLastError(), "kernel launch");
      },
      [] { return "RouterSlotsByScan (a warp per group and expert)"; });
}

template void launch_router_slots_by_scan<float>(const RouterSlotsByScan<float>&, int64_t);
template void launch_router_slots_by_scan<double>(const RouterSlotsByScan<double>&, int64_t);

}  // namespace meshmoe
