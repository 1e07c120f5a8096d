// Rotary position embedding's loop body on the GPU (tensor/launch_cuda.cuh).
#include "model/rope_bodies.hpp"
#include "tensor/launch_cuda.cuh"

MESHMOE_CUDA_BODY_FD(meshmoe::RopeRotatePair)
MESHMOE_CUDA_BODY(meshmoe::RopePositions)
