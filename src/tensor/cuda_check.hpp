// Error checks shared by the CUDA sources (defined in tensor/cuda_device.cu): a failed CUDA or
// cuBLAS call throws meshmoe::Error naming the call and the status.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

namespace meshmoe {

void cuda_check(cudaError_t e, const char* what);
void check_cublas(cublasStatus_t s, const char* what);

// The rank's stream: every kernel, GEMM, copy and NCCL collective of the process is queued on it,
// so each runs after the work queued before it, and a wait for it waits for all of them. A stream
// of its own, made non-blocking (cudaStreamNonBlocking) on the bound GPU at its first use: no
// implicit synchronisation with the legacy default stream, so nothing queued there (a library's
// work, a synchronous cudaMemcpy) serialises with it or makes the host wait for it. Nothing of
// meshmoe uses the legacy stream (docs/ARCHITECTURE.md "Device work and transfer points").
cudaStream_t cuda_stream();  // tensor/cuda_device.cu

// Row-major operands go to column-major cuBLAS as their transposes: op(A) is (trans ? T : N).
inline cublasOperation_t cublas_op(bool trans) { return trans ? CUBLAS_OP_T : CUBLAS_OP_N; }

}  // namespace meshmoe
