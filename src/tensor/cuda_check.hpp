// Error checks shared by the CUDA sources (defined in tensor/cuda_device.cu): a failed CUDA or
// cuBLAS call throws meshmoe::Error naming the call and the status.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

namespace meshmoe {

void cuda_check(cudaError_t e, const char* what);
void check_cublas(cublasStatus_t s, const char* what);

// The rank's stream: every kernel, GEMM, copy and NCCL collective of the process is queued on it,
// so each runs after the work queued before it, and a wait for it waits for all of them. The legacy
// default stream (cudaMemcpy's), which the synchronous copies to and from the host share.
inline cudaStream_t cuda_stream() { return cudaStreamLegacy; }

// Row-major operands go to column-major cuBLAS as their transposes: op(A) is (trans ? T : N).
inline cublasOperation_t cublas_op(bool trans) { return trans ? CUBLAS_OP_T : CUBLAS_OP_N; }

}  // namespace meshmoe
