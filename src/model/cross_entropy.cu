// CrossEntropy's loop bodies on the GPU (tensor/launch_rows_cuda.cuh, tensor/launch_cuda.cuh).
#include "model/cross_entropy_bodies.hpp"
#include "tensor/launch_cuda.cuh"
#include "tensor/launch_rows_cuda.cuh"

MESHMOE_CUDA_ROW_BODY_FD(meshmoe::CrossEntropyForwardRow)
MESHMOE_CUDA_BODY_FD(meshmoe::CrossEntropyBackwardElement)
MESHMOE_CUDA_ROW_BODY_FD(meshmoe::SoftTargetForwardRow)
MESHMOE_CUDA_ROW_BODY_FD(meshmoe::SoftmaxRow)
MESHMOE_CUDA_ROW_BODY(meshmoe::CrossEntropyWithGradientRow<meshmoe::CrossEntropyForwardRow<float>, float>)
MESHMOE_CUDA_ROW_BODY(meshmoe::CrossEntropyWithGradientRow<meshmoe::CrossEntropyForwardRow<double>, double>)
MESHMOE_CUDA_ROW_BODY(meshmoe::CrossEntropyWithGradientRow<meshmoe::SoftTargetForwardRow<float>, float>)
MESHMOE_CUDA_ROW_BODY(meshmoe::CrossEntropyWithGradientRow<meshmoe::SoftTargetForwardRow<double>, double>)
