// Grouped-query attention's loop bodies on the GPU (tensor/launch_cuda.cuh).
#include "model/kv_heads_bodies.hpp"
#include "tensor/launch_cuda.cuh"

MESHMOE_CUDA_BODY_FD(meshmoe::RepeatKvHeads)
MESHMOE_CUDA_BODY_FD(meshmoe::SumKvHeadGroups)
