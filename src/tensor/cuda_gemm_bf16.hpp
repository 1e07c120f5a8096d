// The GPU's bf16 GEMM (model.precision = "bf16" with run.device = "cuda"; tensor/blas.hpp).
#pragma once
#include <cstdint>

namespace meshmoe {

// Row-major C[M,N] = alpha op(bf16(A)) op(bf16(B)) + beta C on the bound GPU: one kernel rounds
// each operand (tensor/bf16.hpp's round_bf16, as the host emulation) into bf16 scratch, then
// cublasGemmEx with CUDA_R_16BF operands, CUBLAS_COMPUTE_32F and an fp32 C; M and K padded with
// zeros to a multiple of 64 (a bounded set of shapes for cuBLAS; the sums unchanged). Queued on
// the stream, as cuda_gemm: returns without waiting. Throws Error when built without CUDA.
// A16 / B16 (optional): the operand already rounded (bf16_bits, device memory, the operand's layout
// and leading dimension), read in place of its rounding unless the operand needs padding (A when M
// or K does, B when K does; a padded operand is rounded from the fp32 values: the same bits).
void cuda_gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                    const float* B, int ldb, float beta, float* C, int ldc, const uint16_t* A16 = nullptr,
                    const uint16_t* B16 = nullptr);

// bits [n] = bf16_bits(src [n]) on the bound GPU, queued on the stream (tensor/blas.hpp round_to_bf16).
void cuda_round_to_bf16(const float* src, int64_t n, uint16_t* bits);

// The same for `count` matrices per operand, matrix j at A + j * stride_a (B, C likewise): one
// rounding kernel per operand over all of them and one cublasGemmStridedBatchedEx.
void cuda_gemm_bf16_strided_batched(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                                    int lda, int64_t stride_a, const float* B, int ldb, int64_t stride_b, float beta,
                                    float* C, int ldc, int64_t stride_c, int count);

// gemm_batched's two-level batch (tensor/blas.hpp): pair (b, h), b < outer, h < inner, of operand
// X at X + b * x_outer + h * x_inner. Each operand's span over all pairs is rounded by one kernel
// (instead of one per b), then one cublasGemmStridedBatchedEx per b over its `inner` pairs reads
// the rounded span at the same offsets. Returns false, having done nothing, when K is 0 or a span
// is more than twice its pairs' elements (gaps between them): the caller then calls
// cuda_gemm_bf16_strided_batched per b. A16 / B16 (optional): the operand already rounded
// (bf16_bits, device memory, the operand's layout), read in place of a rounding.
bool cuda_gemm_bf16_two_level_batched(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                                      int lda, int64_t a_outer, int64_t a_inner, const float* B, int ldb,
                                      int64_t b_outer, int64_t b_inner, float beta, float* C, int ldc,
                                      int64_t c_outer, int64_t c_inner, int outer, int inner,
                                      const uint16_t* A16 = nullptr, const uint16_t* B16 = nullptr);

}  // namespace meshmoe
