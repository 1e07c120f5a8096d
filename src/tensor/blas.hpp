// Row-major GEMM for float and double (double is used by the finite-difference tests, float by
// training): OpenBLAS on the host, cuBLAS when run.device = "cuda" (tensor/device.hpp).
// C[M,N] = alpha * op(A) op(B) + beta * C.
#pragma once
#include <cblas.h>

#include "tensor/device.hpp"

namespace meshmoe {

inline void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                 const float* B, int ldb, float beta, float* C, int ldc) {
  if (current_device() == Device::Cuda) return cuda_gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K,
              alpha, A, lda, B, ldb, beta, C, ldc);
}
inline void gemm(bool trans_a, bool trans_b, int M, int N, int K, double alpha, const double* A, int lda,
                 const double* B, int ldb, double beta, double* C, int ldc) {
  if (current_device() == Device::Cuda) return cuda_gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K,
              alpha, A, lda, B, ldb, beta, C, ldc);
}

// Dense row-major shorthand: C[M,N] (+)= op(A) op(B), leading dimensions from the shapes.
template <typename T>
void matmul(bool trans_a, bool trans_b, int M, int N, int K, const T* A, const T* B, T* C, bool accumulate = false) {
  gemm(trans_a, trans_b, M, N, K, T(1), A, trans_a ? M : K, B, trans_b ? K : N, accumulate ? T(1) : T(0), C, N);
}

}  // namespace meshmoe
