// The loops of the optimizers and of gradient clipping (train/adamw.cpp, train/adafactor.cpp,
// train/grad_clip.cpp) as for_each_index bodies (tensor/launch.hpp). Sums over many elements are
// done per chunk or per row in a body; the final sum of the partial sums is the caller's, on the host.
#pragma once
#include <cmath>
#include <cstdint>

#include "core/hd.hpp"
#include "tensor/bf16.hpp"

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

// A piece of SumSquaresPieces: SumSquaresChunk's chunk c of one entry, elements [offset, offset +
// length) of the flat array.
struct SumSquaresPiece {
  int64_t offset, length;
};

// partial[r] = SumSquaresChunk's sum over piece r: the chunk sums of many entries in one launch,
// each the bits of the entry's own chunk.
template <typename T>
struct SumSquaresPieces {
  const SumSquaresPiece* pieces;
  const T* v;
  double* partial;
  template <class Lanes>
  MESHMOE_HD void operator()(int64_t r, const Lanes& lanes) const {
    const SumSquaresPiece p = pieces[r];
    SumSquaresChunk<T>{v + p.offset, p.length, partial + r}(0, lanes);
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
  // A host block (AdamWUpdatePieces): the arrays do not overlap, so the block is vector code with
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

// A piece of AdamWUpdatePieces: at most kPiece consecutive elements of one owned parameter.
struct AdamWPiece {
  int64_t flat_offset;  // the first element's, in the store's weights and gradients
  int64_t length;
  float *m, *v;         // the first element's moments
  int32_t decayed;      // 1: the parameter takes weight decay
};

// The values of one AdamW update that change from step to step (AdamWUpdateElement's), which the
// update reads from a device Buffer written before it, so that a device graph of the update
// (run.cuda_graphs, tensor/device_graph.hpp) reads each step's own.
struct AdamWStepValues {
  float grad_scale, decay, bc2s, neg_step;
};

// One AdamW update of every owned parameter in one launch (a row body, tensor/launch_rows.hpp):
// row r is piece r. On the host the piece is AdamWUpdateElement's vector block, on the GPU a warp
// (adjacent lanes, adjacent elements). Each element gets AdamWUpdateElement's arithmetic: the same
// bits as one launch per parameter (124-372 of them a step on the GPT-2 shapes).
// x16 (optional): the store's bf16 copy of the weights (ParamStore::weights16), written with each
// updated element (bf16_bits of its new value), so that no GEMM rounds the weights again.
struct AdamWUpdatePieces {
  static constexpr int64_t kPiece = 4096;
  const AdamWPiece* pieces;
  float* x;        // the store's weights
  const float* g;  // and gradients
  AdamWUpdateElement scalars;  // x, m, v, g and decay set per piece
  uint16_t* x16 = nullptr;
  // Where set (a device graph of the update), the step's values are read from here, one element in
  // device memory, instead of taken from `scalars`.
  const AdamWStepValues* step = nullptr;
  template <class Lanes>
  MESHMOE_HD void operator()(int64_t r, const Lanes& lanes) const {
    const AdamWPiece p = pieces[r];
    AdamWUpdateElement e = scalars;
    e.x = x + p.flat_offset;
    e.g = g + p.flat_offset;
    e.m = p.m;
    e.v = p.v;
    if (step) {
      const AdamWStepValues now = *step;
      e.grad_scale = now.grad_scale;
      e.decay = now.decay;
      e.bc2s = now.bc2s;
      e.neg_step = now.neg_step;
    }
    if (!p.decayed) e.decay = 1.0f;
    uint16_t* e16 = x16 ? x16 + p.flat_offset : nullptr;
    if constexpr (Lanes::step == 1) {
      e.range(0, p.length);
      if (e16)
        for (int64_t i = 0; i < p.length; ++i) e16[i] = bf16_bits(e.x[i]);
    } else {
      for (int64_t i = lanes.first; i < p.length; i += lanes.step) {
        e(i);
        if (e16) e16[i] = bf16_bits(e.x[i]);
      }
    }
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

// The sums of g^2 over the n rows of matrix b, each column's in row order, kColumns adjacent
// columns a row body (tensor/launch_rows.hpp): row c = b * blocks + k takes columns [k * kColumns,
// (k + 1) * kColumns). On the host the kColumns sums run side by side along each row of g (vector
// code over contiguous floats; a column at a time walked g with a stride of m); on the GPU lane l
// takes column l of the block (a warp reads 32 adjacent floats of a row). The same additions in the
// same order per column as one sum per index.
struct AdafactorColumnSumSquares {
  static constexpr int kColumns = 32;
  const float* g;
  double* col;  // [B * m]
  int64_t n, m;
  MESHMOE_HD static int64_t blocks(int64_t m) { return (m + kColumns - 1) / kColumns; }  // a matrix's rows
  template <class Lanes>
  MESHMOE_HD void operator()(int64_t c, const Lanes& lanes) const {
    const int64_t b = c / blocks(m), j0 = (c % blocks(m)) * kColumns;
    const int64_t width = m - j0 < kColumns ? m - j0 : kColumns;  // columns [j0, j0 + width)
    constexpr int kSums = kColumns / Lanes::step;                  // this lane's columns
    double s[kSums] = {};
    const float* gb = g + b * n * m + j0;
    for (int64_t i = 0; i < n; ++i) {
      const float* gi = gb + i * m;
      if (width == kColumns) {  // a fixed trip count: vector code on the host
        for (int k = 0; k < kSums; ++k) {
          const double x = double(gi[lanes.first + k * Lanes::step]);
          s[k] += x * x;
        }
      } else {
        for (int k = 0; k < kSums && lanes.first + k * Lanes::step < width; ++k) {
          const double x = double(gi[lanes.first + k * Lanes::step]);
          s[k] += x * x;
        }
      }
    }
    for (int k = 0; k < kSums && lanes.first + k * Lanes::step < width; ++k)
      col[b * m + j0 + lanes.first + k * Lanes::step] = s[k];
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

// Row r = b * n + i of U = G / sqrt(V), V = v_row v_col^T / mean_i(v_row), a row body
// (tensor/launch_rows.hpp): the row's factors once, then vector code along the row on the host (a
// warp on the GPU).
struct AdafactorFactoredUpdateRow {
  const float *g, *v_row, *v_col;
  const double* rsum;  // [B], summed over the logical rows
  double* u;
  int64_t n, m;
  double n_logical;
  template <class Lanes>
  MESHMOE_HD void operator()(int64_t r, const Lanes& lanes) const {
    const int64_t b = r / n;
    const double rmean = rsum[b] / n_logical, vr = double(v_row[r]);
    const float* gr = g + r * m;
    const float* vc = v_col + b * m;
    double* ur = u + r * m;
    for (int64_t j = lanes.first; j < m; j += lanes.step) ur[j] = double(gr[j]) / std::sqrt(vr * double(vc[j]) / rmean);
  }
};

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

// x[e] -= step * u[e]; x16 (optional): the weights' bf16 copy (ParamStore::weights16), written
// with it.
struct AdafactorApplyElement {
  float* x;
  const double* u;
  const double* step;  // AdafactorClipFactor's, on the device
  uint16_t* x16 = nullptr;
  MESHMOE_HD void operator()(int64_t e) const {
    const float xe = float(double(x[e]) - *step * u[e]);
    x[e] = xe;
    if (x16) x16[e] = bf16_bits(xe);
  }
};

// sum = the chunk sums of SumSquaresChunk added in chunk order (sum_squares's order on the host),
// on the device: one index, so that the host need not wait for the sums.
struct AddChunkSums {
  const double* partial;
  int64_t chunks;
  double* sum;
  MESHMOE_HD void operator()(int64_t) const {
    double s = 0.0;
    for (int64_t c = 0; c < chunks; ++c) s += partial[c];
    *sum = s;
  }
};

// Update clipping (S&S section 6) of one parameter, on the device: RMS(U) / d from the sum of U^2
// over the parameter's `count` logical elements, and the step lr / max(1, RMS(U) / d).
struct AdafactorClipFactor {
  const double* sum_u2;
  double count, clip, lr;
  double *rms_over_d, *step;
  MESHMOE_HD void operator()(int64_t) const {
    const double r = (count > 0 ? std::sqrt(*sum_u2 / count) : 0.0) / clip;
    *rms_over_d = r;
    *step = lr / (r > 1.0 ? r : 1.0);
  }
};

}  // namespace meshmoe
