// The host's row-major GEMM by OpenBLAS, C[M,N] = alpha op(A) op(B) + beta C with op(X) = X^T where
// trans_x: sgemm for float, dgemm for double. What every host GEMM of tensor/blas.hpp ends in.
#pragma once
#include <cblas.h>

namespace meshmoe {

inline void cblas_gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                       const float* B, int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A,
              lda, B, ldb, beta, C, ldc);
}
inline void cblas_gemm(bool trans_a, bool trans_b, int M, int N, int K, double alpha, const double* A, int lda,
                       const double* B, int ldb, double beta, double* C, int ldc) {
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A,
              lda, B, ldb, beta, C, ldc);
}

}  // namespace meshmoe
