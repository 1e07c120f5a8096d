// LayerNorm's and RMSNorm's loop bodies on the GPU (tensor/launch_rows_cuda.cuh, tensor/launch_cuda.cuh).
#include "model/layernorm_bodies.hpp"
#include "tensor/launch_cuda.cuh"
#include "tensor/launch_rows_cuda.cuh"

MESHMOE_CUDA_ROW_BODY_FD(meshmoe::LayerNormForwardRow)
MESHMOE_CUDA_ROW_BODY_FD(meshmoe::LayerNormBackwardRow)
MESHMOE_CUDA_ROW_BODY_FD(meshmoe::RmsNormForwardRow)
MESHMOE_CUDA_ROW_BODY_FD(meshmoe::RmsNormBackwardRow)
MESHMOE_CUDA_BODY_FD(meshmoe::LayerNormParamGradPartials)
MESHMOE_CUDA_BODY_FD(meshmoe::LayerNormParamGradSum)
