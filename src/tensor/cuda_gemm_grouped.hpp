// The GPU's grouped GEMM (tensor/blas.hpp gemm_grouped): GEMMs of different shapes in one cuBLAS
// call, for the MoE experts' GEMMs when their row counts differ (model/moe/experts.cpp).
#pragma once
#include <cstdint>

namespace meshmoe {

// One GEMM of a grouped call: row-major C[M,N] = alpha op(A) op(B) + beta C, leading dimensions
// lda, ldb, ldc (the matrices' row lengths as stored). A16 / B16 (optional, float): the operand's
// bf16 copy (bf16_bits, the operand's layout and leading dimension), which bf16 GEMMs read
// instead of rounding it (tensor/blas.hpp gemm_bf16_operands).
template <typename T>
struct GemmGroup {
  int M, N, K;
  const T* A;
  int lda;
  const T* B;
  int ldb;
  T* C;
  int ldc;
  const uint16_t* A16 = nullptr;
  const uint16_t* B16 = nullptr;
};

// The `count` GEMMs of `groups` (host memory) on the bound GPU as one cublasSgemmGroupedBatched /
// cublasDgemmGroupedBatched (every GEMM a group of one), their operand pointers uploaded to device
// scratch in stream order; queued on the stream like cuda_gemm. Throws Error when built without CUDA.
void cuda_gemm_grouped(bool trans_a, bool trans_b, float alpha, float beta, const GemmGroup<float>* groups, int count);
void cuda_gemm_grouped(bool trans_a, bool trans_b, double alpha, double beta, const GemmGroup<double>* groups,
                       int count);

// The same with bf16 operands, fp32 sums and result, reading every group's A16 and B16 (required:
// the operands rounded by their producers, so that the call rounds nothing): one
// cublasGemmStridedBatchedEx when the copies form one progression (equal shapes and leading
// dimensions, each copy at a constant stride), otherwise one cublasGemmGroupedBatchedEx
// (CUDA_R_16BF A and B, CUDA_R_32F C, CUBLAS_COMPUTE_32F). No padding: each group's shape as it is.
void cuda_gemm_grouped_bf16(bool trans_a, bool trans_b, float alpha, float beta, const GemmGroup<float>* groups,
                            int count);

}  // namespace meshmoe
