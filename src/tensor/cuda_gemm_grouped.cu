// The GPU's grouped GEMM (tensor/cuda_gemm_grouped.hpp), fp32, fp64 and bf16 operands read from
// their copies. Kept apart from tensor/cuda_device.cu as
// the bf16 GEMM is: its own cuBLAS handle on the default stream and its own scratch for the
// operand pointers, which cuBLAS's grouped GEMM reads from device memory (the shapes, scales and
// leading dimensions it reads from host memory). The pointers are copied with cudaMemcpyAsync from
// pageable host memory, which returns once the values are staged, and the scratch is reused in
// stream order.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "core/error.hpp"
#include "tensor/cuda_check.hpp"
#include "tensor/cuda_gemm_grouped.hpp"
#include "tensor/cuda_profile.hpp"
#include "tensor/device.hpp"

namespace meshmoe {

namespace {

cublasHandle_t g_handle = nullptr;
void** g_pointers = nullptr;  // [3 * g_capacity]: the A, then B, then C pointers of a call
size_t g_capacity = 0;

// Created on first use, after cuda_bind chose this process's GPU.
cublasHandle_t handle() {
  if (!g_handle) {
    check_cublas(cublasCreate(&g_handle), "cublasCreate (grouped GEMM)");
    check_cublas(cublasSetStream(g_handle, cuda_stream()), "cublasSetStream (grouped GEMM)");
  }
  return g_handle;
}

// A call's operand pointers in device memory, host[0, 3 count): its A at [0, count), B at
// [count, 2 count), C after.
void** device_pointers(const std::vector<void*>& host) {
  const size_t n = host.size() / 3;
  if (n > g_capacity) {
    if (g_pointers) {
      cuda_check(cudaDeviceSynchronize(), "grouped GEMM scratch: wait before freeing");
      cuda_check(cudaFree(g_pointers), "grouped GEMM scratch: cudaFree");
    }
    cuda_check(cudaMalloc(reinterpret_cast<void**>(&g_pointers), 3 * n * sizeof(void*)),
               "grouped GEMM scratch: cudaMalloc");
    g_capacity = n;
  }
  cuda_check(cudaMemcpyAsync(g_pointers, host.data(), 3 * n * sizeof(void*), cudaMemcpyHostToDevice, cuda_stream()),
             "grouped GEMM: copy of the operand pointers");
  return g_pointers;
}

// The groups' operands (A, then B, then C), or with bf16 their copies A16 and B16.
template <typename T>
std::vector<void*> operand_pointers(const GemmGroup<T>* groups, int count, bool bf16) {
  const size_t n = size_t(count);
  std::vector<void*> host(3 * n);
  for (size_t i = 0; i < n; ++i) {
    const GemmGroup<T>& g = groups[i];
    host[i] = bf16 ? static_cast<void*>(const_cast<uint16_t*>(g.A16)) : static_cast<void*>(const_cast<T*>(g.A));
    host[n + i] = bf16 ? static_cast<void*>(const_cast<uint16_t*>(g.B16)) : static_cast<void*>(const_cast<T*>(g.B));
    host[2 * n + i] = g.C;
  }
  return host;
}

// Each group's shape for cuBLAS's column-major call (C^T = op(B)^T op(A)^T: B first, as cuda_gemm
// does), a group of one GEMM each.
struct GroupedShapes {
  std::vector<cublasOperation_t> op_b, op_a;
  std::vector<int> rows, cols, inner, ld_b, ld_a, ld_c, size;
  double flops = 0;
  template <typename T>
  GroupedShapes(bool trans_a, bool trans_b, const GemmGroup<T>* groups, int count)
      : op_b(size_t(count), cublas_op(trans_b)), op_a(size_t(count), cublas_op(trans_a)), rows(size_t(count)),
        cols(size_t(count)), inner(size_t(count)), ld_b(size_t(count)), ld_a(size_t(count)), ld_c(size_t(count)),
        size(size_t(count), 1) {
    for (size_t i = 0; i < size_t(count); ++i) {
      const GemmGroup<T>& g = groups[i];
      rows[i] = g.N, cols[i] = g.M, inner[i] = g.K;
      ld_b[i] = g.ldb > 0 ? g.ldb : 1, ld_a[i] = g.lda > 0 ? g.lda : 1, ld_c[i] = g.ldc > 0 ? g.ldc : 1;
      flops += 2.0 * double(g.M) * double(g.N) * double(g.K);
    }
  }
};

template <typename T, class Call>
void grouped(bool trans_a, bool trans_b, T alpha, T beta, const GemmGroup<T>* groups, int count, const Call& call,
             const char* kind) {
  if (count <= 0) return;
  before_device_work();
  const size_t n = size_t(count);
  const GroupedShapes s(trans_a, trans_b, groups, count);
  std::vector<T> alphas(n, alpha), betas(n, beta);
  void** p = device_pointers(operand_pointers(groups, count, false));
  const auto launch = [&] {
    check_cublas(call(handle(), s.op_b.data(), s.op_a.data(), s.rows.data(), s.cols.data(), s.inner.data(),
                      alphas.data(), reinterpret_cast<const T* const*>(p + n), s.ld_b.data(),
                      reinterpret_cast<const T* const*>(p), s.ld_a.data(), betas.data(),
                      reinterpret_cast<T* const*>(p + 2 * n), s.ld_c.data(), count, s.size.data()),
                 kind);
  };
  profiled(launch, [&] { return gemm_profile_name(kind, trans_a, trans_b, groups[0].M, groups[0].N, groups[0].K, count); },
           s.flops);
}

// The bf16 copies of the groups form one progression: group 0's shape and leading dimensions in
// every group, each copy and C at group 0's plus i times a stride (returned, in elements).
bool bf16_progression(const GemmGroup<float>* g, int count, int64_t& sa, int64_t& sb, int64_t& sc) {
  sa = count > 1 ? g[1].A16 - g[0].A16 : 0;
  sb = count > 1 ? g[1].B16 - g[0].B16 : 0;
  sc = count > 1 ? g[1].C - g[0].C : 0;
  for (int i = 0; i < count; ++i) {
    const GemmGroup<float>& x = g[i];
    if (x.M != g[0].M || x.N != g[0].N || x.K != g[0].K || x.lda != g[0].lda || x.ldb != g[0].ldb ||
        x.ldc != g[0].ldc || x.A16 != g[0].A16 + i * sa || x.B16 != g[0].B16 + i * sb || x.C != g[0].C + i * sc)
      return false;
  }
  return true;
}

}  // namespace

void cuda_gemm_grouped(bool trans_a, bool trans_b, float alpha, float beta, const GemmGroup<float>* groups, int count) {
  grouped(trans_a, trans_b, alpha, beta, groups, count, cublasSgemmGroupedBatched, "sgemm grouped");
}
void cuda_gemm_grouped(bool trans_a, bool trans_b, double alpha, double beta, const GemmGroup<double>* groups,
                       int count) {
  grouped(trans_a, trans_b, alpha, beta, groups, count, cublasDgemmGroupedBatched, "dgemm grouped");
}

void cuda_gemm_grouped_bf16(bool trans_a, bool trans_b, float alpha, float beta, const GemmGroup<float>* groups,
                            int count) {
  if (count <= 0) return;
  for (int i = 0; i < count; ++i)
    if (!groups[i].A16 || !groups[i].B16) throw Error("cuda_gemm_grouped_bf16: a group without its operands' bf16 copies");
  before_device_work();
  const GemmGroup<float>& f = groups[0];
  int64_t sa, sb, sc;
  if (bf16_progression(groups, count, sa, sb, sc)) {
    const auto launch = [&] {
      check_cublas(cublasGemmStridedBatchedEx(handle(), cublas_op(trans_b), cublas_op(trans_a), f.N, f.M, f.K, &alpha,
                                              f.B16, CUDA_R_16BF, f.ldb > 0 ? f.ldb : 1, sb, f.A16, CUDA_R_16BF,
                                              f.lda > 0 ? f.lda : 1, sa, &beta, f.C, CUDA_R_32F, f.ldc > 0 ? f.ldc : 1,
                                              sc, count, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                   "GemmStridedBatchedEx (grouped bf16 copies, fp32 accumulation)");
    };
    profiled(launch, [&] { return gemm_profile_name("bf16 gemm batched copies", trans_a, trans_b, f.M, f.N, f.K, count); },
             2.0 * double(f.M) * double(f.N) * double(f.K) * count);
    return;
  }
  const size_t n = size_t(count);
  const GroupedShapes s(trans_a, trans_b, groups, count);
  const std::vector<float> alphas(n, alpha), betas(n, beta);  // the scale type of CUBLAS_COMPUTE_32F
  void** p = device_pointers(operand_pointers(groups, count, true));
  const auto launch = [&] {
    check_cublas(cublasGemmGroupedBatchedEx(handle(), s.op_b.data(), s.op_a.data(), s.rows.data(), s.cols.data(),
                                            s.inner.data(), alphas.data(), p + n, CUDA_R_16BF, s.ld_b.data(), p,
                                            CUDA_R_16BF, s.ld_a.data(), betas.data(), p + 2 * n, CUDA_R_32F,
                                            s.ld_c.data(), count, s.size.data(), CUBLAS_COMPUTE_32F),
                 "GemmGroupedBatchedEx (bf16 copies, fp32 accumulation)");
  };
  profiled(launch, [&] { return gemm_profile_name("bf16 gemm grouped", trans_a, trans_b, f.M, f.N, f.K, count); }, s.flops);
}

}  // namespace meshmoe
