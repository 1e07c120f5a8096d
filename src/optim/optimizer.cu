// The optimizers' and gradient clipping's loop bodies on the GPU (tensor/launch_cuda.cuh).
#include "tensor/launch_cuda.cuh"
#include "tensor/launch_rows_cuda.cuh"
#include "optim/optimizer_bodies.hpp"

MESHMOE_CUDA_ROW_BODY(meshmoe::AdamWUpdatePieces)
MESHMOE_CUDA_BODY(meshmoe::AdafactorRowSumSquares)
MESHMOE_CUDA_ROW_BODY(meshmoe::AdafactorColumnSumSquares)
MESHMOE_CUDA_BODY(meshmoe::AdafactorFactorMoment)
MESHMOE_CUDA_BODY(meshmoe::AdafactorRowMomentSum)
MESHMOE_CUDA_ROW_BODY(meshmoe::AdafactorFactoredUpdateRow)
MESHMOE_CUDA_BODY(meshmoe::AdafactorUnfactoredUpdateElement)
MESHMOE_CUDA_BODY(meshmoe::AdafactorApplyElement)
MESHMOE_CUDA_BODY(meshmoe::AddChunkSums)
MESHMOE_CUDA_BODY(meshmoe::AdafactorClipFactor)
MESHMOE_CUDA_ROW_BODY_FD(meshmoe::SumSquaresChunk)
MESHMOE_CUDA_ROW_BODY(meshmoe::SumSquaresPieces<float>)
