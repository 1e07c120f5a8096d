#include "tensor/blas.hpp"

#include <algorithm>
#include <atomic>
#include <vector>

#include "tensor/bf16.hpp"
#include "tensor/cuda_gemm_bf16.hpp"

namespace meshmoe {

namespace {
std::atomic<Precision> g_precision{Precision::Fp32};
std::atomic<size_t> g_operands_rounded{0}, g_operands_from_copies{0}, g_copies_rounded{0};

// The rows x cols operand at `src` (leading dimension ld) rounded to bf16 into `dst`, compact
// (leading dimension cols); from `bits` instead when given (the operand already rounded, in the same
// layout: widened exactly). The attention's (sequence, head) tasks call GEMMs from several threads
// at once: each thread has its own scratch.
const float* rounded_copy(const float* src, const uint16_t* bits, int rows, int cols, int ld, std::vector<float>& dst) {
  dst.resize(size_t(rows) * size_t(cols));
  for (int r = 0; r < rows; ++r) {
    float* d = dst.data() + size_t(r) * size_t(cols);
    if (bits) {
      const uint16_t* s = bits + size_t(r) * size_t(ld);
      for (int c = 0; c < cols; ++c) d[c] = bf16_to_float(s[c]);
      continue;
    }
    const float* s = src + size_t(r) * size_t(ld);
    for (int c = 0; c < cols; ++c) d[c] = round_bf16(s[c]);
  }
  return dst.data();
}

void gemm_bf16_operands_on_host(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                                const float* B, int ldb, float beta, float* C, int ldc, const uint16_t* A16,
                                const uint16_t* B16) {
  thread_local std::vector<float> a_bf16, b_bf16;
  // op(A) is [M, K]: A is stored [K, M] when transposed; op(B) is [K, N] alike.
  const int a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;
  const int b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
  const float* a = rounded_copy(A, A16, a_rows, a_cols, lda, a_bf16);
  const float* b = rounded_copy(B, B16, b_rows, b_cols, ldb, b_bf16);
  g_operands_rounded.fetch_add(size_t(!A16) + size_t(!B16), std::memory_order_relaxed);
  g_operands_from_copies.fetch_add(size_t(bool(A16)) + size_t(bool(B16)), std::memory_order_relaxed);
  cblas_gemm(trans_a, trans_b, M, N, K, alpha, a, std::max(1, a_cols), b, std::max(1, b_cols), beta, C, ldc);
}
}  // namespace

Precision gemm_precision() { return g_precision.load(std::memory_order_relaxed); }
void set_gemm_precision(Precision p) { g_precision.store(p, std::memory_order_relaxed); }

void gemm_bf16_operands(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                        const float* B, int ldb, float beta, float* C, int ldc, const uint16_t* A16,
                        const uint16_t* B16) {
  if (current_device() == Device::Cuda)
    return cuda_gemm_bf16(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, A16, B16);
  run_host_work(
      [=] { gemm_bf16_operands_on_host(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, A16, B16); });
}

Bf16OperandCounts bf16_operand_counts() {
  return {g_operands_rounded.load(std::memory_order_relaxed), g_operands_from_copies.load(std::memory_order_relaxed),
          g_copies_rounded.load(std::memory_order_relaxed)};
}

// bits [n] = bf16_bits(x [n]): a kernel on the GPU, host threads (queued where the backend queues
// host work) otherwise.
void round_to_bf16(const float* x, int64_t n, uint16_t* bits) {
  g_copies_rounded.fetch_add(1, std::memory_order_relaxed);
  if (current_device() == Device::Cuda) return cuda_round_to_bf16(x, n, bits);
  run_host_indices(n, n, [x, bits](int64_t i) { bits[i] = bf16_bits(x[i]); });
}

namespace {
// The groups form one progression: every group has group 0's shape and leading dimensions, and
// each operand of group i lies at its group 0 operand plus i times a stride (returned).
template <typename T>
bool one_progression(std::span<const GemmGroup<T>> g, int64_t& sa, int64_t& sb, int64_t& sc) {
  sa = g.size() > 1 ? g[1].A - g[0].A : 0;
  sb = g.size() > 1 ? g[1].B - g[0].B : 0;
  sc = g.size() > 1 ? g[1].C - g[0].C : 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const GemmGroup<T>& x = g[i];
    const int64_t j = int64_t(i);
    if (x.M != g[0].M || x.N != g[0].N || x.K != g[0].K || x.lda != g[0].lda || x.ldb != g[0].ldb ||
        x.ldc != g[0].ldc || x.A != g[0].A + j * sa || x.B != g[0].B + j * sb || x.C != g[0].C + j * sc)
      return false;
  }
  return true;
}

template <typename T>
void host_gemm(bool rounded, bool ta, bool tb, T alpha, T beta, const GemmGroup<T>& g) {
  if constexpr (std::is_same_v<T, float>)
    if (rounded)
      return gemm_bf16_operands_on_host(ta, tb, g.M, g.N, g.K, alpha, g.A, g.lda, g.B, g.ldb, beta, g.C, g.ldc, g.A16,
                                        g.B16);
  cblas_gemm(ta, tb, g.M, g.N, g.K, alpha, g.A, g.lda, g.B, g.ldb, beta, g.C, g.ldc);
}
}  // namespace

template <typename T>
void gemm_grouped(bool trans_a, bool trans_b, T alpha, T beta, std::span<const GemmGroup<T>> groups) {
  std::vector<GemmGroup<T>> g;  // the groups with a product to write
  for (const GemmGroup<T>& x : groups)
    if (x.M > 0 && x.N > 0) g.push_back(x);
  if (g.empty()) return;
  const bool rounded = std::is_same_v<T, float> && gemm_precision() == Precision::Bf16;
  if (current_device() != Device::Cuda)
    return run_host_work([=, g = std::move(g)] {
      for (const GemmGroup<T>& x : g) host_gemm(rounded, trans_a, trans_b, alpha, beta, x);
    });
  const int count = int(g.size());
  if constexpr (std::is_same_v<T, float>)  // every operand read from its copy: one call that rounds nothing
    if (rounded && std::all_of(g.begin(), g.end(), [](const GemmGroup<T>& x) { return x.A16 && x.B16; }))
      return cuda_gemm_grouped_bf16(trans_a, trans_b, alpha, beta, g.data(), count);
  int64_t sa, sb, sc;
  const GemmGroup<T>& f = g[0];
  if (one_progression<T>(g, sa, sb, sc)) {
    if constexpr (std::is_same_v<T, float>)
      if (rounded)
        return cuda_gemm_bf16_strided_batched(trans_a, trans_b, f.M, f.N, f.K, alpha, f.A, f.lda, sa, f.B, f.ldb, sb,
                                              beta, f.C, f.ldc, sc, count);
    return cuda_gemm_strided_batched(trans_a, trans_b, f.M, f.N, f.K, alpha, f.A, f.lda, sa, f.B, f.ldb, sb, beta, f.C,
                                     f.ldc, sc, count);
  }
  if constexpr (std::is_same_v<T, float>)
    if (rounded) {  // a bf16 GEMM per group, each rounding what has no copy
      for (const GemmGroup<T>& x : g)
        cuda_gemm_bf16(trans_a, trans_b, x.M, x.N, x.K, alpha, x.A, x.lda, x.B, x.ldb, beta, x.C, x.ldc, x.A16, x.B16);
      return;
    }
  cuda_gemm_grouped(trans_a, trans_b, alpha, beta, g.data(), count);
}

template void gemm_grouped<float>(bool, bool, float, float, std::span<const GemmGroup<float>>);
template void gemm_grouped<double>(bool, bool, double, double, std::span<const GemmGroup<double>>);

}  // namespace meshmoe
