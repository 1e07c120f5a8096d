// The MoE dispatchers' loop bodies on the GPU (tensor/launch_cuda.cuh).
#include "model/moe/dispatcher_bodies.hpp"
#include "tensor/launch_cuda.cuh"

MESHMOE_CUDA_BODY(meshmoe::GatherRows<float, int>)
MESHMOE_CUDA_BODY(meshmoe::GatherRows<double, int>)
MESHMOE_CUDA_BODY(meshmoe::GatherRows<float, int64_t>)
MESHMOE_CUDA_BODY(meshmoe::GatherRows<double, int64_t>)
MESHMOE_CUDA_BODY_FD(meshmoe::DispatchBackwardElement)
MESHMOE_CUDA_BODY_FD(meshmoe::CombineElement)
MESHMOE_CUDA_BODY_FD(meshmoe::CombineBackwardOutElement)
MESHMOE_CUDA_BODY_FD(meshmoe::CombineBackwardGateChoice)
MESHMOE_CUDA_BODY(meshmoe::PlanFillGroup)
MESHMOE_CUDA_BODY(meshmoe::PlanStarts)
MESHMOE_CUDA_BODY(meshmoe::PlanClearRow)
MESHMOE_CUDA_BODY(meshmoe::PlanScatterToken)
