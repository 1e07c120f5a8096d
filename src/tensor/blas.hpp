// Row-major GEMM for float and double (double is used by the finite-difference tests, float by
// training): OpenBLAS on the host, cuBLAS when run.device = "cuda" (tensor/device.hpp).
// C[M,N] = alpha * op(A) op(B) + beta * C.
//
// Precision of the float GEMMs (model.precision, Switch Transformer section 2.4: selective
// precision; docs/ARCHITECTURE.md "Precision"): `gemm` and `matmul` are the model's GEMMs, whose
// operands are rounded to bf16 when the process's GEMM precision is Bf16 (products summed in fp32,
// fp32 result); `gemm_fp32` and `matmul_fp32` always take the operands as they are (the router).
// The double GEMMs never round.
#pragma once
#include <span>
#include <type_traits>

#include "tensor/cblas_gemm.hpp"
#include "tensor/compute_kinds.hpp"
#include "tensor/cuda_gemm_bf16.hpp"
#include "tensor/cuda_gemm_grouped.hpp"
#include "tensor/device.hpp"
#include "tensor/launch.hpp"

namespace meshmoe {

// The process's precision of the model's float GEMMs; Fp32 until set (by the trainer and the
// decoders from model.precision, before the first forward).
Precision gemm_precision();
void set_gemm_precision(Precision p);

// C = alpha op(bf16(A)) op(bf16(B)) + beta C with fp32 sums and result: on the host, copies of the
// operands rounded by round_bf16 (tensor/bf16.hpp) into per-thread scratch, then sgemm; on the GPU
// cuBLAS with bf16 operands (tensor/cuda_gemm_bf16.hpp). A16 / B16 (optional, host): the operand's
// values already rounded (bf16_bits), in its layout, read instead of rounding it (the same bits).
void gemm_bf16_operands(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                        const float* B, int ldb, float beta, float* C, int ldc, const uint16_t* A16 = nullptr,
                        const uint16_t* B16 = nullptr);

inline void gemm_fp32(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                      const float* B, int ldb, float beta, float* C, int ldc) {
  if (current_device() == Device::Cuda) return cuda_gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  run_host_work([=] { cblas_gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc); });
}
inline void gemm_fp32(bool trans_a, bool trans_b, int M, int N, int K, double alpha, const double* A, int lda,
                      const double* B, int ldb, double beta, double* C, int ldc) {
  if (current_device() == Device::Cuda) return cuda_gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  run_host_work([=] { cblas_gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc); });
}

// A16 / B16 (optional): as gemm_bf16_operands', read only by the bf16 GEMMs.
inline void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                 const float* B, int ldb, float beta, float* C, int ldc, const uint16_t* A16 = nullptr,
                 const uint16_t* B16 = nullptr) {
  if (gemm_precision() == Precision::Bf16)
    return gemm_bf16_operands(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, A16, B16);
  gemm_fp32(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
inline void gemm(bool trans_a, bool trans_b, int M, int N, int K, double alpha, const double* A, int lda,
                 const double* B, int ldb, double beta, double* C, int ldc, const uint16_t* = nullptr,
                 const uint16_t* = nullptr) {
  gemm_fp32(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// Dense row-major shorthand: C[M,N] (+)= op(A) op(B), leading dimensions from the shapes; A16 / B16
// as gemm's (copies made by rounded_once below).
template <typename T>
void matmul(bool trans_a, bool trans_b, int M, int N, int K, const T* A, const T* B, T* C, bool accumulate = false,
            const uint16_t* A16 = nullptr, const uint16_t* B16 = nullptr) {
  gemm(trans_a, trans_b, M, N, K, T(1), A, trans_a ? M : K, B, trans_b ? K : N, accumulate ? T(1) : T(0), C, N, A16,
       B16);
}

// bf16 copies of GEMM operands (docs/ARCHITECTURE.md "Precision"): where the Buffers live on a
// device, a layer rounds an operand that several bf16 GEMMs of one pass read once, into a copy,
// and those GEMMs read the copy instead of each rounding it (on a GPU a rounding is a pass over
// memory, a launch, for each GEMM). The host emulation rounds per GEMM into its own scratch (the
// same bits) and keeps no copies; the deferred host device (tests) takes the device's side.
template <typename T>
bool bf16_operand_copies() {
  return std::is_same_v<T, float> && gemm_precision() == Precision::Bf16 && buffers_on_device();
}

// Room for n values in a layer's `copies` where it keeps them (bf16_operand_copies<T>): grown to
// n, its data returned; null otherwise (the Buffer emptied).
template <typename T>
uint16_t* bf16_copy_room(Buffer<uint16_t>& copies, size_t n) {
  if (!bf16_operand_copies<T>()) {
    if (!copies.empty()) copies = Buffer<uint16_t>();
    return nullptr;
  }
  if (copies.size() < n) copies.resize(n);
  return copies.data();
}

// bits [n] = bf16_bits(x [n]) (tensor/bf16.hpp), queued as device work.
void round_to_bf16(const float* x, int64_t n, uint16_t* bits);

// x [n] rounded into `bits` (room for n, or null) and bits returned; null, doing nothing, when bits
// is null or T is double (the GEMMs then round x themselves).
template <typename T>
const uint16_t* rounded_once(const T* x, size_t n, uint16_t* bits) {
  if constexpr (std::is_same_v<T, float>) {
    if (!bits) return nullptr;
    round_to_bf16(x, int64_t(n), bits);
    return bits;
  } else {
    return nullptr;
  }
}

// Tests only: how many bf16 GEMM operands the host emulation rounded, how many it read from
// copies, and how many copies round_to_bf16 wrote, since the process started (which operands the
// copies serve; on a GPU each rounding, of an operand or into a copy, is a launch).
struct Bf16OperandCounts {
  size_t rounded = 0, from_copies = 0, copies_rounded = 0;
};
Bf16OperandCounts bf16_operand_counts();
// The same with the operands as they are, whatever model.precision says.
template <typename T>
void matmul_fp32(bool trans_a, bool trans_b, int M, int N, int K, const T* A, const T* B, T* C,
                 bool accumulate = false) {
  gemm_fp32(trans_a, trans_b, M, N, K, T(1), A, trans_a ? M : K, B, trans_b ? K : N, accumulate ? T(1) : T(0), C, N);
}

// A batch of GEMMs over pairs (b, h), b < outer, h < inner (attention: sequence b, head h): operand
// X of pair (b, h) starts at p + b * outer_stride + h * inner_stride.
// bf16 (optional): the operand's values rounded to bf16 (bf16_bits) in the same layout, which the
// bf16 GEMMs read instead of rounding p again (the same bits; attention's P and dS, written by
// their softmax rows).
template <typename T>
struct BatchedOperand {
  T* p;
  int ld;
  int64_t outer_stride, inner_stride;
  const uint16_t* bf16 = nullptr;
  T* at(int64_t b, int64_t h) const { return p + b * outer_stride + h * inner_stride; }
  const uint16_t* bf16_at(int64_t b, int64_t h) const { return bf16 ? bf16 + b * outer_stride + h * inner_stride : nullptr; }
};

// C_bh = alpha op(A_bh) op(B_bh) + beta C_bh for every pair: on the host one task per pair
// (for_each_task: threads), on the GPU one strided-batched cuBLAS call per b over its `inner` pairs
// (or one call for all when the strides make the pairs one progression), instead of a launch per pair;
// with bf16 GEMM operands (model.precision) the same calls with operands rounded to bf16, each
// operand's span rounded once for all b (tensor/cuda_gemm_bf16.hpp), or read from its bf16 copy.
template <typename T>
void gemm_batched(bool trans_a, bool trans_b, int M, int N, int K, T alpha, BatchedOperand<const T> A,
                  BatchedOperand<const T> B, T beta, BatchedOperand<T> C, int outer, int inner) {
  const bool rounded = std::is_same_v<T, float> && gemm_precision() == Precision::Bf16;
  if (current_device() == Device::Cuda) {
    const bool one_progression = A.outer_stride == inner * A.inner_stride && B.outer_stride == inner * B.inner_stride &&
                                 C.outer_stride == inner * C.inner_stride;
    if constexpr (std::is_same_v<T, float>)
      if (rounded && !one_progression &&
          cuda_gemm_bf16_two_level_batched(trans_a, trans_b, M, N, K, alpha, A.p, A.ld, A.outer_stride,
                                           A.inner_stride, B.p, B.ld, B.outer_stride, B.inner_stride, beta, C.p, C.ld,
                                           C.outer_stride, C.inner_stride, outer, inner, A.bf16, B.bf16))
        return;
    const int calls = one_progression ? 1 : outer, count = one_progression ? outer * inner : inner;
    for (int b = 0; b < calls; ++b) {
      if constexpr (std::is_same_v<T, float>)
        if (rounded) {
          cuda_gemm_bf16_strided_batched(trans_a, trans_b, M, N, K, alpha, A.at(b, 0), A.ld, A.inner_stride,
                                         B.at(b, 0), B.ld, B.inner_stride, beta, C.at(b, 0), C.ld, C.inner_stride,
                                         count);
          continue;
        }
      cuda_gemm_strided_batched(trans_a, trans_b, M, N, K, alpha, A.at(b, 0), A.ld, A.inner_stride, B.at(b, 0), B.ld,
                                B.inner_stride, beta, C.at(b, 0), C.ld, C.inner_stride, count);
    }
    return;
  }
  for_each_task(int64_t(outer) * inner, [&](int64_t bh) {
    const int64_t b = bh / inner, h = bh % inner;
    if constexpr (std::is_same_v<T, float>)
      if (rounded)  // gemm's bf16 path, reading the operands' copies where they have them
        return gemm_bf16_operands(trans_a, trans_b, M, N, K, alpha, A.at(b, h), A.ld, B.at(b, h), B.ld, beta,
                                  C.at(b, h), C.ld, A.bf16_at(b, h), B.bf16_at(b, h));
    gemm(trans_a, trans_b, M, N, K, alpha, A.at(b, h), A.ld, B.at(b, h), B.ld, beta, C.at(b, h), C.ld);
  });
}

// The GEMMs of `groups` (GemmGroup, tensor/cuda_gemm_grouped.hpp: shapes, operands and leading
// dimensions of each) as one call, C_i = alpha op(A_i) op(B_i) + beta C_i: the MoE experts' GEMMs
// of one role, a group per local expert (model/moe/experts.cpp, docs/ARCHITECTURE.md "MoE
// launches"). On the host one piece of host work (queued as one where the backend queues
// it) running gemm's arithmetic for each group in order: the same bits as a gemm per group. On the
// GPU one strided-batched cuBLAS call when the groups are one progression (equal shapes and leading
// dimensions, each operand at a constant stride: experts padded to the same rows), otherwise one
// grouped cuBLAS call (cuda_gemm_grouped). With bf16 GEMM operands (model.precision): where every
// group carries both operands' bf16 copies (GemmGroup::A16, B16; the experts' with
// bf16_operand_copies) one call that reads them and rounds nothing (cuda_gemm_grouped_bf16:
// strided-batched or cublasGemmGroupedBatchedEx); otherwise the progression is one bf16
// strided-batched call and unequal groups a bf16 GEMM each. The host reads the copies too (the
// same bits as rounding).
template <typename T>
void gemm_grouped(bool trans_a, bool trans_b, T alpha, T beta, std::span<const GemmGroup<T>> groups);

}  // namespace meshmoe
