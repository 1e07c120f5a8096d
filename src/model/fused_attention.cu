// The fused attention's tile bodies on the GPU (model/fused_attention_bodies.hpp, tensor/launch_cuda.cuh):
// one thread per (sequence, head, tile), the same arithmetic as the host's tiles.
#include "model/fused_attention_bodies.hpp"
#include "tensor/elementwise.hpp"
#include "tensor/launch_cuda.cuh"

MESHMOE_CUDA_BODY_FD(meshmoe::FusedAttentionForwardTile)
MESHMOE_CUDA_BODY_FD(meshmoe::FusedAttentionRowDot)
MESHMOE_CUDA_BODY_FD(meshmoe::FusedAttentionBackwardQueryTile)
MESHMOE_CUDA_BODY_FD(meshmoe::FusedAttentionBackwardKeyTile)
MESHMOE_CUDA_BODY(meshmoe::CopyFrom<int32_t>)  // the attention's copy of the segment ids (attention.cpp)
