// Where the model's numbers live and are computed (DESIGN.md principle 4: one code path, two
// devices). With run.device = "cuda" every model buffer (parameters, gradients, activations,
// optimizer state) is a Buffer in CUDA managed memory, so the same layer code, MPI calls,
// checkpoint and metrics can read it from either side; the layers' loops are functors that
// for_each_index (tensor/launch.hpp) runs as a host loop or as a CUDA kernel, and GEMMs go to
// OpenBLAS or cuBLAS (tensor/blas.hpp). Every CUDA launch and GEMM synchronises before it returns,
// so host code that reads a Buffer afterwards sees the result.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "deck/options.hpp"  // enum class Device (run.device)
#include "tensor/arena.hpp"

namespace meshmoe {

// The process's device; set once, before the model allocates anything (Buffers remember how they
// were allocated, so a Buffer made on one device is still freed correctly after a switch).
Device current_device();
void set_device(Device d);

bool cuda_compiled();        // built with nvcc (make CUDA=1)
int cuda_device_count();     // GPUs visible to this process; 0 without CUDA or without a driver
// Binds this process to GPU (node_local_rank % count) and creates its cuBLAS handle. Throws Error
// naming the reason (no GPU, driver error).
void cuda_bind(int node_local_rank);
std::string cuda_device_name();  // of the bound GPU, for the run's start-up lines
void device_synchronize();       // waits for the GPU (no-op on the host)

// Raw storage for Buffer: 64-byte aligned host memory on Device::Cpu; on Cuda a block of the
// device's arena (tensor/arena.hpp, pooled managed memory). A Buffer is freed where it came from.
void* buffer_alloc(size_t bytes);
void buffer_free(void* p) noexcept;
// Makes the current device's arena hold `bytes` in one piece (the memory plan's total, before the
// model allocates); nothing on the host.
void reserve_buffer_memory(size_t bytes);
// The current device's arena's figures; none on the host.
std::optional<Arena::Stats> buffer_arena_stats();
// Tests: host Buffers come from `arena` (null: the heap again) until the next call.
void set_host_buffer_arena(Arena* arena);

template <class T>
struct DeviceAllocator {
  using value_type = T;
  DeviceAllocator() = default;
  template <class U>
  DeviceAllocator(const DeviceAllocator<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(buffer_alloc(n * sizeof(T))); }
  void deallocate(T* p, size_t) noexcept { buffer_free(p); }
  template <class U>
  bool operator==(const DeviceAllocator<U>&) const { return true; }
  template <class U>
  bool operator!=(const DeviceAllocator<U>&) const { return false; }
};

// A vector whose elements a CUDA kernel can read and write when run.device = "cuda".
template <class T>
using Buffer = std::vector<T, DeviceAllocator<T>>;

// Row-major GEMM on the bound GPU (cuBLAS, fp32 without TF32, or fp64); see tensor/blas.hpp.
void cuda_gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
               const float* B, int ldb, float beta, float* C, int ldc);
void cuda_gemm(bool trans_a, bool trans_b, int M, int N, int K, double alpha, const double* A, int lda,
               const double* B, int ldb, double beta, double* C, int ldc);
// `count` such GEMMs, matrix i of each operand `stride` elements after matrix i - 1 (one cuBLAS call).
void cuda_gemm_strided_batched(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                               int64_t stride_a, const float* B, int ldb, int64_t stride_b, float beta, float* C,
                               int ldc, int64_t stride_c, int count);
void cuda_gemm_strided_batched(bool trans_a, bool trans_b, int M, int N, int K, double alpha, const double* A,
                               int lda, int64_t stride_a, const double* B, int ldb, int64_t stride_b, double beta,
                               double* C, int ldc, int64_t stride_c, int count);

}  // namespace meshmoe
