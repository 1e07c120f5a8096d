// The element-wise bodies of tensor/elementwise.hpp on the GPU.
#include "tensor/elementwise.hpp"
#include "tensor/launch_cuda.cuh"
#include "tensor/launch_rows_cuda.cuh"

MESHMOE_CUDA_BODY_FD(meshmoe::AddInto)
MESHMOE_CUDA_BODY_FD(meshmoe::FillWith)
MESHMOE_CUDA_BODY_FD(meshmoe::ScaleBy)
MESHMOE_CUDA_BODY_FD(meshmoe::CopyFrom)
MESHMOE_CUDA_ROW_BODY_FD(meshmoe::FlagNonFiniteChunk)
