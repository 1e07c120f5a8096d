// Row-major GEMM over OpenBLAS for float and double (double is used by the finite-difference
// tests, float by training). C[M,N] = alpha * op(A) op(B) + beta * C.
#pragma once
#include <cblas.h>

namespace meshmoe {

inline void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                 const float* B, int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K,
              alpha, A, lda, B, ldb, beta, C, ldc);
}
inline void gemm(bool trans_a, bool trans_b, int M, int N, int K, double alpha, const double* A, int lda,
                 const double* B, int ldb, double beta, double* C, int ldc) {
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K,
              alpha, A, lda, B, ldb, beta, C, ldc);
}

// Dense row-major shorthand: C[M,N] (+)= op(A) op(B), leading dimensions from the shapes.
template <typename T>
void matmul(bool trans_a, bool trans_b, int M, int N, int K, const T* A, const T* B, T* C, bool accumulate = false) {
  gemm(trans_a, trans_b, M, N, K, T(1), A, trans_a ? M : K, B, trans_b ? K : N, accumulate ? T(1) : T(0), C, N);
}

}  // namespace meshmoe
