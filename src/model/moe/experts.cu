// The MoE experts' loop bodies on the GPU (tensor/launch_cuda.cuh).
#include "model/moe/experts_bodies.hpp"
#include "tensor/launch_cuda.cuh"

MESHMOE_CUDA_BODY_FD(meshmoe::KeepExpertInput)
MESHMOE_CUDA_BODY_FD(meshmoe::ExpertDropoutForward)
MESHMOE_CUDA_BODY_FD(meshmoe::ExpertDropoutBackward)
