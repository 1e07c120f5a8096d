// Dropout's loop bodies on the GPU (tensor/launch_cuda.cuh).
#include "model/dropout_bodies.hpp"
#include "tensor/launch_cuda.cuh"

MESHMOE_CUDA_BODY_FD(meshmoe::DropoutForwardBlock)
MESHMOE_CUDA_BODY_FD(meshmoe::DropoutBackwardElement)
