// The GPU's bf16 GEMM (tensor/cuda_gemm_bf16.hpp): a kernel rounds each fp32 operand into bf16
// scratch with tensor/bf16.hpp's round_bf16 (bitwise the host emulation's operands), then
// cublasGemmEx multiplies them with fp32 accumulation into the fp32 C. Kept apart from
// tensor/cuda_device.cu: its own cuBLAS handle and scratch, on the default stream like cuda_gemm,
// returning without waiting (the scratch is reused in stream order).
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/error.hpp"
#include "tensor/bf16.hpp"
#include "tensor/cuda_check.hpp"
#include "tensor/cuda_gemm_bf16.hpp"
#include "tensor/cuda_profile.hpp"
#include "tensor/device.hpp"

namespace meshmoe {

namespace {

// dst [count, rows, cols] compact = bf16 bits of the count matrices src + j * stride, each
// [rows, cols] with leading dimension ld: one block row per (matrix, row) pair, its threads along
// the columns (coalesced, no division per element).
__global__ void round_to_bf16_rows_kernel(const float* src, int64_t rows, int64_t cols, int64_t ld, int64_t stride,
                                          int64_t pairs, uint16_t* dst) {
  for (int64_t r = blockIdx.x; r < pairs; r += gridDim.x) {
    const int64_t j = r / rows, row = r % rows;
    const float* s = src + j * stride + row * ld;
    uint16_t* d = dst + r * cols;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) d[c] = bf16_bits(s[c]);
  }
}

// The same when the operand is one contiguous run of n values (ld = cols, stride = rows * cols):
// four values a thread, read as one float4 and written as one 8-byte store where n allows.
__global__ void round_to_bf16_flat_kernel(const float* src, int64_t n, uint16_t* dst) {
  const int64_t quads = n / 4, step = int64_t(gridDim.x) * blockDim.x;
  const bool aligned = (reinterpret_cast<uintptr_t>(src) % 16 == 0) && (reinterpret_cast<uintptr_t>(dst) % 8 == 0);
  for (int64_t q = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; q < quads; q += step) {
    float4 v;
    if (aligned) {
      v = reinterpret_cast<const float4*>(src)[q];
    } else {
      v = make_float4(src[4 * q], src[4 * q + 1], src[4 * q + 2], src[4 * q + 3]);
    }
    const uint64_t packed = uint64_t(bf16_bits(v.x)) | uint64_t(bf16_bits(v.y)) << 16 |
                            uint64_t(bf16_bits(v.z)) << 32 | uint64_t(bf16_bits(v.w)) << 48;
    if (aligned) {
      reinterpret_cast<uint64_t*>(dst)[q] = packed;
    } else {
      for (int k = 0; k < 4; ++k) dst[4 * q + k] = uint16_t(packed >> (16 * k));
    }
  }
  for (int64_t i = 4 * quads + int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) dst[i] = bf16_bits(src[i]);
}

// Grow-only device scratch for the two rounded operands (plain cudaMalloc, never managed memory).
struct Scratch {
  uint16_t* data = nullptr;
  size_t elems = 0;
  uint16_t* get(size_t n) {
    if (n <= elems) return data;
    if (data) {
      cuda_check(cudaDeviceSynchronize(), "bf16 scratch: wait before freeing");
      cuda_check(cudaFree(data), "bf16 scratch: cudaFree");
      data = nullptr, elems = 0;
    }
    cuda_check(cudaMalloc(reinterpret_cast<void**>(&data), n * sizeof(uint16_t)),
               ("bf16 scratch: cudaMalloc of " + std::to_string(n * sizeof(uint16_t)) + " bytes").c_str());
    elems = n;
    return data;
  }
};
Scratch g_a, g_b;
cublasHandle_t g_handle = nullptr;

// Created on first use, after cuda_bind chose this process's GPU.
cublasHandle_t handle() {
  if (!g_handle) {
    check_cublas(cublasCreate(&g_handle), "cublasCreate (bf16 GEMM)");
    check_cublas(cublasSetStream(g_handle, cuda_stream()), "cublasSetStream (bf16 GEMM)");
  }
  return g_handle;
}

const uint16_t* rounded(const float* src, int rows, int cols, int ld, Scratch& s, int64_t stride = 0,
                        int count = 1) {
  const size_t n = size_t(rows) * size_t(cols) * size_t(count);
  uint16_t* dst = s.get(n);
  if (n == 0) return dst;
  constexpr int kThreads = 256;
  const bool flat = ld == cols && (count == 1 || stride == int64_t(rows) * cols);
  const auto launch = [&] {
    if (flat) {
      const int64_t quads = (int64_t(n) + 3) / 4;
      const int blocks = int(std::min<int64_t>((quads + kThreads - 1) / kThreads, 65535));
      round_to_bf16_flat_kernel<<<blocks, kThreads, 0, cuda_stream()>>>(src, int64_t(n), dst);
    } else {
      const int64_t pairs = int64_t(rows) * count;
      const int threads = cols >= kThreads ? kThreads : ((cols + 31) / 32) * 32;
      round_to_bf16_rows_kernel<<<unsigned(std::min<int64_t>(pairs, 65535)), threads, 0, cuda_stream()>>>(src, rows, cols, ld, stride,
                                                                                          pairs, dst);
    }
    cuda_check(cudaGetLastError(), "bf16 rounding kernel launch");
  };
  profiled(launch, [] { return "bf16 rounding of a GEMM operand"; });
  return dst;
}

}  // namespace

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: B first, as cuda_gemm does.
void cuda_gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                    const float* B, int ldb, float beta, float* C, int ldc) {
  if (M == 0 || N == 0) return;
  before_device_work();
  const int a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;
  const int b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
  const uint16_t* a = rounded(A, a_rows, a_cols, lda, g_a);
  const uint16_t* b = rounded(B, b_rows, b_cols, ldb, g_b);
  const auto gemm = [&] {
    check_cublas(cublasGemmEx(handle(), cublas_op(trans_b), cublas_op(trans_a), N, M, K, &alpha, b, CUDA_R_16BF,
                              b_cols > 0 ? b_cols : 1, a, CUDA_R_16BF, a_cols > 0 ? a_cols : 1, &beta, C, CUDA_R_32F,
                              ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "GemmEx (bf16 operands, fp32 accumulation)");
  };
  profiled(gemm, [&] { return gemm_profile_name("bf16 gemm", trans_a, trans_b, M, N, K); },
           2.0 * double(M) * double(N) * K);
}

// As cuda_gemm_bf16 over `count` matrices per operand: each operand's matrices are rounded into one
// compact scratch (stride rows x cols), then one cublasGemmStridedBatchedEx.
void cuda_gemm_bf16_strided_batched(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                                    int lda, int64_t stride_a, const float* B, int ldb, int64_t stride_b, float beta,
                                    float* C, int ldc, int64_t stride_c, int count) {
  if (M == 0 || N == 0 || count == 0) return;
  before_device_work();
  const int a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;
  const int b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
  const uint16_t* a = rounded(A, a_rows, a_cols, lda, g_a, stride_a, count);
  const uint16_t* b = rounded(B, b_rows, b_cols, ldb, g_b, stride_b, count);
  const auto gemm = [&] {
    check_cublas(cublasGemmStridedBatchedEx(handle(), cublas_op(trans_b), cublas_op(trans_a), N, M, K, &alpha, b,
                                            CUDA_R_16BF, b_cols > 0 ? b_cols : 1, int64_t(b_rows) * b_cols, a,
                                            CUDA_R_16BF, a_cols > 0 ? a_cols : 1, int64_t(a_rows) * a_cols, &beta, C,
                                            CUDA_R_32F, ldc, stride_c, count, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "GemmStridedBatchedEx (bf16 operands, fp32 accumulation)");
  };
  profiled(gemm, [&] { return gemm_profile_name("bf16 gemm", trans_a, trans_b, M, N, K, count); },
           2.0 * double(M) * double(N) * K * count);
}

}  // namespace meshmoe
