// CausalSelfAttention's and the attention core's loop bodies on the GPU (tensor/launch_cuda.cuh).
#include "model/attention_bodies.hpp"
#include "tensor/launch_cuda.cuh"

MESHMOE_CUDA_BODY_FD(meshmoe::AttentionCausalSoftmaxRow)
MESHMOE_CUDA_BODY_FD(meshmoe::AttentionCausalSoftmaxBackwardRow)
MESHMOE_CUDA_BODY_FD(meshmoe::AttentionMaskedSoftmaxRow)
MESHMOE_CUDA_BODY_FD(meshmoe::AttentionSoftmaxBackwardRow)
