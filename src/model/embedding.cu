// Embedding's loop bodies on the GPU (tensor/launch_cuda.cuh).
#include "model/embedding_bodies.hpp"
#include "tensor/launch_cuda.cuh"

MESHMOE_CUDA_BODY_FD(meshmoe::EmbeddingForwardElement)
MESHMOE_CUDA_BODY_FD(meshmoe::EmbeddingRowGradElement)
