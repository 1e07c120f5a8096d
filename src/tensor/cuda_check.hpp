// Error checks shared by the CUDA sources (defined in tensor/cuda_device.cu): a failed CUDA or
// cuBLAS call throws meshmoe::Error naming the call and the status.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

namespace meshmoe {

void cuda_check(cudaError_t e, const char* what);
void check_cublas(cublasStatus_t s, const char* what);

// Row-major operands go to column-major cuBLAS as their transposes: op(A) is (trans ? T : N).
inline cublasOperation_t cublas_op(bool trans) { return trans ? CUBLAS_OP_T : CUBLAS_OP_N; }

}  // namespace meshmoe
