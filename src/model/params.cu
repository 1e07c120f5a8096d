// The parameters' initialisation on the GPU (tensor/launch_cuda.cuh).
#include "model/param_init_bodies.hpp"
#include "tensor/launch_cuda.cuh"

MESHMOE_CUDA_BODY_FD(meshmoe::TruncatedNormalInit)
