// The Router's loop bodies on the GPU (tensor/launch_cuda.cuh).
#include "model/moe/router_bodies.hpp"
#include "tensor/launch_cuda.cuh"

MESHMOE_CUDA_BODY_FD(meshmoe::RouterJitterElement)
MESHMOE_CUDA_BODY_FD(meshmoe::RouterSoftmaxRow)
MESHMOE_CUDA_BODY_FD(meshmoe::RouterSigmoidRow)
MESHMOE_CUDA_BODY_FD(meshmoe::RouterTopChoicesRow)
MESHMOE_CUDA_BODY_FD(meshmoe::RouterAssignGroup)
MESHMOE_CUDA_BODY_FD(meshmoe::RouterExpertChoiceColumn)
MESHMOE_CUDA_BODY_FD(meshmoe::RouterBackwardRow)
MESHMOE_CUDA_BODY_FD(meshmoe::RouterJitterBackwardElement)
MESHMOE_CUDA_BODY_FD(meshmoe::RouterGroupTerms)
MESHMOE_CUDA_BODY(meshmoe::RouterTotals)
