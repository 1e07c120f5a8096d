// The loops of the optimizers and of gradient clipping (train/adamw.cpp, train/adafactor.cpp,
// train/grad_clip.cpp) as for_each_index bodies (tensor/launch.hpp). Sums over many elements are
// done per chunk or per row in a body; the final sum of the partial sums is the caller's, on the host.
#pragma once
#include <cmath>
#include <cstdint>

#include "core/hd.hpp"

namespace meshmoe {

// partial[c] = sum of v[i]^2 over chunk c of v [n] (kChunk elements), in double, in a fixed order.
template <typename T>
struct SumSquaresChunk {
  static constexpr int64_t kChunk = 4096;
  static constexpr int kHostSums = 16;
  const T* v;
  int64_t n;
  double* partial;
  // A row body (tensor/launch_rows.hpp): the chunk is the row; one warp per chunk on the GPU
  // (adjacent lanes read adjacent elements). On the host, kHostSums interleaved sums (element
  // i of the chunk in sum i % kHostSums) added pairwise at the end, as a warp's lanes are: one
  // sequential sum was a chain of dependent additions, 2.4x the time of reading the gradients.
  template <class Lanes>
  MESHMOE_HD void operator()(int64_t c, const Lanes& lanes) const {
    const int64_t begin = c * kChunk, end = (c + 1) * kChunk < n ? (c + 1) * kChunk : n;
    double s = 0.0;
    if constexpr (Lanes::step == 1) {
      double sums[kHostSums] = {};
      int64_t i = begin;
      for (; i + kHostSums <= end; i += kHostSums)
        for (int r = 0; r < kHostSums; ++r) sums[r] += double(v[i + r]) * double(v[i + r]);
      for (int r = 0; i < end; ++i, ++r) sums[r] += double(v[i]) * double(v[i]);
      for (int half = kHostSums / 2; half > 0; half /= 2)
        for (int r = 0; r < half; ++r) sums[r] += sums[r + half];
      s = sums[0];
    } else {
      for (int64_t i = begin + lanes.first; i < end; i += lanes.step) s += double(v[i]) * double(v[i]);
      s = lanes.sum(s);
    }
    if (lanes.leader()) partial[c] = s;
  }
};

// Element i of one AdamW update (adamw.hpp), in torch's operation order.
struct AdamWUpdateElement {
  float *x, *m, *v;
  const float* g;
  float grad_scale;  // clipping's factor, or exactly 1 (g * 1 = g)
  float decay;       // 1 - lr * weight_decay, or exactly 1 for a parameter without decay (x * 1 = x)
  float b1, one_m_b1, b2, one_m_b2, bc2s, eps, neg_step;
  MESHMOE_HD void update(float& xi, float& mi, float& vi, float g_raw) const {
    const float gi = g_raw * grad_scale;
    xi = xi * decay;
    mi = mi * b1 + one_m_b1 * gi;
    vi = vi * b2 + one_m_b2 * gi * gi;
    const float denom = std::sqrt(vi) / bc2s + eps;
    xi = xi + neg_step * mi / denom;
  }
  MESHMOE_HD void operator()(int64_t i) const { update(x[i], m[i], v[i], g[i]); }
  // Host blocks (tensor/launch.hpp): the arrays do not overlap, so the block is vector code with
  // the same operations per element (IEEE, no reassociation): the same bits as operator().
  void range(int64_t begin, int64_t end) const {
    float* __restrict xr = x;
    float* __restrict mr = m;
    float* __restrict vr = v;
    const float* __restrict gr = g;
    const AdamWUpdateElement body = *this;
#pragma GCC ivdep
    for (int64_t i = begin; i < end; ++i) body.update(xr[i], mr[i], vr[i], gr[i]);
  }
};

// Adafactor (adafactor.hpp), g [B, n, m]: row r = b * n + i of the sums of g^2 over the m columns.
struct AdafactorRowSumSquares {
  const float* g;
  double* row;  // [B * n]
  int64_t m;
  MESHMOE_HD void operator()(int64_t r) const {
    const float* gr = g + r * m;
    double s = 0.0;
    for (int64_t j = 0; j < m; ++j) s += double(gr[j]) * double(gr[j]);
    row[r] = s;
  }
};

// Column c = b * m + j of the sums of g^2 over the n rows of matrix b, in row order.
struct AdafactorColumnSumSquares {
  const float* g;
  double* col;  // [B * m]
  int64_t n, m;
  MESHMOE_HD void operator()(int64_t c) const {
    const int64_t b = c / m, j = c % m;
    const float* gb = g + b * n * m;
    double s = 0.0;
    for (int64_t i = 0; i < n; ++i) s += double(gb[i * m + j]) * double(gb[i * m + j]);
    col[c] = s;
  }
};

// One factored accumulator element: acc = beta acc + (1 - beta)(sum / count + eps1), the sum
// being over the `count` logical elements of its row or column.
struct AdafactorFactorMoment {
  float* acc;
  const double* sum;
  double beta, count, eps1;
  MESHMOE_HD void operator()(int64_t k) const {
    acc[k] = float(beta * acc[k] + (1.0 - beta) * (sum[k] / count + eps1));
  }
};

// rsum[b] = sum over the n rows of matrix b of v_row, in row order.
struct AdafactorRowMomentSum {
  const float* v_row;  // [B, n]
  double* rsum;        // [B]
  int64_t n;
  MESHMOE_HD void operator()(int64_t b) const {
    double s = 0.0;
    for (int64_t i = 0; i < n; ++i) s += v_row[b * n + i];
    rsum[b] = s;
  }
};

// Element e = (b * n + i) * m + j of U = G / sqrt(V), V = v_row v_col^T / mean_i(v_row).
struct AdafactorFactoredUpdateElement {
  const float *g, *v_row, *v_col;
  const double* rsum;  // [B], summed over the logical rows
  double* u;
  int64_t n, m;
  double n_logical;
  MESHMOE_HD void operator()(int64_t e) const {
    const int64_t r = e / m, j = e % m, b = r / n;
    const double rmean = rsum[b] / n_logical;
    const double v = double(v_row[r]) * double(v_col[b * m + j]) / rmean;
    u[e] = double(g[e]) / std::sqrt(v);
  }
};

// Element e of an unfactored Adafactor update: v = beta v + (1 - beta)(g^2 + eps1), U = G / sqrt(v).
struct AdafactorUnfactoredUpdateElement {
  const float* g;
  float* v;
  double* u;
  double beta, eps1;
  MESHMOE_HD void operator()(int64_t e) const {
    v[e] = float(beta * v[e] + (1.0 - beta) * (double(g[e]) * double(g[e]) + eps1));
    u[e] = double(g[e]) / std::sqrt(double(v[e]));
  }
};

// x[e] -= step * u[e]
struct AdafactorApplyElement {
  float* x;
  const double* u;
  double step;
  MESHMOE_HD void operator()(int64_t e) const { x[e] = float(double(x[e]) - step * u[e]); }
};

}  // namespace meshmoe
