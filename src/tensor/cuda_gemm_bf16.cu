// The GPU's bf16 GEMM (tensor/cuda_gemm_bf16.hpp): a kernel rounds each fp32 operand into bf16
// scratch with tensor/bf16.hpp's round_bf16 (bitwise the host emulation's operands), then
// cublasGemmEx multiplies them with fp32 accumulation into the fp32 C. Kept apart from
// tensor/cuda_device.cu: its own cuBLAS handle and scratch, on the default stream like cuda_gemm,
// returning without waiting (the scratch is reused in stream order).
//
// M and K are padded with zeros to a multiple of kPadTo: an expert's token count (M of its
// forward and input-gradient GEMMs, K of its weight gradient) is new at nearly every call, and
// cuBLAS's bf16 GEMM spends about 1.6 ms of host time on each shape it has not seen (fp32 and
// shapes it has seen: about 30 us; bench/cuda_gemm_probe.cu, bench/RESULTS.md "cuBLAS bf16 GEMM probe").
// Padded, the shapes are a small set met in the first steps. Zero rows and columns add exact
// zeros to the sums; a padded M goes through an fp32 scratch C whose first M rows join C.
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

// dst [rows_p, cols_p] compact = bf16 bits of src [rows, cols] (leading dimension ld), zero in the
// padding rows r >= rows and columns c >= cols: one block row per destination row.
__global__ void round_to_bf16_padded_kernel(const float* src, int64_t rows, int64_t cols, int64_t ld, int64_t rows_p,
                                            int64_t cols_p, uint16_t* dst) {
  for (int64_t r = blockIdx.x; r < rows_p; r += gridDim.x) {
    const float* s = src + r * ld;
    uint16_t* d = dst + r * cols_p;
    for (int64_t c = threadIdx.x; c < cols_p; c += blockDim.x) d[c] = r < rows && c < cols ? bf16_bits(s[c]) : 0;
  }
}

// C [rows, cols] (leading dimension ldc) = S [rows, cols] (compact) + beta C; beta = 0 does not
// read C (cuBLAS's rule: C may hold anything, NaN included).
__global__ void join_padded_product_kernel(const float* S, int64_t rows, int64_t cols, float beta, float* C,
                                           int64_t ldc) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x)
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      float& out = C[r * ldc + c];
      out = beta == 0.0f ? S[r * cols + c] : S[r * cols + c] + beta * out;
    }
}

// Grow-only device scratch (plain cudaMalloc, never managed memory): the two rounded operands and
// the padded product.
template <typename E>
struct Scratch {
  E* data = nullptr;
  size_t elems = 0;
  E* get(size_t n) {
    if (n <= elems) return data;
    if (data) {
      cuda_check(cudaDeviceSynchronize(), "bf16 scratch: wait before freeing");
      cuda_check(cudaFree(data), "bf16 scratch: cudaFree");
      data = nullptr, elems = 0;
    }
    cuda_check(cudaMalloc(reinterpret_cast<void**>(&data), n * sizeof(E)),
               ("bf16 scratch: cudaMalloc of " + std::to_string(n * sizeof(E)) + " bytes").c_str());
    elems = n;
    return data;
  }
};
Scratch<uint16_t> g_a, g_b;
Scratch<float> g_c;

constexpr int kPadTo = 64;
int padded(int d) { return (d + kPadTo - 1) / kPadTo * kPadTo; }
constexpr int kThreads = 256;
int row_threads(int64_t cols) { return cols >= kThreads ? kThreads : int((cols + 31) / 32 * 32); }
cublasHandle_t g_handle = nullptr;

// Created on first use, after cuda_bind chose this process's GPU.
cublasHandle_t handle() {
  if (!g_handle) {
    check_cublas(cublasCreate(&g_handle), "cublasCreate (bf16 GEMM)");
    check_cublas(cublasSetStream(g_handle, cuda_stream()), "cublasSetStream (bf16 GEMM)");
  }
  return g_handle;
}

// dst [n] = the n values at src rounded.
void round_flat_into(const float* src, int64_t n, uint16_t* dst, const char* what) {
  if (n == 0) return;
  const auto launch = [&] {
    const int64_t quads = (n + 3) / 4;
    const int blocks = int(std::min<int64_t>((quads + kThreads - 1) / kThreads, 65535));
    round_to_bf16_flat_kernel<<<blocks, kThreads, 0, cuda_stream()>>>(src, n, dst);
    cuda_check(cudaGetLastError(), "bf16 rounding kernel launch");
  };
  profiled(launch, [what] { return what; });
}

// The n values at src rounded into the scratch, in place of their index.
const uint16_t* rounded_flat(const float* src, int64_t n, Scratch<uint16_t>& s) {
  uint16_t* dst = s.get(size_t(n));
  round_flat_into(src, n, dst, "bf16 rounding of a GEMM operand");
  return dst;
}

const uint16_t* rounded(const float* src, int rows, int cols, int ld, Scratch<uint16_t>& s, int64_t stride = 0,
                        int count = 1) {
  const size_t n = size_t(rows) * size_t(cols) * size_t(count);
  if (ld == cols && (count == 1 || stride == int64_t(rows) * cols)) return rounded_flat(src, int64_t(n), s);
  uint16_t* dst = s.get(n);
  if (n == 0) return dst;
  const auto launch = [&] {
    const int64_t pairs = int64_t(rows) * count;
    round_to_bf16_rows_kernel<<<unsigned(std::min<int64_t>(pairs, 65535)), row_threads(cols), 0, cuda_stream()>>>(
        src, rows, cols, ld, stride, pairs, dst);
    cuda_check(cudaGetLastError(), "bf16 rounding kernel launch");
  };
  profiled(launch, [] { return "bf16 rounding of a GEMM operand"; });
  return dst;
}

// As rounded, into [rows_p, cols_p] with zeros beyond [rows, cols].
const uint16_t* rounded_padded(const float* src, int rows, int cols, int ld, int rows_p, int cols_p,
                               Scratch<uint16_t>& s) {
  uint16_t* dst = s.get(size_t(rows_p) * size_t(cols_p));
  if (rows_p == 0 || cols_p == 0) return dst;
  const auto launch = [&] {
    round_to_bf16_padded_kernel<<<unsigned(std::min(rows_p, 65535)), row_threads(cols_p), 0, cuda_stream()>>>(
        src, rows, cols, ld, rows_p, cols_p, dst);
    cuda_check(cudaGetLastError(), "bf16 padded rounding kernel launch");
  };
  profiled(launch, [] { return "bf16 rounding of a GEMM operand (padded)"; });
  return dst;
}

}  // namespace

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: B first, as cuda_gemm does.
void cuda_gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                    const float* B, int ldb, float beta, float* C, int ldc, const uint16_t* A16,
                    const uint16_t* B16) {
  if (M == 0 || N == 0) return;
  before_device_work();
  const int Mp = padded(M), Kp = padded(K);
  // The stored operands: A [M, K] ([K, M] transposed), B [K, N] ([N, K] transposed), rounded
  // compact with M and K padded.
  const int a_rows = trans_a ? K : M, a_cols = trans_a ? M : K, a_rows_p = trans_a ? Kp : Mp, a_cols_p = trans_a ? Mp : Kp;
  const int b_rows = trans_b ? N : K, b_cols = trans_b ? K : N, b_rows_p = trans_b ? N : Kp, b_cols_p = trans_b ? Kp : N;
  // Only an operand with a padded dimension is rounded into padded scratch: A when M or K is
  // padded, B when K is (N is not padded); the other reads its copy, or is rounded, as it is.
  const bool pad_a = Mp != M || Kp != K, pad_b = Kp != K, pad = pad_a || pad_b;
  const uint16_t* a = pad_a ? rounded_padded(A, a_rows, a_cols, lda, a_rows_p, a_cols_p, g_a)
                      : A16 ? A16 : rounded(A, a_rows, a_cols, lda, g_a);
  const uint16_t* b = pad_b ? rounded_padded(B, b_rows, b_cols, ldb, b_rows_p, b_cols_p, g_b)
                      : B16 ? B16 : rounded(B, b_rows, b_cols, ldb, g_b);
  // The operands' leading dimensions: a copy's is the operand's, the rounded scratch is compact
  // (unpadded, its width is the operand's).
  const int a_ld = !pad_a && A16 ? lda : a_cols_p, b_ld = !pad_b && B16 ? ldb : b_cols_p;
  // A padded M writes Mp rows: into the scratch product, then its first M rows join C.
  float* product = Mp != M ? g_c.get(size_t(Mp) * N) : C;
  const float product_beta = Mp != M ? 0.0f : beta;
  const int product_ld = Mp != M ? N : ldc;
  const auto gemm = [&] {
    check_cublas(cublasGemmEx(handle(), cublas_op(trans_b), cublas_op(trans_a), N, Mp, Kp, &alpha, b, CUDA_R_16BF,
                              b_ld > 0 ? b_ld : 1, a, CUDA_R_16BF, a_ld > 0 ? a_ld : 1, &product_beta,
                              product, CUDA_R_32F, product_ld, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "GemmEx (bf16 operands, fp32 accumulation)");
  };
  profiled(gemm, [&] { return gemm_profile_name(pad ? "bf16 gemm (padded)" : "bf16 gemm", trans_a, trans_b, Mp, N, Kp); },
           2.0 * double(Mp) * double(N) * Kp);
  if (Mp != M) {
    const auto join = [&] {
      join_padded_product_kernel<<<unsigned(std::min(M, 65535)), row_threads(N), 0, cuda_stream()>>>(product, M, N, beta,
                                                                                                      C, ldc);
      cuda_check(cudaGetLastError(), "bf16 padded product kernel launch");
    };
    profiled(join, [] { return "bf16 padded product into C"; });
  }
}

void cuda_round_to_bf16(const float* src, int64_t n, uint16_t* bits) {
  before_device_work();
  round_flat_into(src, n, bits, "bf16 copy of an operand read by several GEMMs");
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

bool cuda_gemm_bf16_two_level_batched(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                                      int lda, int64_t a_outer, int64_t a_inner, const float* B, int ldb,
                                      int64_t b_outer, int64_t b_inner, float beta, float* C, int ldc,
                                      int64_t c_outer, int64_t c_inner, int outer, int inner, const uint16_t* A16,
                                      const uint16_t* B16) {
  if (M == 0 || N == 0 || outer == 0 || inner == 0) return true;
  const int a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;
  const int b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
  // From a pair's first element to the last pair's last: the span one flat rounding covers.
  const auto span = [&](int64_t outer_stride, int64_t inner_stride, int rows, int cols, int ld) {
    return (outer - 1) * outer_stride + (inner - 1) * inner_stride + int64_t(rows - 1) * ld + cols;
  };
  const int64_t a_span = span(a_outer, a_inner, a_rows, a_cols, lda), b_span = span(b_outer, b_inner, b_rows, b_cols, ldb);
  const int64_t pairs = int64_t(outer) * inner;
  if (K == 0 || a_span > 2 * pairs * a_rows * a_cols || b_span > 2 * pairs * b_rows * b_cols) return false;
  before_device_work();
  const uint16_t* a = A16 ? A16 : rounded_flat(A, a_span, g_a);
  const uint16_t* b = B16 ? B16 : rounded_flat(B, b_span, g_b);
  for (int o = 0; o < outer; ++o) {
    const auto gemm = [&] {
      check_cublas(cublasGemmStridedBatchedEx(handle(), cublas_op(trans_b), cublas_op(trans_a), N, M, K, &alpha,
                                              b + o * b_outer, CUDA_R_16BF, ldb, b_inner, a + o * a_outer, CUDA_R_16BF,
                                              lda, a_inner, &beta, C + o * c_outer, CUDA_R_32F, ldc, c_inner, inner,
                                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                   "GemmStridedBatchedEx (bf16 operands, two-level batch)");
    };
    profiled(gemm, [&] { return gemm_profile_name("bf16 gemm", trans_a, trans_b, M, N, K, inner); },
             2.0 * double(M) * double(N) * K * inner);
  }
  return true;
}

}  // namespace meshmoe
