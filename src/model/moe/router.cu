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

// A warp per index i < count (a (group, expert) column of RouterSlotsByScan, a group of
// RouterAssignRest); every lane of a warp takes the same indices, so the warp's ballots and
// shuffles see all 32 lanes.
template <class Body>
__global__ void router_warps_kernel(Body body, int64_t count) {
  const int lane = int(threadIdx.x % 32);
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; i < count; i += warps) body.warp(i, lane);
}

template <class Body>
void launch_router_warps(const Body& body, int64_t count, const char* what) {
  if (count <= 0) return;
  before_device_work();
  constexpr int kThreads = 256, kWarps = kThreads / 32;
  const int64_t blocks = std::min<int64_t>((count + kWarps - 1) / kWarps, int64_t(1) << 16);
  profiled(
      [&] {
        router_warps_kernel<Body><<<unsigned(blocks), kThreads, 0, cuda_stream()>>>(body, count);
        cuda_check(cudaGetLastError(), "kernel launch");
      },
      [what] { return what; });
}

template void launch_router_warps(const RouterSlotsByScan<float>&, int64_t, const char*);
template void launch_router_warps(const RouterSlotsByScan<double>&, int64_t, const char*);
template void launch_router_warps(const RouterAssignRest<float>&, int64_t, const char*);
template void launch_router_warps(const RouterAssignRest<double>&, int64_t, const char*);

}  // namespace meshmoe
