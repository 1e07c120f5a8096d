// The GPU's grouped GEMM (tensor/cuda_gemm_grouped.hpp). Kept apart from tensor/cuda_device.cu as
// the bf16 GEMM is: its own cuBLAS handle on the default stream and its own scratch for the
// operand pointers, which cuBLAS's grouped GEMM reads from device memory (the shapes, scales and
// leading dimensions it reads from host memory). The pointers are copied with cudaMemcpyAsync from
// pageable host memory, which returns once the values are staged, and the scratch is reused in
// stream order.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <string>
#include <vector>

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

// The groups' operand pointers in device memory: A at [0, count), B at [count, 2 count), C after.
template <typename T>
void** device_pointers(const GemmGroup<T>* groups, int count) {
  const size_t n = size_t(count);
  if (n > g_capacity) {
    if (g_pointers) {
      cuda_check(cudaDeviceSynchronize(), "grouped GEMM scratch: wait before freeing");
      cuda_check(cudaFree(g_pointers), "grouped GEMM scratch: cudaFree");
    }
    cuda_check(cudaMalloc(reinterpret_cast<void**>(&g_pointers), 3 * n * sizeof(void*)),
               "grouped GEMM scratch: cudaMalloc");
    g_capacity = n;
  }
  std::vector<void*> host(3 * n);
  for (size_t i = 0; i < n; ++i) {
    host[i] = const_cast<T*>(groups[i].A);
    host[n + i] = const_cast<T*>(groups[i].B);
    host[2 * n + i] = groups[i].C;
  }
  cuda_check(cudaMemcpyAsync(g_pointers, host.data(), 3 * n * sizeof(void*), cudaMemcpyHostToDevice, cuda_stream()),
             "grouped GEMM: copy of the operand pointers");
  return g_pointers;
}

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: B first, as cuda_gemm does.
template <typename T, class Call>
void grouped(bool trans_a, bool trans_b, T alpha, T beta, const GemmGroup<T>* groups, int count, const Call& call,
             const char* kind) {
  if (count <= 0) return;
  before_device_work();
  const size_t n = size_t(count);
  std::vector<cublasOperation_t> op_b(n, cublas_op(trans_b)), op_a(n, cublas_op(trans_a));
  std::vector<int> rows(n), cols(n), inner(n), ld_b(n), ld_a(n), ld_c(n), size(n, 1);
  std::vector<T> alphas(n, alpha), betas(n, beta);
  double flops = 0;
  for (size_t i = 0; i < n; ++i) {
    const GemmGroup<T>& g = groups[i];
    rows[i] = g.N, cols[i] = g.M, inner[i] = g.K;
    ld_b[i] = g.ldb > 0 ? g.ldb : 1, ld_a[i] = g.lda > 0 ? g.lda : 1, ld_c[i] = g.ldc > 0 ? g.ldc : 1;
    flops += 2.0 * double(g.M) * double(g.N) * double(g.K);
  }
  void** p = device_pointers(groups, count);
  const auto launch = [&] {
    check_cublas(call(handle(), op_b.data(), op_a.data(), rows.data(), cols.data(), inner.data(), alphas.data(),
                      reinterpret_cast<const T* const*>(p + n), ld_b.data(), reinterpret_cast<const T* const*>(p),
                      ld_a.data(), betas.data(), reinterpret_cast<T* const*>(p + 2 * n), ld_c.data(), count,
                      size.data()),
                 kind);
  };
  profiled(launch, [&] { return gemm_profile_name(kind, trans_a, trans_b, groups[0].M, groups[0].N, groups[0].K, count); },
           flops);
}

}  // namespace

void cuda_gemm_grouped(bool trans_a, bool trans_b, float alpha, float beta, const GemmGroup<float>* groups, int count) {
  grouped(trans_a, trans_b, alpha, beta, groups, count, cublasSgemmGroupedBatched, "sgemm grouped");
}
void cuda_gemm_grouped(bool trans_a, bool trans_b, double alpha, double beta, const GemmGroup<double>* groups,
                       int count) {
  grouped(trans_a, trans_b, alpha, beta, groups, count, cublasDgemmGroupedBatched, "dgemm grouped");
}

}  // namespace meshmoe
