// The activations' loop bodies on the GPU (tensor/launch_cuda.cuh).
#include "model/activation_bodies.hpp"
#include "tensor/launch_cuda.cuh"

MESHMOE_CUDA_BODY_FD(meshmoe::ReluForward)
MESHMOE_CUDA_BODY_FD(meshmoe::GeluForward)
MESHMOE_CUDA_BODY_FD(meshmoe::GegluForward)
MESHMOE_CUDA_BODY_FD(meshmoe::ReluBackward)
MESHMOE_CUDA_BODY_FD(meshmoe::GeluBackward)
MESHMOE_CUDA_BODY_FD(meshmoe::GegluBackward)
