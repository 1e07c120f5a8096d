// The GPU's grouped GEMM (tensor/blas.hpp gemm_grouped): GEMMs of different shapes in one cuBLAS
// call, for the MoE experts' GEMMs when their row counts differ (model/moe/experts.cpp).
#pragma once

namespace meshmoe {

// One GEMM of a grouped call: row-major C[M,N] = alpha op(A) op(B) + beta C, leading dimensions
// lda, ldb, ldc (the matrices' row lengths as stored).
template <typename T>
struct GemmGroup {
  int M, N, K;
  const T* A;
  int lda;
  const T* B;
  int ldb;
  T* C;
  int ldc;
};

// The `count` GEMMs of `groups` (host memory) on the bound GPU as one cublasSgemmGroupedBatched /
// cublasDgemmGroupedBatched (every GEMM a group of one), their operand pointers uploaded to device
// scratch in stream order; queued on the stream like cuda_gemm. Throws Error when built without CUDA.
void cuda_gemm_grouped(bool trans_a, bool trans_b, float alpha, float beta, const GemmGroup<float>* groups, int count);
void cuda_gemm_grouped(bool trans_a, bool trans_b, double alpha, double beta, const GemmGroup<double>* groups,
                       int count);

}  // namespace meshmoe
