// CausalSelfAttention's and the attention core's row bodies on the GPU (tensor/launch_rows_cuda.cuh).
#include "model/attention_bodies.hpp"
#include "tensor/launch_rows_cuda.cuh"

MESHMOE_CUDA_ROW_BODY_FD(meshmoe::AttentionCausalSoftmaxRow)
MESHMOE_CUDA_ROW_BODY_FD(meshmoe::AttentionCausalSoftmaxBackwardRow)
MESHMOE_CUDA_ROW_BODY_FD(meshmoe::AttentionMaskedSoftmaxRow)
MESHMOE_CUDA_ROW_BODY_FD(meshmoe::AttentionSoftmaxBackwardRow)
