// What a bf16 GEMM costs on the GPU, three ways, on one process (bench/RESULTS.md "cuBLAS bf16 GEMM probe"):
//   rounded  meshmoe's bf16 GEMM so far: a kernel rounds each fp32 operand into bf16 scratch
//            (tensor/bf16.hpp's bf16_bits), then cublasGemmEx (bf16 operands, fp32 sums);
//   fast     cublasGemmEx on the fp32 operands with CUBLAS_COMPUTE_32F_FAST_16BF (cuBLAS rounds);
//   fp32     cublasSgemm.
// 1. Exactness: `fast` against `rounded` on random data (max relative difference, bitwise equal
//    entries), every transpose.
// 2. Speed on the dense deck's shapes (d_model 1024, d_ff 4096, 8192 tokens): events around 20 calls.
// 3. An MoE expert's GEMMs: M (its token count) a new value at each call (50..1300), the host's
//    wall time per call, then the same M again (cached shapes); and M rounded up to a multiple of 128.
// Build here: nvcc -std=c++17 -O2 --expt-relaxed-constexpr -gencode arch=compute_90,code=sm_90 -Isrc
//   bench/cuda_gemm_probe.cu -lcublas -o .gpu/gemm_probe   (carried to the GPU machine; results in bench/RESULTS.md)
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "tensor/bf16.hpp"

using meshmoe::bf16_bits;

#define CK(x) do { auto e_ = (x); if (int(e_) != 0) { std::printf("error %d at %s:%d\n", int(e_), __FILE__, __LINE__); std::exit(1); } } while (0)

__global__ void round_kernel(const float* s, int64_t n, uint16_t* d) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    d[i] = bf16_bits(s[i]);
}

cublasHandle_t H;
uint16_t *ra, *rb;  // scratch for rounded operands

void round_to(const float* s, int64_t n, uint16_t* d) { round_kernel<<<4096, 256>>>(s, n, d); }

// Row-major C [M, N] = op(A) op(B), as meshmoe's cuda_gemm: column-major C^T = op(B)^T op(A)^T.
enum Way { Rounded, Fast, Fp32 };
void gemm(Way w, bool ta, bool tb, int M, int N, int K, const float* A, const float* B, float* C) {
  const float one = 1, zero = 0;
  const int lda = ta ? M : K, ldb = tb ? K : N;
  const auto opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (w == Rounded) {
    round_to(A, int64_t(M) * K, ra);
    round_to(B, int64_t(K) * N, rb);
    CK(cublasGemmEx(H, opb, opa, N, M, K, &one, rb, CUDA_R_16BF, ldb, ra, CUDA_R_16BF, lda, &zero, C, CUDA_R_32F, N,
                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  } else if (w == Fast) {
    CK(cublasGemmEx(H, opb, opa, N, M, K, &one, B, CUDA_R_32F, ldb, A, CUDA_R_32F, lda, &zero, C, CUDA_R_32F, N,
                    CUBLAS_COMPUTE_32F_FAST_16BF, CUBLAS_GEMM_DEFAULT));
  } else {
    CK(cublasSgemm(H, opb, opa, N, M, K, &one, B, ldb, A, lda, &zero, C, N));
  }
}

const char* name(Way w) { return w == Rounded ? "rounded" : w == Fast ? "fast" : "fp32"; }

int main() {
  CK(cublasCreate(&H));
  const size_t big = size_t(8192) * 4096;
  float *A, *B, *C, *C2;
  CK(cudaMalloc(&A, big * 4)); CK(cudaMalloc(&B, big * 4)); CK(cudaMalloc(&C, big * 4)); CK(cudaMalloc(&C2, big * 4));
  CK(cudaMalloc(&ra, big * 2)); CK(cudaMalloc(&rb, big * 2));
  {
    std::vector<float> h(big);
    std::mt19937 g(7);
    std::normal_distribution<float> n(0, 1);
    for (auto& x : h) x = n(g);
    CK(cudaMemcpy(A, h.data(), big * 4, cudaMemcpyHostToDevice));
    for (auto& x : h) x = n(g);
    CK(cudaMemcpy(B, h.data(), big * 4, cudaMemcpyHostToDevice));
  }
  // 1. exactness
  for (int t = 0; t < 4; ++t) {
    const bool ta = t & 1, tb = t & 2;
    const int M = 777, N = 1023, K = 1024;
    gemm(Rounded, ta, tb, M, N, K, A, B, C);
    gemm(Fast, ta, tb, M, N, K, A, B, C2);
    std::vector<float> x(size_t(M) * N), y(size_t(M) * N);
    CK(cudaMemcpy(x.data(), C, x.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(y.data(), C2, y.size() * 4, cudaMemcpyDeviceToHost));
    double worst = 0;
    size_t equal = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      worst = std::max(worst, std::abs(double(x[i]) - y[i]) / std::max(1.0, std::abs(double(x[i]))));
      equal += x[i] == y[i];
    }
    std::printf("exact ta=%d tb=%d: fast vs rounded max rel diff %.3g, bitwise equal %.4f of entries\n", ta, tb, worst,
                double(equal) / x.size());
  }
  // 2. dense shapes
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  struct S { bool ta, tb; int M, N, K; } shapes[] = {{false, true, 8192, 4096, 1024}, {false, false, 8192, 1024, 4096},
                                                     {true, false, 1024, 4096, 8192}, {false, true, 8192, 1024, 1024},
                                                     {false, true, 1024, 1024, 64}, {false, false, 1024, 64, 1024}};
  for (const S& s : shapes)
    for (Way w : {Rounded, Fast, Fp32}) {
      gemm(w, s.ta, s.tb, s.M, s.N, s.K, A, B, C);
      CK(cudaEventRecord(e0));
      for (int i = 0; i < 20; ++i) gemm(w, s.ta, s.tb, s.M, s.N, s.K, A, B, C);
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float ms;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      std::printf("shape %c%c %5dx%5dx%5d %-8s %8.1f us %6.1f TFLOP/s\n", s.ta ? 'T' : 'N', s.tb ? 'T' : 'N', s.M, s.N,
                  s.K, name(w), ms * 1e3 / 20, 2.0 * s.M * s.N * s.K * 20 / (ms * 1e-3) / 1e12);
    }
  // 3. an expert's GEMMs at a new M each call
  std::mt19937 g(3);
  std::uniform_int_distribution<int> m(50, 1300);
  std::vector<int> Ms(48);
  for (int& x : Ms) x = m(g);
  for (int pad : {1, 128})
    for (Way w : {Rounded, Fast, Fp32})
      for (int pass = 0; pass < 2; ++pass) {
        CK(cudaDeviceSynchronize());
        const auto t0 = std::chrono::steady_clock::now();
        double flop = 0;
        for (int M0 : Ms) {
          const int M = (M0 + pad - 1) / pad * pad;
          gemm(w, false, true, M, 4096, 1024, A, B, C);   // h = x W1^T style
          gemm(w, false, false, M, 1024, 4096, A, B, C);  // y = h W2
          gemm(w, true, false, 1024, 4096, M, A, B, C);   // dW = x^T dh
          flop += 3 * 2.0 * M * 4096 * 1024;
        }
        CK(cudaDeviceSynchronize());
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::printf("varying M (pad %3d) %-8s pass %d: %7.1f us a GEMM, %6.1f TFLOP/s\n", pad, name(w), pass,
                    s * 1e6 / (3 * Ms.size()), flop / s / 1e12);
      }
  return 0;
}
